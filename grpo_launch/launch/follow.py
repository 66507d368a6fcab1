"""Following a job that runs elsewhere: its state, and each process's log streamed with its prefix as it grows.

A scheduler's nodes write every process's log into the run directory (shared storage); `JobFollower` reads them
as `grpo run` shows a local run's output, through the same `ConsoleDisplay`, and ends with the job. What the job
is (its state, how to cancel it) comes from a `Job`, one per scheduler.
"""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path

from rich.console import Console

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import JOB_LOG, LOGS_DIR, LogTail, read_node_failures
from grpo_launch.launch.control_plane import Patience, Transient, Unreachable
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.result import EXIT_INTERRUPTED, EXIT_LEFT_RUNNING, TAIL_LINES, Failure, RunResult

TICK_S = 0.2


class Job(ABC):
    """A submitted job, as its scheduler reports it."""

    name: str                                # for messages: "Slurm job 12"
    control_plane: str                       # who answers for it, in words: "Slurm's controller"

    @abstractmethod
    def state(self) -> tuple[str, bool]:
        """(its state in the scheduler's words, whether it has ended); `Transient` when the control plane gave no
        answer that says."""

    @abstractmethod
    def exit_code(self) -> int:
        """Once ended: its exit code."""

    @abstractmethod
    def cancel(self, presses: int) -> None:
        """Ctrl-C: the first asks the job to stop (its nodes stop their processes), the second kills it."""


def node_failures(run_dir: Path) -> list[Failure]:
    """What each node that failed recorded (`launch.node`), the first failure first."""
    failures = []
    for record in read_node_failures(run_dir):
        log = run_dir / LOGS_DIR / f"{record.process}.log"
        tail = tuple(log.read_text(errors="replace").splitlines()[-TAIL_LINES:]) if log.is_file() else ()
        failures.append(Failure(record.process, record.code, record.reason, log, tail))
    return failures


class JobFollower:
    def __init__(self, plan: Plan, run_dir: Path, job: Job, console: Console, *, poll_s: float) -> None:
        self.run_dir = run_dir
        self.job = job
        self.poll_s = poll_s
        self.bound_s = plan.scheduler.control_plane_timeout_s
        names = [JOB_LOG.removesuffix(".log")] + [p.name for p in plan.processes]
        self.tails = {name: LogTail(run_dir / LOGS_DIR / f"{name}.log") for name in names}
        self.display = ConsoleDisplay(console, names)
        self.max_steps = plan.trainer_inputs.max_steps
        self.per = (plan.world_size, plan.device.slot)
        self.presses = 0

    def _on_signal(self, signum, frame) -> None:
        self.presses += 1
        self.job.cancel(self.presses)  # before anything is shown: a console that fails must not swallow it
        self.display.stopping(self.presses)

    def _stream(self) -> None:
        for name, tail in self.tails.items():
            for line in tail.lines():
                self.display.line(name, line)
        self.display.tick()

    def follow(self) -> RunResult:
        previous = signal.signal(signal.SIGINT, self._on_signal)
        last_state, next_poll, lost = None, 0.0, None
        patience = Patience(self.job.control_plane, self.bound_s, lambda text: self.display.say(text, style="yellow"))
        try:
            with self.display:
                self.display.training(self.run_dir, self.max_steps, per=self.per)
                while True:
                    self._stream()
                    if time.monotonic() >= next_poll:
                        try:
                            state, ended = self.job.state()
                        except Transient as e:
                            try:
                                next_poll = time.monotonic() + patience.failed(e)
                            except Unreachable as gone:
                                lost = gone
                                break
                            continue
                        patience.answered()
                        next_poll = time.monotonic() + self.poll_s
                        if state != last_state:
                            self.display.say(f"{self.job.name}: {state}")
                            last_state = state
                        if ended:
                            break
                    time.sleep(TICK_S)
                self._stream()
        finally:
            signal.signal(signal.SIGINT, previous)
        if lost is not None:  # never cancelled for it: the job may run on, and it is said how to end it
            result = RunResult(code=EXIT_LEFT_RUNNING, left_running=(
                f"{self.job.name}: {lost}; `grpo stop {self.run_dir}` cancels it once it answers"))
            self.display.finished(result)
            return result
        interrupted = self.presses > 0
        failures = () if interrupted else tuple(node_failures(self.run_dir))
        code = EXIT_INTERRUPTED if interrupted else self.job.exit_code()
        result = RunResult(code=code, failures=failures, interrupted=interrupted)
        self.display.finished(result)
        return result
