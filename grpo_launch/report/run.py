"""A run directory as it is now: its plan and what metrics.jsonl holds so far (the run may still be going), read
through the run directory's contract (`contracts.rundir`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.contracts import rundir
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.schedulers import declared
from grpo_launch.errors import UserError


@dataclass
class RunData:
    path: Path
    plan: Plan
    overrides: tuple[str, ...]
    training: list[dict[str, Any]]             # TRL's step records (and the CPU async loop's), one per step
    measures: list[dict[str, Any]]             # the measure records, one per step
    evals: list[dict[str, Any]]                # TRL's evaluation records
    closed: bool                               # the trainer logged its closing record
    failed: tuple[str, ...] = field(default=())  # failure records left in logs/
    started: float | None = None               # when the run directory was written (Unix time)
    bad_lines: int = 0                         # lines of metrics.jsonl that were not a record (cut, then skipped)

    def timelines(self) -> dict[int, dict[int, list[list]]]:
        """rank -> step -> what the rank did when ([phase, start, end]), from each rank's timeline file."""
        return rundir.read_timelines(self.path)

    @property
    def max_steps(self) -> int | None:
        steps = self.plan.trainer_inputs.max_steps
        return steps if steps > 0 else None

    @property
    def steps(self) -> int:
        return max([r["step"] for r in self.training + self.measures], default=0)

    @property
    def state(self) -> str:
        if self.failed:
            return "failed"
        if self.closed or (self.max_steps is not None and self.steps >= self.max_steps):
            return "finished"
        return "running (or stopped)"

    @property
    def name(self) -> str:
        return f"{self.plan.recipe}/{self.path.name}"

    @property
    def seed(self) -> int:
        return self.plan.trainer_inputs.seed


def read_run(path: Path, *, fetch_hint: bool = True) -> RunData:
    """The run directory `path`, read as it is now; a `UserError` when it is not one."""
    path = Path(path)
    plan = rundir.read_plan(path)
    overrides = rundir.read_overrides(path, missing_ok=True)
    metrics = rundir.read_metrics(path)
    elsewhere = declared(plan.scheduler.kind).logs_elsewhere if plan.scheduler is not None else None
    if metrics.empty and fetch_hint and elsewhere:
        raise UserError(f"{path / rundir.METRICS_FILE} is not here yet: the {plan.scheduler.kind} job writes it "
                        f"{elsewhere}", key="RUN_DIR", hint=f"`grpo report --fetch {path}` brings it here")
    return RunData(path=path, plan=plan, overrides=overrides.overrides if overrides else (),
                   training=metrics.training, measures=metrics.measures, evals=metrics.evals, closed=metrics.closed,
                   failed=rundir.failure_records(path), started=rundir.written_at(path), bad_lines=metrics.bad_lines)
