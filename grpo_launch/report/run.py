"""A run directory as it is now: its plan and what metrics.jsonl holds so far (the run may still be going)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.plan import Plan, load_plan
from grpo_launch.contracts.rundir import (
    CONFIG_FILE,
    LOGS_DIR,
    METRICS_FILE,
    OVERRIDES_FILE,
    PLAN_FILE,
    TIMELINE_SEGMENTS,
)
from grpo_launch.contracts.schedulers import declared
from grpo_launch.errors import UserError
from grpo_launch.launch.curves import CLOSING_KEY

EVAL_REWARD = "eval_reward"   # TRL's evaluation record: its metrics with the "eval_" prefix


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

    def timelines(self) -> dict[int, dict[int, list[list]]]:
        """rank -> step -> what the rank did when ([phase, start, end]), from each rank's timeline file."""
        out: dict[int, dict[int, list[list]]] = {}
        for path in sorted((self.path / LOGS_DIR).glob(TIMELINE_SEGMENTS.format(rank="*"))):
            rank = int(path.name.removeprefix("trainer-rank").partition(".")[0])
            out[rank] = {r["step"]: r["segments"] for r in complete_records(path)}
        return out

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


def complete_records(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a JSONL file that may be growing: a line still being written is left for later."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return []
    complete = text.rpartition(b"\n")[0].decode(errors="replace")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _latest_per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, the later one winning (a resumed run logs some steps again)."""
    by_step = {r["step"]: r for r in records}
    return [by_step[s] for s in sorted(by_step)]


def read_run(path: Path, *, fetch_hint: bool = True) -> RunData:
    """The run directory `path`, read as it is now; a `UserError` when it is not one."""
    path = Path(path)
    if not (path / PLAN_FILE).is_file():
        raise UserError(f"{path} is not a grpo-launch run directory (no {PLAN_FILE})", key="RUN_DIR",
                        hint="give a directory `grpo run` printed (runs/<recipe>/<timestamp>)")
    plan = load_plan(path)
    overrides: tuple[str, ...] = ()
    if (path / OVERRIDES_FILE).is_file():
        import yaml

        overrides = tuple(yaml.safe_load((path / OVERRIDES_FILE).read_text()).get("overrides") or ())
    records = complete_records(path / METRICS_FILE)
    elsewhere = declared(plan.scheduler.kind).logs_elsewhere if plan.scheduler is not None else None
    if not records and fetch_hint and elsewhere:
        raise UserError(f"{path / METRICS_FILE} is not here yet: the {plan.scheduler.kind} job writes it {elsewhere}",
                        key="RUN_DIR", hint=f"`grpo report --fetch {path}` brings it here")
    failed = tuple(sorted(p.name for p in (path / LOGS_DIR).glob("*.failure*"))) if (path / LOGS_DIR).is_dir() \
        else ()
    started = (path / CONFIG_FILE).stat().st_mtime if (path / CONFIG_FILE).is_file() else None
    return RunData(
        path=path, plan=plan, overrides=overrides,
        training=_latest_per_step([r for r in records if "reward" in r or "loss" in r]),
        measures=_latest_per_step([r for r in records if m.is_measure(r)]),
        evals=_latest_per_step([r for r in records if EVAL_REWARD in r]),
        closed=any(CLOSING_KEY in r for r in records), failed=failed, started=started)
