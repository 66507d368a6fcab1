"""The `Launcher` interface every scheduler's launch side implements (see `launch.schedulers`)."""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from rich.console import Console

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import LOGS_DIR
from grpo_launch.contracts.schedulers import SchedulerSettings
from grpo_launch.launch.follow import Job, JobFollower
from grpo_launch.launch.result import GRACE_S, RunResult

Settings = TypeVar("Settings", bound=SchedulerSettings | None)


@dataclass(frozen=True)
class Options:
    """How `grpo run` was asked to start and watch the run."""

    grace_s: float = GRACE_S           # between SIGTERM and SIGKILL where grpo-launch stops processes itself
    verbose: bool = False              # every line the processes print
    nodes: tuple[int, ...] = ()        # scheduler=local: the nodes this `grpo run` starts
    join: bool = False                 # scheduler=local: this node joins a run directory another node wrote
    preflight: bool = False            # check the machines' storage and network with cheap ones first


@dataclass(frozen=True)
class RunLogs:
    """Where a run's process logs are, for whoever reads them after the run (`grpo report`)."""

    where: str                         # a directory of the run directory here, or a URI elsewhere
    fetch: tuple[str, ...] = ()        # the command that copies them into the run directory here; () if there


class Launcher(ABC, Generic[Settings]):
    """How `grpo run` starts a planned run through one scheduler, and how `grpo stop` ends it. Its own settings (the
    recipe's `scheduler.<key>`) come with the plan: `settings(plan)`."""

    name: ClassVar[str]                # contracts.schedulers' name, scheduler.kind
    reach: ClassVar[str]               # where its nodes find the run directory, in words
    node_rank: ClassVar[bool] = False  # whether `grpo run --node-rank K` starts one node of it (scheduler=local)
    not_installed: ClassVar[str | None] = None  # what to do where its submit command is not installed
    preflight: ClassVar[bool] = False  # `grpo run --preflight` checks its storage and network with cheap machines

    def settings(self, plan: Plan) -> Settings:
        """This scheduler's own section of the recipe, as the plan holds it (typed by `contracts.schedulers`)."""
        return plan.scheduler.settings

    def missing(self, plan: Plan) -> str | None:
        """Why its job cannot be submitted from here and what to do instead (the run directory is written all the
        same); None when it can."""
        if self.not_installed is None or shutil.which(plan.scheduler.submit[0]) is not None:
            return None
        return self.not_installed

    def submit_command(self, plan: Plan, run_dir: Path) -> tuple[str, ...]:
        """The command that submits the run written in `run_dir`, run there (what `grpo run` prints where the
        scheduler is not installed here)."""
        return plan.scheduler.submit

    def prepare(self, plan: Plan, options: Options, console: Console) -> Plan:
        """What must hold before anything is written, as a `UserError`; the plan as it is started."""
        return plan

    def rehearses_here(self) -> bool:
        """Whether a rehearsal's job can run through this scheduler on this machine."""
        return False

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        """Whether the run's metrics.jsonl ends up in the run directory here (the reward curve is drawn from it)."""
        return True

    @abstractmethod
    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        """Start the run written in `run_dir` and follow it to its end."""

    @abstractmethod
    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        """From another terminal: end the run and release what it holds; `grpo stop`'s exit code."""

    def logs(self, plan: Plan, run_dir: Path) -> RunLogs:
        return RunLogs(f"{run_dir / LOGS_DIR}/")

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        """What an earlier `grpo run` of `run_dir` submitted that, by the scheduler's own record, still runs (in
        words); None when nothing does, or the scheduler cannot say from here."""
        return None


class JobLauncher(Launcher[Settings]):
    """A scheduler whose job runs elsewhere: submitted from the run directory, followed here (every process's log
    through the console display, the job's state), cancelled on Ctrl-C, its IDs kept for `grpo stop`."""

    @abstractmethod
    def submit(self, plan: Plan, run_dir: Path, console: Console) -> Job:
        """Submit the job; it runs once this returns."""

    @abstractmethod
    def poll_s(self, plan: Plan) -> float:
        """How often the job's state is read."""

    def follow(self, plan: Plan, run_dir: Path, job: Job, console: Console) -> RunResult:
        return JobFollower(plan, run_dir, job, console, poll_s=self.poll_s(plan)).follow()

    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        job = self.submit(plan, run_dir, console)
        return self.follow(plan, run_dir, job, console)
