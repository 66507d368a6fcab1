"""The step-time prediction's data: plain, frozen, JSON-renderable; built by `estimate.step_time` (each placement
combines the phases its own way), carried in the `Plan` (and so in plan.json), read back by whatever compares it with
a run's measured phases.

One optimizer step on the trainer's clock, split into the phases the trainer measures (`contracts.phases`,
`PREDICTED`): generate (the trainer's generate call, or for a placement that generates beside the trainer the
replicas' busy time for one step's samples), sync (trained weights or an adapter reaching vLLM, averaged over the
steps between syncs), train (forward, backward and the optimizer step) and wait (the trainer idle for rollouts).
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_launch.contracts.phases import Phase


@dataclass(frozen=True)
class PhaseTime:
    name: Phase                                # one of phases.PREDICTED
    seconds: float                             # per optimizer step (a sync every k steps counts 1/k)
    on_trainer_clock: bool = True              # False: runs beside the trainer's step (async generation)
    detail: str = ""                           # how it was computed, in words


@dataclass(frozen=True)
class StepPrediction:
    """What one optimizer step takes on the plan's GPUs, and what the recipe's run then costs. `step_s` is None
    when nothing is predicted (a CPU, a GPU type or model the tables do not know); `note` says why."""

    note: str                                  # why nothing is predicted, or "" when it is
    accelerator: str | None = None             # the row of estimate.accelerators used
    phases: tuple[PhaseTime, ...] = ()
    step_s: float | None = None                # mean step, syncs averaged in: what wall time and GPU-hours use
    median_step_s: float | None = None         # a step without a sync (syncs every k >= 2 steps), as logs' p50 shows
    bottleneck: str = ""                       # the phase that sets the step time, in words
    samples_per_step: float | None = None      # completions trained per optimizer step (token budgets: mean)
    gpus_held: int = 0                         # every GPU of the cluster, idle ones included: what is paid for
    gpus_in_use: int = 0                       # trainer and vLLM GPUs
    mfu: float | None = None                   # model FLOPs / (forward+backward time x trainer GPUs x peak), 0..1
    max_steps: int | None = None               # the recipe's trainer.max_steps; None: unbounded
    gpu_hour_price: float | None = None        # cluster.gpu_hour_price
    assumptions: tuple[str, ...] = ()          # the workload the numbers assume (lengths, ...)

    @property
    def predicted(self) -> bool:
        return self.step_s is not None

    @property
    def samples_per_hour_per_gpu(self) -> float | None:
        """Completions trained per hour per GPU held."""
        if self.step_s is None or not self.samples_per_step or not self.gpus_held:
            return None
        return 3600 * self.samples_per_step / self.step_s / self.gpus_held

    @property
    def run_hours(self) -> float | None:
        """Wall time of `max_steps` steps."""
        return None if self.step_s is None or self.max_steps is None else self.step_s * self.max_steps / 3600

    @property
    def gpu_hours(self) -> float | None:
        hours = self.run_hours
        return None if hours is None else hours * self.gpus_held

    @property
    def cost(self) -> float | None:
        hours = self.gpu_hours
        return None if hours is None or self.gpu_hour_price is None else hours * self.gpu_hour_price

    def phase(self, name: Phase) -> PhaseTime | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_json(self) -> dict:
        return {"predicted": self.predicted, "note": self.note, "accelerator": self.accelerator,
                "phases": [{"name": p.name, "seconds": round(p.seconds, 4), "on_trainer_clock": p.on_trainer_clock,
                            "detail": p.detail} for p in self.phases],
                "step_s": _rounded(self.step_s), "median_step_s": _rounded(self.median_step_s),
                "bottleneck": self.bottleneck, "samples_per_step": _rounded(self.samples_per_step),
                "gpus_held": self.gpus_held, "gpus_in_use": self.gpus_in_use, "mfu": _rounded(self.mfu),
                "max_steps": self.max_steps, "gpu_hour_price": self.gpu_hour_price,
                "assumptions": list(self.assumptions),
                "samples_per_hour_per_gpu": _rounded(self.samples_per_hour_per_gpu),
                "run_hours": _rounded(self.run_hours), "gpu_hours": _rounded(self.gpu_hours),
                "cost": _rounded(self.cost)}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
