"""The layout advisor: re-plan the knobs a user left free, keep the layouts that fit, rank them by predicted time.

Knobs: placement (colocate or server), ZeRO stage and offload, vLLM TP, sleep level, gpu_memory_utilization, and
the micro-batch (per_device_train_batch_size halved, gradient_accumulation_steps doubled: the same completions per
optimizer step). A candidate is the typed `Config` with those fields replaced, planned by `build_plan`: the
placement modules' rules decide validity (a candidate that raises `UserError` is simply not a layout), the memory
estimate decides fit. Knobs set on the command line stay as given, unless no layout fits with them.

The ranking, best first (docs/memory.md, "The advisor"): the step-time model's (`estimate.step_time`) GPU-seconds per
trained completion on the GPUs the cluster holds, i.e. the most completions per hour per GPU paid for, where
predictions less than TIE_SHARE apart count as equal; then fewer changes to the recipe; then more memory headroom. A
plan the model cannot predict (an unknown GPU type) ranks by changes and headroom alone, and the advice says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.shell import shell_line
from grpo_launch.errors import UserError
from grpo_launch.plan import build_plan
from grpo_launch.plan.placements import PLACEMENTS

if TYPE_CHECKING:
    from grpo_launch.compose import Composed

# (stage, offload_optimizer, offload_param), least offload first.
ZERO_CHOICES = ((0, False, False), (1, False, False), (2, False, False), (3, False, False),
                (1, True, False), (2, True, False), (3, True, False), (3, True, True))
# Predictions closer than this are ties: the model does not resolve them (its seed cases land within 20%), so a
# change to the recipe must win by more to be suggested first.
TIE_SHARE = 0.02
# The ranking in words, for the views that rank by it.
RANKING = (f"predicted completions per hour per GPU held (the step-time model; within {TIE_SHARE:.0%} a tie), then "
           f"fewer changes, then more headroom")
SLEEP_KEY = "placement.colocate.sleep_level"
# Command-line keys that pin knobs: the advisor keeps what the user chose.
PINS = {
    "placement": ("placement",), "placement.kind": ("placement",),
    "zero": ("stage", "offload_optimizer", "offload_param"), "zero.stage": ("stage",),
    "zero.offload_optimizer": ("offload_optimizer",), "zero.offload_param": ("offload_param",),
    "vllm.tensor_parallel_size": ("tp",), SLEEP_KEY: ("sleep_level",),
    "vllm.gpu_memory_utilization": ("utilization",),
    "trainer.per_device_train_batch_size": ("micro_batch",), "trainer.gradient_accumulation_steps": ("micro_batch",),
}


@dataclass(frozen=True)
class Knobs:
    placement: str
    stage: int
    offload_optimizer: bool
    offload_param: bool
    tp: int
    sleep_level: int
    utilization: float
    micro_batch: int                # per_device_train_batch_size
    accumulation: int               # gradient_accumulation_steps

    @classmethod
    def of(cls, config: Config, plan: Plan) -> Knobs:
        z = config.zero
        return cls(placement=plan.placement, stage=z.stage, offload_optimizer=z.offload_optimizer,
                   offload_param=z.offload_param, tp=config.vllm.tensor_parallel_size,
                   sleep_level=config.placement.colocate.sleep_level,
                   utilization=config.vllm.gpu_memory_utilization,
                   micro_batch=plan.batch.per_device_train_batch_size,
                   accumulation=plan.batch.gradient_accumulation_steps)

    def apply(self, config: Config) -> Config:
        trainer = {**config.trainer, "per_device_train_batch_size": self.micro_batch,
                   "gradient_accumulation_steps": self.accumulation}
        return replace(
            config, placement=replace(config.placement, kind=self.placement,
                                      colocate=replace(config.placement.colocate, sleep_level=self.sleep_level)),
            zero=replace(config.zero, stage=self.stage, offload_optimizer=self.offload_optimizer,
                         offload_param=self.offload_param),
            vllm=replace(config.vllm, tensor_parallel_size=self.tp, gpu_memory_utilization=self.utilization),
            trainer=trainer)

    def changes(self, base: Knobs) -> tuple[str, ...]:
        """The overrides that turn `base`'s recipe into this layout."""
        out = []
        if self.placement != base.placement:
            out.append(f"placement={self.placement}")
        for name, key in (("stage", "zero.stage"), ("offload_optimizer", "zero.offload_optimizer"),
                          ("offload_param", "zero.offload_param"), ("tp", "vllm.tensor_parallel_size"),
                          ("sleep_level", SLEEP_KEY)):
            if getattr(self, name) != getattr(base, name):
                value = getattr(self, name)
                out.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        # A new placement brings its own utilization default: name the value whenever the placement changes.
        if self.utilization != base.utilization or self.placement != base.placement:
            out.append(f"vllm.gpu_memory_utilization={self.utilization:g}")
        if self.micro_batch != base.micro_batch:
            out += [f"trainer.per_device_train_batch_size={self.micro_batch}",
                    f"trainer.gradient_accumulation_steps={self.accumulation}"]
        return tuple(out)


class Ranking(NamedTuple):
    """How one layout ranks (the module's docstring), compared field by field: lower is better."""

    cost_per_sample: float          # log of GPU-seconds per completion in steps of TIE_SHARE; inf when not predicted
    changes: int                    # overrides from the recipe
    less_headroom: float            # minus the tightest budget's headroom, GiB


@dataclass(frozen=True)
class Suggestion:
    knobs: Knobs
    overrides: tuple[str, ...]      # empty: the plan as it is
    plan: Plan
    score: Ranking

    @property
    def summary(self) -> str:
        k, p = self.knobs, self.plan
        offload = " + param offload" if k.offload_param else " + optimizer offload" if k.offload_optimizer else ""
        parts = [f"{p.world_size} trainer GPUs", k.placement, p.parallelism + offload, f"TP {k.tp}"]
        if len(PLACEMENTS[k.placement].sleep_levels) > 1:
            parts.append(f"sleep {k.sleep_level}")
        if p.vllm.enabled:
            parts.append(f"utilization {k.utilization:g}")
        parts.append(f"micro-batch {k.micro_batch}")
        worst = min(p.memory.gpus + p.memory.hosts, key=lambda b: b.headroom_gib)
        parts.append(f"peak {worst.peak_gib:.1f} of {worst.capacity_gib:g} GiB ({worst.role}, {worst.binding.name})")
        predicted = p.prediction
        if predicted is not None and predicted.predicted:
            parts.append(f"step {predicted.step_s:.1f} s, {predicted.samples_per_hour_per_gpu:,.0f} completions/h "
                         f"per GPU")
        return " · ".join(parts)


@dataclass(frozen=True)
class Advice:
    suggestions: tuple[Suggestion, ...]
    freed: tuple[str, ...] = ()     # command-line choices the suggestions change: nothing fits with them
    skipped: str = ""               # why there was nothing to search
    unranked: str = ""              # why the suggestions are not ranked by predicted time


def _pinned(overrides: tuple[str, ...]) -> set[str]:
    out: set[str] = set()
    for text in overrides:
        key = text.lstrip("+~").split("=", 1)[0]
        out.update(PINS.get(key, ()))
    return out


def _tp_options(config: Config) -> list[int]:
    """TP sizes that divide a node (a TP group never spans machines)."""
    gpus = config.cluster.gpus_per_node
    return [d for d in range(1, gpus + 1) if gpus % d == 0]


def gpu_seconds_per_sample(plan: Plan) -> float:
    """GPUs held x predicted step time / completions per step: what one trained completion costs; inf when the plan
    has no prediction."""
    p = plan.prediction
    if p is None or not p.predicted or not p.samples_per_step:
        return math.inf
    return p.gpus_held * p.step_s / p.samples_per_step


def _score(knobs: Knobs, plan: Plan, base: Knobs) -> Ranking:
    memory = plan.memory
    headroom = min(b.headroom_gib for b in memory.gpus + memory.hosts)
    cost = gpu_seconds_per_sample(plan)
    bucket = round(math.log(cost) / math.log1p(TIE_SHARE)) if math.isfinite(cost) else math.inf
    return Ranking(bucket, len(knobs.changes(base)), -headroom)


def _micro_batches(base: Knobs) -> Iterator[tuple[int, int]]:
    """(per device, accumulation) keeping their product, largest micro-batch first."""
    size, accumulation = base.micro_batch, base.accumulation
    while size >= 1:
        yield size, accumulation
        if size % 2:
            return
        size, accumulation = size // 2, accumulation * 2


def _try(composed: Composed, knobs: Knobs) -> Plan | None:
    try:
        return build_plan(replace(composed, config=knobs.apply(composed.config)))
    except UserError:
        return None


def _over_capacity(plan: Plan) -> bool:
    return any(b.headroom_gib < 0 for b in plan.memory.gpus + plan.memory.hosts)


def _best_of_shape(composed: Composed, shape: Knobs, base: Knobs, pinned: set[str]) -> Suggestion | None:
    """The best micro-batch and utilization for one placement, ZeRO, TP and sleep choice."""
    choices = set(PLACEMENTS[shape.placement].utilization_choices)
    utilizations = sorted(choices | ({base.utilization} if shape.placement == base.placement else set()))
    if "utilization" in pinned:
        utilizations = [base.utilization]
    batches = [(base.micro_batch, base.accumulation)] if "micro_batch" in pinned else list(_micro_batches(base))
    for micro_batch, accumulation in batches:
        found = []
        for utilization in utilizations:  # ascending: once over capacity, more utilization cannot help
            knobs = replace(shape, micro_batch=micro_batch, accumulation=accumulation, utilization=utilization)
            plan = _try(composed, knobs)
            if plan is None:
                break
            if plan.memory.fits:
                found.append(Suggestion(knobs, knobs.changes(base), plan, _score(knobs, plan, base)))
            elif _over_capacity(plan):
                break
        if found:
            return min(found, key=lambda s: s.score)
    return None


def _shapes(base: Knobs, config: Config, pinned: set[str]) -> Iterator[Knobs]:
    def choices(name: str, options) -> list:
        return [getattr(base, name)] if name in pinned else list(options)

    # Placements whose trainer takes the same TRL config: a layout change, not a change of algorithm.
    trainer = PLACEMENTS[base.placement].trainer_class
    placements = choices("placement", [p.name for p in PLACEMENTS.values() if p.trainer_class == trainer])
    tps = choices("tp", _tp_options(config))
    for placement, zero, tp in itertools.product(placements, ZERO_CHOICES, tps):
        for sleep in PLACEMENTS[placement].sleep_levels:
            knobs = replace(base, placement=placement, stage=zero[0], offload_optimizer=zero[1],
                            offload_param=zero[2], tp=tp, sleep_level=sleep)
            if all(getattr(knobs, n) == getattr(base, n) for n in pinned if n not in ("utilization", "micro_batch")):
                yield knobs


def _search(composed: Composed, plan: Plan, pinned: set[str], limit: int) -> list[Suggestion]:
    config = composed.config
    base = Knobs.of(config, plan)
    found = [s for shape in _shapes(base, config, pinned)
             if (s := _best_of_shape(composed, shape, base, pinned)) is not None]
    return sorted(found, key=lambda s: s.score)[:limit]


def advise(composed: Composed, plan: Plan, limit: int = 3) -> Advice:
    """The best `limit` layouts that fit, keeping the command line's choices if any layout allows it."""
    if not plan.device.gpus:
        return Advice((), skipped=f"the advisor searches GPU layouts; cluster.accelerator={plan.accelerator} has none")
    if plan.memory is None or not plan.memory.estimated:
        return Advice((), skipped="the model's size is unknown (see the memory note)")
    pinned = _pinned(composed.overrides)
    if not plan.vllm.enabled:  # the vLLM knobs change nothing
        pinned |= {"tp", "sleep_level", "utilization"}
    unranked = "" if plan.prediction is None or plan.prediction.predicted else \
        f"{plan.prediction.note}; ranked by fewer changes, then headroom"
    found = _search(composed, plan, pinned, limit)
    if found or not _pinned(composed.overrides):
        return Advice(tuple(found), unranked=unranked)
    found = _search(composed, plan, pinned - _pinned(composed.overrides), limit)
    base = Knobs.of(composed.config, plan)
    freed = tuple(o for o in composed.overrides
                  if any(getattr(s.knobs, k) != getattr(base, k) for s in found for k in _pinned((o,))))
    return Advice(tuple(found), freed, unranked=unranked)


def _misfit_lines(plan: Plan) -> list[str]:
    lines = []
    for budget in plan.memory.misfits:
        phase = budget.binding
        largest = sorted((c for c in phase.components if c.gib >= 1), key=lambda c: -c.gib)
        parts = ", ".join(f"{c.name} {c.gib:.1f}" for c in largest)
        kind = "GPU" if len(budget.members[0]) == 2 else "node"
        lines.append(f"  {budget.role} ({len(budget.members)} {kind}s), {phase.name}: {phase.total_gib:.1f} GiB of "
                     f"{budget.capacity_gib:g} GiB ({parts})")
        lines += [f"  {problem}" for problem in budget.problems]
    return lines


def check_fit(composed: Composed, plan: Plan, advice: Advice | None = None) -> None:
    """Raise `UserError` when the plan does not fit in memory, with the numbers and the advisor's suggestions."""
    if plan.memory is None or plan.memory.fits:
        return
    advice = advice or advise(composed, plan)
    message = "\n".join([f"{plan.recipe} does not fit in memory:", *_misfit_lines(plan)])
    if advice.suggestions:
        kept = f" (dropping {' '.join(advice.freed)})" if advice.freed else ""
        tries = "; ".join(shell_line(s.overrides) or "(as is)" for s in advice.suggestions)
        hint = f"layouts that fit{kept}, best first: {tries}. --suggest shows the tables; --force plans it anyway"
    else:
        hint = "no layout of this cluster fits by the estimate: add nodes or GPUs, or choose a smaller model; " \
               "--force plans it anyway"
    raise UserError(message, key="memory", hint=hint)

