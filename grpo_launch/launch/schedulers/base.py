"""The `Launcher` interface every scheduler's launch side implements (see `launch.schedulers`)."""

from __future__ import annotations

import json
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import LOGS_DIR, SUBMITTED_FILE
from grpo_launch.errors import UserError
from grpo_launch.launch.follow import Job, JobFollower
from grpo_launch.launch.result import RunResult


@dataclass(frozen=True)
class Options:
    """How `grpo run` was asked to start and watch the run."""

    grace_s: float = 15.0              # between SIGTERM and SIGKILL where grpo-launch stops processes itself
    verbose: bool = False              # every line the processes print
    nodes: tuple[int, ...] = ()        # scheduler=local: the nodes this `grpo run` starts
    join: bool = False                 # scheduler=local: this node joins a run directory another node wrote
    preflight: bool = False            # check the machines' storage and network with cheap ones first


@dataclass(frozen=True)
class RunLogs:
    """Where a run's process logs are, for whoever reads them after the run (`grpo report`)."""

    where: str                         # a directory of the run directory here, or a URI elsewhere
    fetch: tuple[str, ...] = ()        # the command that copies them into the run directory here; () if there


class Launcher(ABC):
    """How `grpo run` starts a planned run through one scheduler, and how `grpo stop` ends it."""

    name: ClassVar[str]                # contracts.schedulers' name, scheduler.kind
    reach: ClassVar[str]               # where its nodes find the run directory, in words
    node_rank: ClassVar[bool] = False  # whether `grpo run --node-rank K` starts one node of it (scheduler=local)
    not_installed: ClassVar[str | None] = None  # what to do where its submit command is not installed
    preflight: ClassVar[bool] = False  # `grpo run --preflight` checks its storage and network with cheap machines

    def missing(self, plan: Plan) -> str | None:
        """Why its job cannot be submitted from here and what to do instead (the run directory is written all the
        same); None when it can."""
        if self.not_installed is None or shutil.which(plan.scheduler.submit[0]) is not None:
            return None
        return self.not_installed

    def prepare(self, plan: Plan, settings: Any, options: Options, console: Console) -> Plan:
        """What must hold before anything is written, as a `UserError`; the plan as it is started."""
        return plan

    def rehearses_here(self) -> bool:
        """Whether a rehearsal's job can run through this scheduler on this machine."""
        return False

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        """Whether the run's metrics.jsonl ends up in the run directory here (the reward curve is drawn from it)."""
        return True

    @abstractmethod
    def run(self, plan: Plan, run_dir: Path, settings: Any, console: Console, options: Options) -> RunResult:
        """Start the run written in `run_dir` and follow it to its end."""

    @abstractmethod
    def stop(self, plan: Plan, run_dir: Path, settings: Any, console: Console) -> int:
        """From another terminal: end the run and release what it holds; `grpo stop`'s exit code."""

    def logs(self, plan: Plan, run_dir: Path, settings: Any) -> RunLogs:
        return RunLogs(f"{run_dir / LOGS_DIR}/")


class JobLauncher(Launcher):
    """A scheduler whose job runs elsewhere: submitted from the run directory, followed here (every process's log
    through the console display, the job's state), cancelled on Ctrl-C, its IDs kept for `grpo stop`."""

    @abstractmethod
    def submit(self, plan: Plan, run_dir: Path, settings: Any, console: Console) -> Job:
        """Submit the job; it runs once this returns."""

    @abstractmethod
    def poll_s(self, settings: Any) -> float:
        """How often the job's state is read."""

    def follow(self, plan: Plan, run_dir: Path, job: Job, settings: Any, console: Console) -> RunResult:
        return JobFollower(plan, run_dir, job, console, poll_s=self.poll_s(settings)).follow()

    def run(self, plan: Plan, run_dir: Path, settings: Any, console: Console, options: Options) -> RunResult:
        job = self.submit(plan, run_dir, settings, console)
        return self.follow(plan, run_dir, job, settings, console)


def record_submitted(run_dir: Path, scheduler: str, ids: list[str], **more: Any) -> None:
    """What was submitted, written as soon as it is, so `grpo stop RUN_DIR` finds it from another terminal."""
    record = {"scheduler": scheduler, "ids": ids, "time": time.time(), **more}
    tmp = run_dir / f".{SUBMITTED_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(run_dir / SUBMITTED_FILE)


def read_submitted(run_dir: Path) -> dict[str, Any]:
    path = run_dir / SUBMITTED_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{run_dir} holds no record of a started run ({SUBMITTED_FILE})", key="RUN_DIR",
                        hint="the run was never started from this run directory (a dry run, or nothing could be "
                             "submitted here)") from None
