"""What a run ends with: its exit code and every failure, named."""

from __future__ import annotations

import re
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from grpo_launch.contracts.rundir import TrainerFailure, read_trainer_failure

EXIT_INTERRUPTED = 130
EXIT_LEFT_RUNNING = 75           # EX_TEMPFAIL: the scheduler stopped answering; the job is left as it is, maybe running
GRACE_S = 15.0                   # a stop's default wait between SIGTERM and SIGKILL
TAIL_LINES = 25                  # a failure shows this many of its process's last lines
# torch.distributed.run (under torchrun and accelerate) exits 1 whichever way a worker failed, and prints a report:
# "Root Cause (first observed failure):" ... "exitcode  : 7 (pid: 123)", -N for a signal.
FAILURE_REPORT = "Root Cause (first observed failure)"
_REPORTED_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a process killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def root_cause_code(report: list[str]) -> int | None:
    """The failed worker's own exit code, from torch.distributed's failure report (its lines from the first)."""
    for line in report:
        found = _REPORTED_CODE.match(line)
        if found:
            return exit_code_of(int(found.group(1)))
    return None


@dataclass(frozen=True)
class RankError:
    """What a trainer rank said as it failed (`trainer.progress`), and where its record is."""

    record: TrainerFailure
    path: Path

    @property
    def where(self) -> str:
        r = self.record
        return f"rank {r.rank}, " + (f"at step {r.step}" if r.step is not None else r.phase)


def first_rank_error(run_dir: Path, ranks: Collection[int]) -> RankError | None:
    """The earliest failure record among `ranks` (the others often fail because that one did)."""
    found = [f for f in (read_trainer_failure(run_dir, r) for r in ranks) if f is not None]
    first = min(found, key=lambda f: f.time, default=None)
    return RankError(first, first.path(run_dir)) if first is not None else None


@dataclass(frozen=True)
class Failure:
    """One process (or prepare step) that failed on its own, not because the supervisor stopped it."""

    process: str
    code: int                      # its exit code, shell-style; 1 when it never exited (readiness timeout)
    reason: str                    # e.g. "exited with code 9 before it was ready"
    log: Path
    tail: tuple[str, ...] = ()     # its last log lines
    rank_error: RankError | None = None  # a trainer: the rank that failed first, and why
    time_ns: int = field(default_factory=time.time_ns)  # when it failed (not when the stop it caused ended)

    def __str__(self) -> str:
        if self.rank_error is None:
            return f"{self.process} {self.reason}"
        return f"{self.process} {self.reason} ({self.rank_error.where}: {self.rank_error.record.error})"


@dataclass(frozen=True)
class RunResult:
    code: int                      # 0, the first failure's code, or 130 when interrupted
    failures: tuple[Failure, ...] = field(default=())  # in the order they happened; the first stopped the run
    interrupted: bool = False
    restarts: dict[str, int] = field(default_factory=dict)  # process -> times it was brought back
    left_running: str | None = None  # what `grpo run` stopped following without ending it, and why
