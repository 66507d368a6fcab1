"""scheduler=skypilot: launch the run directory's task.yaml with `sky launch`, which provisions the nodes, copies
the run directory to each (the task's workdir) and streams the run's output; its exit code is the job's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.launch.supervisor import child_environment


def launch(plan: Plan, run_dir: Path, console: Console) -> int:
    cluster = plan.scheduler.cluster
    console.print("[bold]launching[/] " + escape(f"{shell_line(plan.scheduler.submit)} in {shell_word(str(run_dir))}. "
                                                  f"Ctrl-C stops following only: `sky cancel {shell_word(cluster)}` "
                                                  f"stops the job, `sky down {shell_word(cluster)}` releases the "
                                                  f"nodes"))
    return subprocess.run(plan.scheduler.submit, cwd=run_dir, env=child_environment({})).returncode
