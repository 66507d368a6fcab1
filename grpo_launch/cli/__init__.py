"""The `grpo` command: one small module per subcommand, all sharing this app and its error handling."""

from __future__ import annotations

import sys

import typer

from grpo_launch.errors import EXIT_USER_ERROR, UserError

app = typer.Typer(
    name="grpo",
    help="Launch GRPO training (TRL + vLLM + DeepSpeed/accelerate) from one declarative recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

RecipesDirOption = typer.Option(
    None, "--recipes-dir", metavar="DIR",
    help="Add a directory of recipes (its recipe/, cluster/, model/, ... folders) ahead of the shipped ones; "
         "repeatable. $GRPO_RECIPES_PATH adds more.")


def report(error: UserError) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]error:[/] {error.message}", markup=True)
    if error.hint:
        console.print(f"  [dim]hint:[/] {error.hint}", markup=True)


def main(argv: list[str] | None = None) -> int:
    from grpo_launch.cli import plan, proxy, recipes, run  # noqa: F401  (registers the subcommands)

    try:
        # standalone mode: click prints its own usage errors and exits 2; our UserError passes through it.
        app(args=argv, prog_name="grpo", standalone_mode=True)
    except UserError as e:
        report(e)
        return EXIT_USER_ERROR
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def entrypoint() -> None:
    sys.exit(main())
