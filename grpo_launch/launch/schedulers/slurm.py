"""scheduler=slurm: submit the run directory's job.sbatch, follow the job, cancel it on Ctrl-C (or `grpo stop`).

The job's state comes from `scontrol show job`, polled: `sbatch --wait` polls after 2, 10 and 42 s and then every
32 s, and says 0 for a job cancelled while it was pending. Works without accounting (no sacct): the record lasts
MinJobAge after the end. Each process's log is streamed from the run directory, where the nodes write it.

The controller under load times out (`Socket timed out on send/recv operation`, `Unable to contact slurm
controller`): such an answer, or a command that outlasts its bound, is transient (`launch.control_plane`): asked
again, never taken for the job's end. Only "Invalid job id specified" says the job is gone (its record aged out).
Every job carries the run's label in its comment (`--comment`), by which one whose submission's answer was lost is
found again, and cancelled.
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
from grpo_launch.contracts.schedulers import SlurmSettings, run_label
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.errors import UserError
from grpo_launch.launch.control_plane import Patience, Transient
from grpo_launch.launch.follow import Job
from grpo_launch.launch.replica_key import provide_replica_key
from grpo_launch.launch.schedulers.base import JobLauncher
from grpo_launch.launch.spawn import child_environment

COMMAND_TIMEOUT_S = 60.0   # one scontrol, scancel or squeue
SUBMIT_TIMEOUT_S = 120.0   # sbatch
GONE = "Invalid job id specified"  # scontrol: no record of the job (it ended longer ago than MinJobAge)
# What sbatch says when the controller, not the job, is at fault: asked again.
TRANSIENT_SBATCH = ("Socket timed out", "Unable to contact slurm controller", "Slurm temporarily unable",
                    "Resource temporarily unavailable", "Zero Bytes were transmitted or received")
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


def slurm_command(argv: list[str], env: dict[str, str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """A Slurm command's output; `Transient` when it outlasts its bound or fails, unless it says a job is gone
    (`JobGone`)."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise Transient(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    if done.returncode:
        said = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
        if GONE in said:
            raise JobGone(said)
        raise Transient(f"{' '.join(argv[:3])} failed: {said}")
    return done.stdout


class JobGone(Exception):
    """Slurm has no record of the job."""


class SlurmJob(Job):
    control_plane = "Slurm's controller"

    def __init__(self, job_id: str, env: dict[str, str]) -> None:
        self.id = job_id
        self.name = f"Slurm job {job_id}"
        self.env = env
        self.info: dict[str, str] = {}

    def state(self) -> tuple[str, bool]:
        try:
            out = slurm_command(["scontrol", "-o", "show", "job", self.id], self.env)
        except JobGone:
            if self.info:  # the record aged out after the end (MinJobAge): keep the last one seen
                return self.info.get("JobState", "gone"), True
            raise
        self.info = parse_job(out)
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
        # processes (SIGKILL after the cluster's KillWait). The second kills at once. A controller that does not
        # answer now is asked again by the next poll's state (which ends with the job's end).
        try:
            slurm_command(["scancel", *(["--signal=KILL", "--full"] if presses > 1 else []), self.id], self.env)
        except (Transient, JobGone):
            pass


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
        keyed = provide_replica_key(plan, range(plan.nodes), env)  # sbatch gives every node the job's environment
        if keyed is not None:
            console.print(f"[dim]{escape(keyed)}[/]")
        label = run_label(run_dir)
        sbatch, *rest = plan.scheduler.submit
        argv = [sbatch, f"--comment={label}", *rest]
        patience = self._patience(plan, console)

        def submitted() -> str:
            try:
                done = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True,
                                      timeout=SUBMIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # the controller may have taken it: a job nobody knows would bill
                cancelled = self._reconcile(label, (), env)
                made = f" (the job it made, {', '.join(cancelled)}, is cancelled)" if cancelled else ""
                raise Transient(f"sbatch did not answer within {SUBMIT_TIMEOUT_S:g} s{made}") from None
            said = done.stderr.strip() or done.stdout.strip()
            if done.returncode and any(t in said for t in TRANSIENT_SBATCH):
                raise Transient(f"sbatch failed: {said}")
            if done.returncode:
                raise UserError(f"sbatch refused the job: {said}", key="scheduler.slurm",
                                hint=f"check the partition, account, qos, time limit and GPU request "
                                     f"(scheduler.slurm.*) in {run_dir / plan.scheduler.job_file}")
            return done.stdout.strip().split(";")[0]

        job = SlurmJob(patience.call(submitted), env)
        write_submitted(run_dir, Submitted(self.name, (job.id,), time.time()))
        console.print("[bold]submitted[/] " + escape(f"{job.name} ({shell_line(plan.scheduler.submit)} in "
                                                      f"{shell_word(str(run_dir))}); Ctrl-C cancels it"))
        return job

    def _patience(self, plan: Plan, console: Console) -> Patience:
        return Patience(SlurmJob.control_plane, plan.scheduler.control_plane_timeout_s,
                        lambda text: console.print(f"[yellow]{escape(text)}[/]"))

    def _reconcile(self, label: str, known: tuple[str, ...], env: dict[str, str]) -> list[str]:
        """Cancel every job carrying the run's label that the run does not know (its submission's answer lost):
        their IDs."""
        listed = slurm_command(["squeue", "-h", "-o", "%i %k"], env)
        unknown = [job_id for job_id, _, comment in (line.partition(" ") for line in listed.splitlines())
                   if comment.strip() == label and job_id not in known]
        for job_id in unknown:
            slurm_command(["scancel", job_id], env)
        return unknown

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        try:
            job = SlurmJob(read_submitted(run_dir).ids[0], job_environment())
        except UserError:  # nothing submitted
            return None
        try:
            state, ended = self._patience(plan, Console(stderr=True)).call(job.state)
        except JobGone:  # Slurm has forgotten it: it ended long ago
            return None
        return None if ended else f"{job.name} ({state})"

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        job = SlurmJob(read_submitted(run_dir).ids[0], job_environment())
        patience = self._patience(plan, console)
        for stray in patience.call(lambda: self._reconcile(run_label(run_dir), (job.id,), job.env)):
            console.print(f"[bold]cancelled[/] Slurm job {stray}: it carries this run's label, and its submission's "
                          f"answer was lost")
        try:
            state, ended = patience.call(job.state)
        except JobGone:  # Slurm forgot it: ended longer ago than the cluster's MinJobAge
            state, ended = "gone", True
        if ended:
            console.print(f"[bold]nothing to stop[/]: {job.name} is {state}")
            return 0
        patience.call(lambda: slurm_command(["scancel", job.id], job.env))
        console.print(f"[bold]cancelled[/] {job.name} (was {state}): Slurm stops every step")
        return 0
