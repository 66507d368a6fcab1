"""What a node whose processes failed on their own records for its job (logs/node-K.failure.json): typed, written
by the node's supervisor (`launch.node`), read by `grpo run` following the job (`launch.follow`) and by the Slurm
job's script (`python -m grpo_launch.launch --first-failure`), so a job spanning nodes passes on the code of the node
that failed first, not of a node it stopped."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.contracts.rundir import LOGS_DIR, NODE_FAILURES
from grpo_launch.contracts.typed import build


@dataclass(frozen=True)
class NodeFailure:
    node: int
    code: int                    # the first failure's exit code, shell-style
    time_ns: int                 # when the node recorded it (the first of all nodes' is the job's cause)
    process: str                 # the process that failed first on this node
    reason: str                  # what happened to it, in words

    def write(self, run_dir: Path) -> None:
        path = run_dir / LOGS_DIR / NODE_FAILURES.format(node=self.node)
        path.write_text(json.dumps(dataclasses.asdict(self)) + "\n")


def node_failures(run_dir: Path) -> list[NodeFailure]:
    """Every node's record, the first failure first; a record that cannot be read (a node killed while writing it)
    is left out."""
    found = []
    for path in (run_dir / LOGS_DIR).glob(NODE_FAILURES.format(node="*")):
        try:
            found.append(build(NodeFailure, json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda f: f.time_ns)
