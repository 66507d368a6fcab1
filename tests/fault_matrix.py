"""The fault matrix: what came of each fault a test injects into a real part (issue 27's list).

A test of a fault (marked `fault`) ends by recording one row (`record_fault`): the fault, how many times it was
injected, what the run was meant to do about it and what it did, and the losses: steps a resumed or surviving run
trained fewer (or again) than the uninterrupted run would, metrics records the readers lost, and jobs or processes
of the run still billing once it is over. `record_fault` holds the test to its row's targets (the expected outcome,
no loss) and appends the row to the JSON-lines file named by GRPO_FAULT_MATRIX, which `benchmarks/faults.py` sets
and prints as one table; without that variable nothing is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_launch.contracts.rundir import Metrics

MATRIX_ENV = "GRPO_FAULT_MATRIX"

FINISHED = "finished"           # the run ended as an uninterrupted one does
LEFT_RUNNING = "left running"   # the control plane stayed silent: the run was left as it is, and said so
REFUSED = "refused"             # a second run (or a resume with nothing to resume) was refused before it started
CONSISTENT = "consistent"       # a broadcast ended all-or-nothing: the fleet knows what every replica holds


@dataclass(frozen=True)
class FaultRow:
    fault: str              # "2 scontrol times out mid-run"
    injected: int           # how many times the fault was injected
    expected: str           # what the run should do: FINISHED, LEFT_RUNNING, REFUSED, CONSISTENT
    outcome: str            # what it did
    steps_lost: int = 0
    records_lost: int = 0
    billing: int = 0        # jobs (or processes) of the run still running once it is over and nothing should
    lines_skipped: int = 0  # metrics lines a fault cut short, which the readers skip (not a loss: the step's record
                            # is there again once its step is trained again)


    @property
    def met(self) -> bool:
        return self.outcome == self.expected and not (self.steps_lost or self.records_lost or self.billing)


def record_fault(row: FaultRow) -> None:
    """Appends `row` to the matrix file when a benchmark asked for one (a line per write: workers append side by
    side), then holds the test to the row's targets."""
    if path := os.environ.get(MATRIX_ENV):
        with Path(path).open("a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
    assert row.met, row


def read(path: Path) -> list[FaultRow]:
    return [FaultRow(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def records_lost(metrics: Metrics, max_steps: int) -> int:
    """Steps of 1..max_steps whose training or measure record the readers do not see."""
    expected = set(range(1, max_steps + 1))
    return sum(len(expected - {r["step"] for r in kind}) for kind in (metrics.training, metrics.measures))


def steps_lost(trained: list[int], max_steps: int) -> int:
    """Steps missing from, or logged twice in, what the readers see of a run meant to train `max_steps`."""
    return len(set(range(1, max_steps + 1)) ^ set(trained)) + len(trained) - len(set(trained))
