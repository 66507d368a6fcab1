"""scheduler=skypilot: launch the run directory's task.yaml with `sky launch`, which provisions the nodes, copies
the run directory to each (the task's workdir) and streams the run's output; its exit code is the job's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.launch.supervisor import child_environment


def launch(plan: Plan, run_dir: Path, console: Console) -> int:
    cluster = plan.scheduler.submit[plan.scheduler.submit.index("--cluster") + 1]
    console.print("[bold]launching[/] " + escape(f"{' '.join(plan.scheduler.submit)} in {run_dir}. Ctrl-C stops "
                                                  f"following only: `sky cancel {cluster}` stops the job, "
                                                  f"`sky down {cluster}` releases the nodes"))
    return subprocess.run(plan.scheduler.submit, cwd=run_dir, env=child_environment({})).returncode
