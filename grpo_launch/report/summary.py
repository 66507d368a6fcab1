"""One run's numbers in the seeds' terms, from its plan and its measure records.

Throughput comes in two normalisations, each named wherever it shows:
- per training GPU: divided by the GPUs that run trainer ranks (the colocate post's: a server run that gives 1 of
  8 GPUs to vLLM is divided by 7);
- per GPU held: divided by every GPU the plan holds, vLLM's and idle ones included (what a user pays for).
On a CPU run there are no GPUs: the unit is the run's CPU process (a trainer rank, a vLLM server or replica, a
process slot left idle), and every label says so. MFU needs the accelerator's peak (`estimate.accelerators`): "n/a"
on a CPU or an unknown GPU.

Rates, the phase split and MFU are the steady state's: the steps after the first, which carries one-time costs
(vLLM's first forward passes, allocator and cache warm-up: on a CPU it takes as long as ten later steps). Wall
times, the median step time and the counts cover every step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.performance import StepPrediction
from grpo_launch.contracts.phases import Phase
from grpo_launch.estimate.accelerators import accelerator
from grpo_launch.report.run import RunData


def quarters(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of the values."""
    n = max(1, len(values) // 4)
    return sum(values[:n]) / n, sum(values[-n:]) / n


@dataclass(frozen=True)
class Units:
    """What throughput is divided by, from the plan."""

    name: str                                  # "GPU", or "CPU process"
    training: int                              # running trainer ranks
    in_use: int                                # running anything (trainer ranks, vLLM)
    held: int                                  # every GPU (process slot) the plan holds

    @property
    def plural(self) -> str:
        return f"{self.name}s" if self.name == "GPU" else self.name.replace("process", "processes")


def units_of(run: RunData) -> Units:
    plan = run.plan
    used = sum(1 for node in plan.gpu_map for cell in node if cell != "idle")
    return Units(plan.device.slot, plan.world_size, used, plan.nodes * plan.gpus_per_node)


def _sum(records: list[dict[str, Any]], key: str) -> float:
    return sum(r.get(key) or 0 for r in records)


def _fallback(run: RunData, key: str) -> list[float]:
    """AsyncGRPOTrainer's own key for a quantity we did not measure (its records, every logging step)."""
    trl_key = m.TRL_FALLBACKS.get(key)
    return [r[trl_key] for r in run.training if trl_key and r.get(trl_key) is not None]


@dataclass(frozen=True)
class Report:
    run: RunData
    units: Units
    steps: int
    wall_s: float | None                       # the measured steps: the first's start to the last's end
    run_wall_s: float | None                   # the run directory written to the last record
    median_step_s: float | None
    completions: int
    prompt_tokens: int
    completion_tokens: int
    samples_trained: int
    steady_steps: tuple[int, int] | None      # the first and last step of the steady state
    steady_s: float                            # its wall time
    steady_completions: int
    steady_tokens: int
    phase_s: dict[Phase, float]                # seconds in the steady state, mean over ranks
    mfu: float | None                          # percent, over the train phase
    mfu_wall: float | None                     # percent, over the whole step
    staleness_mean: float | None
    staleness_max: float | None
    rewards: list[tuple[int, float]]
    evals: list[tuple[int, float]]
    peak_tflops: float | None

    # -- derived -------------------------------------------------------------------------------------------------
    @property
    def phase_share(self) -> dict[Phase, float]:
        total = sum(self.phase_s.values())
        return {p: (s / total if total else 0.0) for p, s in self.phase_s.items()}

    def rate(self, count: float, per: int) -> float | None:
        """A steady-state count per second and per unit."""
        return count / self.steady_s / per if self.steady_s and per else None

    def completion_rate(self, per: int) -> float | None:
        return self.rate(self.steady_completions, per)

    def token_rate(self, per: int) -> float | None:
        return self.rate(self.steady_tokens, per)

    @property
    def final_reward(self) -> float | None:
        return self.rewards[-1][1] if self.rewards else None

    @property
    def best_reward(self) -> float | None:
        return max(r for _, r in self.rewards) if self.rewards else None

    @property
    def last_quarter_reward(self) -> float | None:
        return quarters([r for _, r in self.rewards])[1] if self.rewards else None

    def to_json(self) -> dict[str, Any]:
        u = self.units
        return {
            "run_dir": str(self.run.path), "recipe": self.run.plan.recipe, "placement": self.run.plan.placement,
            "seed": self.run.seed, "state": self.run.state, "steps": self.steps, "max_steps": self.run.max_steps,
            "wall_s": self.wall_s, "run_wall_s": self.run_wall_s, "median_step_s": self.median_step_s,
            "unit": u.name, "units": {"training": u.training, "in_use": u.in_use, "held": u.held},
            "completions": self.completions, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "samples_trained": self.samples_trained,
            "steady_steps": self.steady_steps,
            "completions_per_s": {"per_training_unit": self.completion_rate(u.training),
                                  "per_unit_held": self.completion_rate(u.held), "total": self.completion_rate(1)},
            "tokens_per_s": {"per_training_unit": self.token_rate(u.training),
                             "per_unit_held": self.token_rate(u.held), "total": self.token_rate(1)},
            "phase_s": self.phase_s, "phase_share": self.phase_share,
            "mfu_percent": self.mfu, "mfu_wall_percent": self.mfu_wall, "peak_tflops": self.peak_tflops,
            "staleness_mean": self.staleness_mean, "staleness_max": self.staleness_max,
            "reward_final": self.final_reward, "reward_best": self.best_reward,
            "reward_last_quarter": self.last_quarter_reward,
            "eval_final": self.evals[-1][1] if self.evals else None,
            "eval_best": max(v for _, v in self.evals) if self.evals else None,
            "rewards": self.rewards, "evals": self.evals, "metrics_unreadable_lines": self.run.bad_lines,
            "predicted": self.run.plan.prediction.to_json() if self.run.plan.prediction else None,
        }


def steady(measures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps after the first (which carries one-time costs); the only one when there is one."""
    return measures[1:] if len(measures) > 1 else measures


def summarize(run: RunData) -> Report:
    measures = run.measures
    settled = steady(measures)
    units = units_of(run)
    step_times = [r[m.STEP_S] for r in measures]
    wall = sum(step_times) if step_times else None
    steady_s = _sum(settled, m.STEP_S)
    ended = max([r["time"] for r in run.training + run.measures], default=None)
    phase_s = {p: _sum(settled, p.key) for p in Phase}
    row = accelerator(run.plan.gpu_type) if run.plan.device.gpus else None
    peak = row.peak_bf16_tflops if row else None
    flops = _sum(settled, m.TRAIN_FLOPS)
    mfu = mfu_wall = None
    if peak and flops:
        train_s = phase_s[Phase.TRAIN]
        mfu = 100 * flops / (train_s * units.training * peak * 1e12) if train_s else None
        mfu_wall = 100 * flops / (steady_s * units.training * peak * 1e12) if steady_s else None
    elif peak and (trl := [r[m.TRL_MFU] for r in run.training if r.get(m.TRL_MFU) is not None]):
        mfu = statistics.median(trl)
    samples = int(_sum(measures, m.SAMPLES_TRAINED)) or int(sum(_fallback(run, m.SAMPLES_TRAINED)))
    staleness = [r[m.STALENESS_MEAN] for r in measures if m.STALENESS_MEAN in r] or _fallback(run, m.STALENESS_MEAN)
    worst = [r[m.STALENESS_MAX] for r in measures if m.STALENESS_MAX in r] or _fallback(run, m.STALENESS_MAX)
    completions = int(_sum(measures, m.COMPLETIONS))
    return Report(
        run=run, units=units, steps=run.steps, wall_s=wall,
        run_wall_s=(ended - run.started) if ended and run.started else None,
        median_step_s=statistics.median(step_times) if step_times else None,
        completions=completions or samples,
        prompt_tokens=int(_sum(measures, m.PROMPT_TOKENS)), completion_tokens=int(_sum(measures, m.COMPLETION_TOKENS)),
        samples_trained=samples,
        steady_steps=(settled[0]["step"], settled[-1]["step"]) if settled else None, steady_s=steady_s,
        steady_completions=int(_sum(settled, m.COMPLETIONS) if completions else _sum(settled, m.SAMPLES_TRAINED)),
        steady_tokens=int(_sum(settled, m.PROMPT_TOKENS) + _sum(settled, m.COMPLETION_TOKENS)),
        phase_s=phase_s, mfu=mfu, mfu_wall=mfu_wall,
        staleness_mean=sum(staleness) / len(staleness) if staleness else None,
        staleness_max=max(worst) if worst else None,
        rewards=[(r["step"], r[m.REWARD]) for r in run.training if r.get(m.REWARD) is not None],
        evals=[(r["step"], r[m.EVAL_REWARD]) for r in run.evals], peak_tflops=peak)


# -- the table -----------------------------------------------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass(frozen=True)
class Row:
    key: str                                   # stable: a prediction's column fills the same keys
    label: str
    value: str


def rows(report: Report) -> list[Row]:
    """The report's table, a row per measure, in the seeds' terms; `key` names each row for other columns."""
    u = report.units
    run = report.run
    steps = f"{report.steps}" + (f" of {run.max_steps}" if run.max_steps else "")
    settled = report.steady_steps
    out = [
        Row("state", "state", run.state),
        *([Row("unreadable", "metrics.jsonl lines unreadable (skipped)", f"{run.bad_lines}")] if run.bad_lines else []),
        Row("steps", "steps", steps),
        Row("wall_s", "wall time (training steps)", _duration(report.wall_s)),
        Row("run_wall_s", "wall time (start to last record)", _duration(report.run_wall_s)),
        Row("median_step_s", "median step time", _duration(report.median_step_s)),
        Row("units", f"{u.plural}: training / in use / held", f"{u.training} / {u.in_use} / {u.held}"),
        Row("steady", "steady state (after the first step)",
            f"steps {settled[0]}-{settled[1]}" if settled else "-"),
        Row("completions_per_s_training", f"  completions/s per training {u.name}",
            _number(report.completion_rate(u.training))),
        Row("completions_per_s_held", f"  completions/s per {u.name} held", _number(report.completion_rate(u.held))),
        Row("tokens_per_s_training", f"  tokens/s (prompt + completion) per training {u.name}",
            _number(report.token_rate(u.training))),
        Row("tokens_per_s_held", f"  tokens/s (prompt + completion) per {u.name} held",
            _number(report.token_rate(u.held))),
        Row("phase", "  phase split (share of step time):", ""),
    ]
    share = report.phase_share
    for phase in Phase:
        if report.phase_s[phase]:
            out.append(Row(f"phase/{phase}", f"    {phase}", f"{100 * share[phase]:.1f}%"))
    mfu = "n/a (a CPU)" if not run.plan.device.gpus else \
        "n/a (unknown GPU type)" if report.peak_tflops is None else \
        f"{report.mfu:.1f}%" if report.mfu is not None else "-"
    out.append(Row("mfu", "  MFU (train phase)", mfu))
    out.append(Row("samples_trained", "samples trained", f"{report.samples_trained:,}"))
    if report.staleness_mean is not None:
        out.append(Row("staleness", "staleness: mean / max (versions)",
                       f"{report.staleness_mean:.2f} / {report.staleness_max:g}"))
    out.append(Row("reward_final", "reward: final / best", f"{_number(report.final_reward)} / "
                                                          f"{_number(report.best_reward)}"))
    out.append(Row("reward_last_quarter", "reward: mean of the last quarter", _number(report.last_quarter_reward)))
    if report.evals:
        out.append(Row("eval_reward", "eval reward: final / best (steps)",
                       f"{_number(report.evals[-1][1])} / {_number(max(v for _, v in report.evals))} "
                       f"({', '.join(str(s) for s, _ in report.evals)})"))
    return out


def predicted_rows(p: StepPrediction) -> list[Row]:
    """The plan's prediction over the report's row keys: step time, phase split and MFU. A phase that runs beside
    the trainer's step (async generation) shows its seconds, not a share of the step."""
    out = [Row("median_step_s", "median step time", _duration(p.median_step_s or p.step_s))]
    for phase in p.phases:  # shares of the mean step (syncs averaged in), so that they add up as measured ones do
        value = f"{100 * phase.seconds / p.step_s:.1f}%" if phase.on_trainer_clock and p.step_s else \
            f"beside: {_duration(phase.seconds)}"
        out.append(Row(f"phase/{phase.name}", f"    {phase.name}", value))
    out.append(Row("mfu", "  MFU (train phase)", "-" if p.mfu is None else f"{100 * p.mfu:.1f}%"))
    return out
