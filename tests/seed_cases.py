"""The seeds' published comparisons, each built as its post set it up, and what the step-time model predicts for it.

The fit (benchmarks/fit_step_time.py) and the tests (test_step_time_seeds.py) share these cases; the table of
docs/performance-model.md is this module's `table()`. Where a post leaves a setting unstated, the case uses the
assumption the docs fix ("Assumptions"): the shipped recipes' data and lengths, per-device batches of 8, 16 and 32
for the batch sweeps (the smallest that a 7-rank server splits into whole groups of 8), the recipes' batch for the
TP sweeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from grpo_launch.compose import Composed, compose
from grpo_launch.contracts.performance import StepPrediction
from grpo_launch.estimate.accelerators import accelerator
from grpo_launch.estimate.step_time import StepModel
from grpo_launch.plan import build_plan
from grpo_launch.plan.model import resolve_model
from grpo_launch.plan.placements import placement_of

BATCHES = (8, 16, 32)          # the batch sweeps' per-device batches (assumption)
TPS = (1, 2, 4)                # the colocated TP sweeps
# The async post ran on H200s: a trainer Job of 2 GPUs and one Job per replica (a node of 2 + replicas GPUs here).
H200 = ("cluster.gpu_type=H200", "cluster.gpu_memory_gib=141")
RUN1 = ("recipe=qwen1.5b-async-lora-run1", *H200, "cluster.gpus_per_node=4", "placement.async_lora.replicas=2",
        "trainer.max_inflight_tasks=128")
RUN3 = ("recipe=qwen1.5b-async-lora", *H200, "cluster.gpus_per_node=4", "placement.async_lora.replicas=2",
        "trainer.max_inflight_tasks=128")
RUN4 = ("recipe=qwen1.5b-async-lora", *H200, "cluster.gpus_per_node=5", "placement.async_lora.replicas=3",
        "trainer.max_inflight_tasks=128")
RUN5 = ("recipe=qwen1.5b-async-lora", *H200, "cluster.gpus_per_node=5", "placement.async_lora.replicas=3",
        "trainer.max_inflight_tasks=384", "trainer.queue_maxsize=768")


@cache
def composed(*overrides: str) -> Composed:
    return compose(list(overrides))


def predict(*overrides: str) -> StepPrediction:
    """The plan's prediction under the step-time constants as they are now (the fit changes them)."""
    return build_plan(composed(*overrides)).prediction


def throughput(*overrides: str) -> float:
    """Completions per second of the whole layout."""
    p = predict(*overrides)
    return p.samples_per_step / p.step_s


def per_training_gpu(*overrides: str) -> float:
    """The colocate post's normalisation: throughput per trainer rank (its 8/7 for 8 ranks against 7)."""
    return throughput(*overrides) / build_plan(composed(*overrides)).world_size


def generation_rate(*overrides: str) -> float:
    """Tokens per second the plan's replicas decode at their in-flight concurrency."""
    c = composed(*overrides)
    plan = build_plan(c)
    model = StepModel(c.config, plan, resolve_model(c.config).resolved.shape, accelerator(c.config.cluster.gpu_type),
                      placement_of(c.config))
    in_flight = plan.batch.rollouts.max_inflight_tasks
    running = in_flight / len(plan.engines)
    return len(plan.engines) * running / model.decode_step_s(plan.vllm.tensor_parallel_size, running)


def colocate_over_server_15b(batch: int, tp: int = 1) -> float:
    """1.5B: colocate (8 ranks, vLLM in each) over server (7 ranks, 1 vLLM GPU), per training GPU."""
    per_device = f"trainer.per_device_train_batch_size={batch}"
    return per_training_gpu("recipe=qwen1.5b-colocate", per_device, f"vllm.tensor_parallel_size={tp}") / \
        per_training_gpu("recipe=qwen1.5b-server", per_device)


def colocate_over_server_7b(batch: int, accumulation: int, tp: int = 1) -> float:
    """7B: colocate (8 ranks) over server (7 ranks, 1 vLLM GPU at TP 1), per training GPU."""
    shape = (f"trainer.per_device_train_batch_size={batch}", f"trainer.gradient_accumulation_steps={accumulation}")
    return per_training_gpu("recipe=qwen7b-colocate", *shape, f"vllm.tensor_parallel_size={tp}") / \
        per_training_gpu("recipe=qwen7b-server", *shape, "vllm.tensor_parallel_size=1")


@dataclass(frozen=True)
class Case:
    name: str
    source: str                 # the post and where in it
    published: float
    predicted: Callable[[], float]
    role: str                   # "fit" or "held out"
    unit: str = "x"


@dataclass(frozen=True)
class Ordering:
    name: str
    source: str
    holds: Callable[[], bool]
    values: Callable[[], str]   # what the model predicts, for the table


CASES = (
    Case("1.5B colocate over server, largest batch (32)", "colocate post, experiment 1", 1.43,
         lambda: colocate_over_server_15b(BATCHES[-1]), "fit"),
    Case("async run 1, median step", "async post, scoreboard", 22.9,
         lambda: predict(*RUN1).median_step_s, "fit", "s"),
    Case("async run 5, median step", "async post, scoreboard", 4.8,
         lambda: predict(*RUN5).median_step_s, "fit", "s"),
    Case("async run 3, generation (2 replicas x 64 in flight)", "async post, run 3", 25_000,
         lambda: generation_rate(*RUN3), "fit", "tokens/s"),
    Case("7B colocate over server, best batch", "colocate post, experiment 3", 1.35,
         lambda: max(colocate_over_server_7b(b, 1) for b in BATCHES), "held out"),
    Case("7B colocate over server, best TP", "colocate post, experiment 4", 1.73,
         lambda: max(colocate_over_server_7b(4, 2, tp) for tp in TPS), "held out"),
    Case("72B colocate (32 GPUs) over server (32 + 4), whole layout", "colocate post, experiment 5", 1.26,
         lambda: throughput("recipe=qwen72b-colocate") / throughput("recipe=qwen72b-server"), "held out"),
    Case("async run 1 over run 5, median step", "async post, scoreboard", 22.9 / 4.8,
         lambda: predict(*RUN1).median_step_s / predict(*RUN5).median_step_s, "fit"),
    Case("async run 1 over run 5, wall clock of 500 steps", "async post, scoreboard (3 h 27 min, 53 min)",
         (3 * 60 + 27) / 53, lambda: predict(*RUN1).step_s / predict(*RUN5).step_s, "held out"),
    Case("async run 1, MFU (forward+backward)", "async post, scoreboard", 3.9,
         lambda: 100 * predict(*RUN1).mfu, "held out", "%"),
    Case("async run 5, MFU (forward+backward)", "async post, scoreboard", 23.5,
         lambda: 100 * predict(*RUN5).mfu, "held out", "%"),
    Case("async run 5 over run 1, MFU", "async post, scoreboard", 23.5 / 3.9,
         lambda: predict(*RUN5).mfu / predict(*RUN1).mfu, "held out"),
    Case("async run 5, samples per step", "async post, scoreboard", 168,
         lambda: predict(*RUN5).samples_per_step, "held out", "samples"),
    Case("async run 4, generation (3 replicas x 43 in flight)", "async post, run 4", 26_000,
         lambda: generation_rate(*RUN4), "held out", "tokens/s"),
)


def _rising(values: list[float]) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def _bottlenecks() -> str:
    return ", ".join(f"run {n}: {predict(*r).bottleneck.split(':')[0]}" for n, r in ((1, RUN1), (3, RUN3), (5, RUN5)))


ORDERINGS = (
    Ordering("1.5B: colocate's gain grows with the batch (8, 16, 32)", "colocate post, experiment 1",
             lambda: _rising([colocate_over_server_15b(b) for b in BATCHES]),
             lambda: _listed([colocate_over_server_15b(b) for b in BATCHES])),
    Ordering("1.5B: a larger colocated TP lowers throughput (TP 1, 2, 4)", "colocate post, experiment 2",
             lambda: _rising([-colocate_over_server_15b(8, tp) for tp in TPS]),
             lambda: _listed([colocate_over_server_15b(8, tp) for tp in TPS])),
    Ordering("7B: colocate's gain grows with the batch (8, 16, 32)", "colocate post, experiment 3",
             lambda: _rising([colocate_over_server_7b(b, 1) for b in BATCHES]),
             lambda: _listed([colocate_over_server_7b(b, 1) for b in BATCHES])),
    Ordering("7B: a larger colocated TP raises throughput (TP 1, 2, 4)", "colocate post, experiment 4",
             lambda: _rising([colocate_over_server_7b(4, 2, tp) for tp in TPS]),
             lambda: _listed([colocate_over_server_7b(4, 2, tp) for tp in TPS])),
    Ordering("72B: colocate on 32 GPUs beats server on 36", "colocate post, experiment 5",
             lambda: throughput("recipe=qwen72b-colocate") > throughput("recipe=qwen72b-server"),
             lambda: f"{throughput('recipe=qwen72b-colocate') / throughput('recipe=qwen72b-server'):.2f}"),
    Ordering("async: run 1 is trainer-bound, run 3 (checkpointing off) generation-bound, run 5 trainer-bound",
             "async post, runs 1, 3 and 5",
             lambda: [predict(*r).bottleneck.split(":")[0] for r in (RUN1, RUN3, RUN5)]
             == ["training", "generation", "training"], _bottlenecks),
)


def error(case: Case) -> float:
    return case.predicted() / case.published - 1


def table() -> str:
    """The fit/held-out table of docs/performance-model.md, in Markdown."""
    lines = ["| case | source | published | predicted | error | role |", "|---|---|---|---|---|---|"]
    for c in CASES:
        value = c.predicted()
        fmt = (lambda v: f"{v:,.0f}") if c.unit in ("tokens/s", "samples") else (lambda v: f"{v:.2f}")
        lines.append(f"| {c.name} | {c.source} | {fmt(c.published)} {c.unit} | {fmt(value)} {c.unit} | "
                     f"{value / c.published - 1:+.0%} | {c.role} |")
    lines += ["", "| ordering | source | predicted | holds |", "|---|---|---|---|"]
    lines += [f"| {o.name} | {o.source} | {o.values()} | {'yes' if o.holds() else 'NO'} |" for o in ORDERINGS]
    return "\n".join(lines)
