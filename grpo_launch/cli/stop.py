"""`grpo stop RUN_DIR`: end a started run from another terminal, through its scheduler: its jobs cancelled (nothing
left billing), or the `grpo run` that supervises it stopped as Ctrl-C would stop it."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_launch.cli.app import app

EXAMPLES = """
[bold]Examples[/]

  grpo stop runs/tiny-cpu/20261129-171500         the local run's `grpo run` stops every process
  grpo stop runs/qwen1.5b-async-lora/20261129-1715   scheduler=hf-jobs: every Job of the run cancelled
"""


@app.command(epilog=EXAMPLES)
def stop(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="The run directory `grpo run` printed."),
) -> None:
    """Stop a run started by `grpo run`: cancel its scheduler's jobs, or stop the processes it supervises."""
    from rich.console import Console

    from grpo_launch.contracts.rundir import read_plan
    from grpo_launch.launch.schedulers import LAUNCHERS

    run_dir = run_dir.resolve()
    plan = read_plan(run_dir)
    code = LAUNCHERS[plan.scheduler.kind].stop(plan, run_dir, Console(highlight=False))
    if code:
        raise typer.Exit(code)
