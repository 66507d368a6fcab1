"""The layouts of a sweep side by side (`grpo plan -m`): each combination planned, or refused with its reason, and
those that fit ranked by their predicted completions per hour per GPU held (the step-time model; the advisor's
ranking). Pure, like `build_plan`: a refusal is a row, not an end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from grpo_launch.contracts.memory import Budget
from grpo_launch.contracts.performance import StepPrediction
from grpo_launch.contracts.plan import Plan
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.plan import build_plan
from grpo_launch.plan.advisor import gpu_seconds_per_sample

if TYPE_CHECKING:
    from grpo_launch.compose import Composed
    from grpo_launch.compose.sweep import Combination, Sweep


@dataclass(frozen=True)
class Row:
    combination: Combination
    plan: Plan | None = None
    error: UserError | None = None
    rank: int | None = None                 # by predicted throughput among the rows that fit; 1 is the best

    @property
    def prediction(self) -> StepPrediction | None:
        """The plan's step-time prediction when it has numbers."""
        p = self.plan.prediction if self.plan is not None else None
        return p if p is not None and p.predicted else None

    @property
    def fits(self) -> bool | None:
        """Whether the memory estimate says it fits; None when refused or the model's size is unknown."""
        memory = self.plan.memory if self.plan is not None else None
        return memory.fits if memory is not None and memory.estimated else None

    @property
    def tightest(self) -> Budget | None:
        """The budget with the least headroom: its binding phase decides the fit."""
        memory = self.plan.memory if self.plan is not None else None
        budgets = memory.gpus + memory.hosts if memory is not None else ()
        return min(budgets, key=lambda b: b.headroom_gib) if budgets else None

    @property
    def vllm_gpus(self) -> int | None:
        return sum(len(e.gpus) for e in self.plan.engines) if self.plan is not None else None

    @property
    def note(self) -> str:
        """The first error, else why it does not fit, else the first warning."""
        if self.error is not None:
            return self.error.message.splitlines()[0]
        tight = self.tightest
        if self.fits is False and tight is not None:
            return (f"does not fit: {tight.role}, {tight.binding.name}: {tight.peak_gib:.1f} of "
                    f"{tight.capacity_gib:g} GiB")
        return self.plan.warnings[0] if self.plan is not None and self.plan.warnings else ""


def plan_sweep(sweep: Sweep, composed: list[Composed | UserError]) -> list[Row]:
    """A row per combination, in the sweep's order."""
    rows = []
    for combination, result in zip(sweep.combinations, composed, strict=True):
        if isinstance(result, UserError):
            rows.append(Row(combination, error=result))
            continue
        try:
            plan = build_plan(result)
        except UserError as e:
            rows.append(Row(combination, error=e))
            continue
        rows.append(Row(combination, plan=plan))
    ranked = sorted((r for r in rows if r.fits and r.prediction is not None),
                    key=lambda r: gpu_seconds_per_sample(r.plan))
    ranks = {id(r): n for n, r in enumerate(ranked, 1)}
    return [replace(r, rank=ranks.get(id(r))) for r in rows]


def _number_first(text: str) -> tuple:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


# Each column's order for --sort, best or smallest first; rows without a value (refused) go last.
ORDERS: dict[str, Callable[[Row], Any]] = {
    "ranks": lambda r: None if r.plan is None else -r.plan.world_size,
    "vllm-gpus": lambda r: r.vllm_gpus,
    "headroom": lambda r: None if r.tightest is None else -r.tightest.headroom_gib,
    "fits": lambda r: None if r.fits is None else not r.fits,
    "throughput": lambda r: r.rank,
    "step": lambda r: None if r.prediction is None else r.prediction.step_s,
    "gpu-hours": lambda r: None if r.prediction is None else r.prediction.gpu_hours,
}


def sort_rows(rows: list[Row], column: str, keys: tuple[str, ...]) -> list[Row]:
    """The rows ordered by a column: a swept key (by value, numbers as numbers), or one of `ORDERS`."""
    if column not in keys and column not in ORDERS:
        columns = [*keys, *ORDERS]
        raise UserError(f"--sort {column}: not a column{did_you_mean(column, columns)}", key="--sort",
                        hint=f"columns: {', '.join(columns)}")

    def order(row: Row) -> tuple:
        value = _number_first(row.combination.values[keys.index(column)]) if column in keys else ORDERS[column](row)
        return (value is None, value if value is not None else 0)

    return sorted(rows, key=order)
