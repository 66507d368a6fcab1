"""What the supervisor knows of each process it runs (a state, its incarnations, what its output said about a
failure), and the events its control loop acts on, one queue of them, whichever comes first."""

from __future__ import annotations

import asyncio
import enum
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from grpo_launch.contracts.plan import ProcessSpec
from grpo_launch.launch.result import FAILURE_REPORT, TAIL_LINES


class State(enum.Enum):
    PENDING = "pending"          # not started yet
    STARTING = "starting"        # running, its readiness URL not answering yet
    READY = "ready"              # running and ready (or running with no readiness URL)
    RESTARTING = "restarting"    # died after it was ready; started again after its back-off
    EXITED = "exited"            # ended on its own with code 0 (a trainer that finished)
    FAILED = "failed"            # ended on its own otherwise, never became ready, or stopped answering
    STOPPED = "stopped"          # ended because the supervisor stopped it


@dataclass
class Child:
    spec: ProcessSpec
    log_path: Path
    state: State = State.PENDING
    process: asyncio.subprocess.Process | None = None
    exited: asyncio.Future[int] | None = None  # resolved with the return code when the process exits
    generation: int = 0          # incarnations started; events of an earlier one are stale
    restarts: int = 0            # every restart, for the result
    recent_restarts: int = 0     # those its restart limit counts: since it was last ready long enough
    was_ready: bool = False
    ready_since: float | None = None  # when this incarnation became ready
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    diagnosis: str | None = None  # the cause its output names (the first of its spec's diagnoses to match)
    report: list[str] = field(default_factory=list)  # torch.distributed's failure report, from its first line
    tasks: list[asyncio.Task] = field(default_factory=list)  # its exit watcher, readiness and liveness probes
    pumps: list[asyncio.Task] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.state in (State.STARTING, State.READY)

    def remember(self, text: str) -> None:
        """Keep a line of its output for the failure's tail, and what it says about a failure: a known cause, or
        torch.distributed's failure report."""
        self.tail.append(text)
        if self.diagnosis is None:
            for d in self.spec.diagnoses:
                if re.search(d.pattern, text):
                    self.diagnosis = f"{d.reason} (it said: {text.strip()})"
                    break
        if self.report or FAILURE_REPORT in text:
            self.report.append(text)


@dataclass(frozen=True)
class Exited:
    child: Child
    generation: int
    returncode: int


@dataclass(frozen=True)
class Ready:
    name: str                    # a local child, or a remote process waited for by URL
    generation: int
    seconds: float


@dataclass(frozen=True)
class NotReady:
    name: str
    generation: int
    url: str
    timeout_s: float


@dataclass(frozen=True)
class Unresponsive:              # a ready process failed its liveness probes
    name: str
    generation: int
    url: str
    failures: int
    seconds: float               # since it last answered


@dataclass(frozen=True)
class Due:                       # a start delay has elapsed
    child: Child


@dataclass(frozen=True)
class RestartDue:                # a restart's back-off has elapsed and what was left of the process is gone
    child: Child


@dataclass(frozen=True)
class ExitOverdue:               # a trainer launcher finished this long ago and others still run
    finished: str
    timeout_s: float


@dataclass(frozen=True)
class StopRequested:
    presses: int
