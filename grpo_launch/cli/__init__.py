"""The `grpo` command: one small module per subcommand (each adds itself to `cli.app`), and the error handling
they share."""

from __future__ import annotations

import sys

from grpo_launch.errors import EXIT_USER_ERROR, UserError


def render_error(error: UserError) -> None:
    from rich.console import Console

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"[bold red]error:[/] {error.message}", markup=True)
    if error.hint:
        console.print(f"  [dim]hint:[/] {error.hint}", markup=True)


def main(argv: list[str] | None = None) -> int:
    from grpo_launch.cli import compare, plan, proxy, recipes, rehearse, report, run  # noqa: F401  (registers the subcommands)
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
    sys.exit(main())
