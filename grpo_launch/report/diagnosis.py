"""The bottleneck in plain words, from the measured phase split, with the knob that moves it and its value now.

The rule (docs/report.md says it for users):
- A run that overlaps generation and training (async-lora: it measured staleness) is generation-bound ("async
  starved") when its trainer waited for rollouts longer than it worked (trained, synced, scored), else
  trainer-bound. Two measured shares are compared: no threshold.
- A synchronous run does its phases one after another, so the step is their sum and the largest phase bounds what
  shrinking any other can win (Amdahl): the largest of generate, score, sync, train and wait is the bottleneck.
- Then the knobs the seeds moved, each said only where its condition holds: gradient checkpointing on while the
  trainer is the bottleneck (the async post turned it off for its 1.5B model: the forward is no longer computed
  twice), micro-batches of one sequence without a token budget (token-budget batching raised MFU 5x in the async
  post), generation on GPUs of its own while the trainer waits for it (the colocate post's ping-pong).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_launch.contracts.phases import SEQUENTIAL, Phase
from grpo_launch.report.summary import Report


@dataclass(frozen=True)
class Finding:
    kind: str                                  # generation-bound, trainer-bound, async starved, ...
    text: str
    knob: str | None = None                    # the recipe key that moves it
    value: Any = None                          # its value in this run

    def __str__(self) -> str:
        knob = f" [{self.knob} = {self.value}]" if self.knob else ""
        return f"{self.kind}: {self.text}{knob}"


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def _trainer_knobs(report: Report) -> list[Finding]:
    plan = report.run.plan
    rollouts = plan.batch.rollouts
    token_budget = rollouts.token_budget if rollouts is not None else None  # only AsyncGRPOTrainer packs to one
    found = []
    if plan.trainer_facts.gradient_checkpointing:
        found.append(Finding("trainer-bound", "gradient checkpointing is on: the backward pass computes the forward "
                                              "again; the async post turned it off for its 1.5B model",
                             "trainer.gradient_checkpointing", True))
    if plan.batch.per_device_train_batch_size == 1 and not token_budget:
        # AsyncGRPOTrainer packs sequences up to a token budget; GRPOTrainer takes a larger micro-batch instead
        overlapped = report.staleness_mean is not None
        found.append(Finding("trainer-bound", "micro-batches of one sequence: token-budget batching (packing "
                                              "sequences up to a token budget) raised MFU 5x in the async post",
                             "trainer.token_budget" if overlapped else "trainer.per_device_train_batch_size",
                             token_budget if overlapped else 1))
    return found


def diagnose(report: Report) -> list[Finding]:
    """The bottleneck first, then the knobs that move it."""
    share = report.phase_share
    if not report.run.measures:
        return []
    if report.staleness_mean is not None:  # generation overlaps training
        waited, worked = share[Phase.WAIT], share[Phase.TRAIN] + share[Phase.SYNC] + share[Phase.SCORE]
        if waited > worked:
            inflight = report.run.plan.batch.rollouts.max_inflight_tasks
            inflight = "automatic (TRL's default)" if inflight == -1 else inflight
            return [Finding("async starved", f"the trainer waited for rollouts {_percent(waited)} of the step and "
                                             f"worked {_percent(worked)}: generation is the bottleneck; more "
                                             f"requests in flight keep the replicas busy (the async post raised "
                                             f"it to 384)", "trainer.max_inflight_tasks", inflight),
                    Finding("async starved", "once the replicas are busy, more replicas generate more",
                            "placement.async_lora.replicas", report.run.plan.vllm.data_parallel_size)]
        return [Finding("trainer-bound", f"the trainer worked {_percent(worked)} of the step and waited for "
                                         f"rollouts {_percent(waited)}: generation keeps up, training is the "
                                         f"bottleneck")] + _trainer_knobs(report)
    phases = {p: share[p] for p in SEQUENTIAL}
    worst = max(phases, key=phases.get)
    part = _percent(phases[worst])
    plan = report.run.plan
    if worst == Phase.GENERATE:
        if not plan.vllm.enabled:
            return [Finding("generation-bound", f"generation took {part} of the step, with transformers' generate "
                                                "inside the trainer; vLLM generates faster", "vllm.enabled", False)]
        apart = any(not e.ranks for e in plan.engines)
        if apart:
            return [Finding("generation-bound", f"generation took {part} of the step while the trainer ranks waited "
                                                "for the server (the colocate post's ping-pong): colocating vLLM "
                                                "in the trainer ranks lets every GPU generate and train in turn",
                            "placement", plan.placement),
                    Finding("generation-bound", "GPUs of each vLLM engine", "vllm.tensor_parallel_size",
                            plan.vllm.tensor_parallel_size)]
        return [Finding("generation-bound", f"generation took {part} of the step: a larger tensor-parallel size "
                                            "helped at 7B in the colocate post (up to 1.73x) and hurt at 1.5B",
                        "vllm.tensor_parallel_size", plan.vllm.tensor_parallel_size)]
    if worst == Phase.TRAIN:
        return [Finding("trainer-bound", f"forward, backward and optimizer took {part} of the step")] \
            + _trainer_knobs(report)
    if worst == Phase.SYNC:
        return [Finding("sync-bound", f"moving weights into vLLM took {part} of the step"
                        + (" (sleep level 2 wakes vLLM and reloads its weights every step)"
                           if plan.vllm.sleep_level else ""),
                        "placement.colocate.sleep_level", plan.vllm.sleep_level)]
    if worst == Phase.SCORE:
        return [Finding("scoring-bound", f"rewards and log-probabilities took {part} of the step: a slow reward "
                                         "function, or the reference model's log-probabilities (beta > 0)",
                        "trainer.beta", plan.trainer_facts.beta)]
    return [Finding("wait-bound", f"ranks waited for each other {part} of the step: their generation times differ "
                                  "(uneven completion lengths); larger per-rank batches even them out",
                    "trainer.per_device_train_batch_size", plan.batch.per_device_train_batch_size)]
