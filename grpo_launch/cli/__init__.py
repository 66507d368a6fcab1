"""The `grpo` command: one small module per subcommand (each adds itself to `cli.app`), and the error handling
they share."""

from __future__ import annotations

import gc
import sys

from grpo_launch.errors import EXIT_USER_ERROR, UserError, every_error


def render_error(error: UserError) -> None:
    """The error (each of them, when several were found together) as the user wrote its values: they are never rich
    markup (`[bold]`, `[/]`)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    for e in every_error(error):
        console.print(Text.assemble(("error:", "bold red"), f" {e.message}"))
        if e.hint:
            console.print(Text.assemble("  ", ("hint:", "dim"), f" {e.hint}"))


def main(argv: list[str] | None = None) -> int:
    from grpo_launch.cli import compare, plan, proxy, recipes, rehearse, report, run, stop  # noqa: F401  (registers the subcommands)
    from grpo_launch.cli.app import app

    try:
        # standalone mode: click prints its own usage errors and exits 2; our UserError passes through it.
        app(args=argv, prog_name="grpo", standalone_mode=True)
    except UserError as e:
        render_error(e)
        return EXIT_USER_ERROR
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def entrypoint() -> None:
    code = main()
    # The interpreter's last collections would walk every object the command made (matplotlib's and rich's after a
    # run): about 80 ms between the run's last line and its exit, for memory the process returns anyway.
    gc.freeze()
    sys.exit(code)
