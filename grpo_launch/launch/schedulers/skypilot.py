"""scheduler=skypilot: launch the run directory's task.yaml with `sky launch`, which provisions the nodes, copies
the run directory to each (the task's workdir) and streams the run's output; its exit code is the job's. Ctrl-C
stops following only; `grpo stop RUN_DIR` cancels the job (`sky cancel`), and `sky down` releases the nodes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import Submitted, write_submitted
from grpo_launch.contracts.schedulers import SKY_WORKDIR, SkyPilotSettings
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.launch.result import RunResult
from grpo_launch.launch.schedulers.base import Launcher, Options, RunLogs
from grpo_launch.launch.spawn import child_environment


class SkyPilot(Launcher[SkyPilotSettings]):
    name = "skypilot"
    reach = "SkyPilot copies it to every node as the task's workdir"
    not_installed = ("SkyPilot is not installed here: nothing launched. Install it with your cloud's extra (pip "
                     "install 'skypilot[aws]', [gcp], [kubernetes], ...), check it with `sky check`, then:")

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        return False  # they stay on node 0 (logs() says how to copy them here)

    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        cluster = plan.scheduler.cluster
        write_submitted(run_dir, Submitted(self.name, (cluster,), time.time()))
        console.print("[bold]launching[/] " + escape(
            f"{shell_line(plan.scheduler.submit)} in {shell_word(str(run_dir))}. Ctrl-C stops following only: "
            f"`{shell_line(['grpo', 'stop', str(run_dir)])}` (`{shell_line(['sky', 'cancel', cluster])}`) stops the "
            f"job, `{shell_line(['sky', 'down', cluster])}` releases the nodes"))
        return RunResult(code=subprocess.run(plan.scheduler.submit, cwd=run_dir, env=child_environment({})).returncode)

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        cluster = plan.scheduler.cluster
        console.print("[bold]cancelling[/] " + escape(
            f"the job on {cluster}: {shell_line(['sky', 'cancel', '--yes', '--all', cluster])} "
            f"(`{shell_line(['sky', 'down', cluster])}` releases the nodes)"))
        return subprocess.run(["sky", "cancel", "--yes", "--all", cluster], env=child_environment({})).returncode

    def logs(self, plan: Plan, run_dir: Path) -> RunLogs:
        cluster = plan.scheduler.cluster
        # metrics.jsonl and the logs from node 0's copy of the run directory, over the SSH host SkyPilot names after
        # the cluster (`sky status` writes its ssh config); checkpoints stay there. Trainer rank 0, which writes the
        # metrics, runs on node 0; the other nodes' logs stay on them.
        return RunLogs(f"{cluster}:{SKY_WORKDIR}/logs/ (node 0)",
                       ("rsync", "-a", "--include=metrics.jsonl", "--include=logs/***", "--exclude=*",
                        f"{cluster}:{SKY_WORKDIR}/", f"{run_dir}/"))
