"""scheduler=slurm: submit the run directory's job.sbatch, follow the job, cancel it on Ctrl-C (or `grpo stop`).

The job's state comes from `scontrol show job`, polled: `sbatch --wait` polls after 2, 10 and 42 s and then every
32 s, and says 0 for a job cancelled while it was pending. Works without accounting (no sacct): the record lasts
MinJobAge after the end. Each process's log is streamed from the run directory, where the nodes write it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import Submitted, read_submitted, write_submitted
from grpo_launch.contracts.schedulers import SlurmSettings
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.errors import UserError
from grpo_launch.launch.follow import Job
from grpo_launch.launch.schedulers.base import JobLauncher
from grpo_launch.launch.spawn import child_environment

# Every state of a job that has not ended (squeue's and scontrol's names).
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
          "SIGNALING", "STAGE_OUT"}


def job_environment() -> dict[str, str]:
    """What sbatch exports to the job: this environment, with grpo-launch's own commands first on PATH, but none of
    an outer allocation's SLURM_* settings (submitted from inside a job, they would shape the new one)."""
    env = child_environment({})
    return {k: v for k, v in env.items()
            if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}


def parse_job(text: str) -> dict[str, str]:
    """`scontrol -o show job` as a dict (a heterogeneous job's first component wins)."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        for key, value in re.findall(r"(\S+?)=(\S*)", line):
            info.setdefault(key, value)
    return info


def exit_code(info: dict[str, str]) -> int:
    """The job's code: its ExitCode, 128 + the signal that killed it, or 1 when it ended otherwise than COMPLETED."""
    code, _, sig = info.get("ExitCode", "0:0").partition(":")
    if int(code):
        return int(code)
    if int(sig or 0):
        return 128 + int(sig)
    return 0 if info.get("JobState") == "COMPLETED" else 1


class SlurmJob(Job):
    def __init__(self, job_id: str, env: dict[str, str]) -> None:
        self.id = job_id
        self.name = f"Slurm job {job_id}"
        self.env = env
        self.info: dict[str, str] = {}

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)

    def state(self) -> tuple[str, bool]:
        done = self._run("scontrol", "-o", "show", "job", self.id)
        if done.returncode:
            if self.info:  # the record aged out after the end (MinJobAge): keep the last one seen
                return self.info.get("JobState", "gone"), True
            raise RuntimeError(f"scontrol show job {self.id}: {done.stderr.strip()}")
        self.info = parse_job(done.stdout)
        state = self.info.get("JobState", "UNKNOWN")
        words = state
        if state == "PENDING" and self.info.get("Reason") not in (None, "None"):
            words += f" ({self.info['Reason']})"
        elif state == "RUNNING":
            words += f" on {self.info.get('NodeList', '?')}"
        return words, state not in ACTIVE

    def exit_code(self) -> int:
        return exit_code(self.info)

    def cancel(self, presses: int) -> None:
        # The first asks the job to stop: Slurm sends SIGTERM to every step, each node's supervisor stops its
        # processes (SIGKILL after the cluster's KillWait). The second kills at once.
        self._run("scancel", *(["--signal=KILL", "--full"] if presses > 1 else []), self.id)


class Slurm(JobLauncher[SlurmSettings]):
    name = "slurm"
    reach = "every node must see it: shared storage"
    not_installed = ("Slurm is not installed here: nothing submitted. On a Slurm login node, with the run directory "
                     "on shared storage:")

    def rehearses_here(self) -> bool:
        """Installed packages alone are not a cluster: a controller must answer."""
        if not shutil.which("scontrol"):
            return False
        try:
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return ping.returncode == 0 and " is UP" in ping.stdout

    def poll_s(self, plan: Plan) -> float:
        return self.settings(plan).poll_s

    def submit(self, plan: Plan, run_dir: Path, console: Console) -> SlurmJob:
        env = job_environment()
        done = subprocess.run(plan.scheduler.submit, cwd=run_dir, env=env, capture_output=True, text=True,
                              timeout=120)
        if done.returncode:
            raise UserError(f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}",
                            key="scheduler.slurm", hint=f"check the partition, account, qos, time limit and GPU "
                                                        f"request (scheduler.slurm.*) in "
                                                        f"{run_dir / plan.scheduler.job_file}")
        job = SlurmJob(done.stdout.strip().split(";")[0], env)
        write_submitted(run_dir, Submitted(self.name, (job.id,), time.time()))
        console.print("[bold]submitted[/] " + escape(f"{job.name} ({shell_line(plan.scheduler.submit)} in "
                                                      f"{shell_word(str(run_dir))}); Ctrl-C cancels it"))
        return job

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        try:
            job = SlurmJob(read_submitted(run_dir).ids[0], job_environment())
            state, ended = job.state()
        except (UserError, RuntimeError):  # nothing submitted, or a job Slurm has forgotten: it ended long ago
            return None
        return None if ended else f"{job.name} ({state})"

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        job = SlurmJob(read_submitted(run_dir).ids[0], job_environment())
        try:
            state, ended = job.state()
        except RuntimeError:  # Slurm forgot it: ended longer ago than the cluster's MinJobAge
            state, ended = "gone", True
        if ended:
            console.print(f"[bold]nothing to stop[/]: {job.name} is {state}")
            return 0
        job.cancel(1)
        console.print(f"[bold]cancelled[/] {job.name} (was {state}): Slurm stops every step")
        return 0
