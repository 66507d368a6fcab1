"""Several runs side by side: whether they are comparable, ratios against the first, and reward parity.

Comparable: the same task (the data the prompts come from and how they are put) and the same rewards. Recipes,
placements, layouts, step counts and seeds may differ: that is what a comparison is for. Anything else is refused
with the difference named.

Parity is Welch's t-test on the last quarter's mean rewards (two-sided, 5% level, Welch-Satterthwaite degrees of
freedom): the difference of the two layouts' means against its standard error, from the spread of the independent
draws each layout has. Runs of one layout (the same recipe and overrides but the seed) are repeats:
- with at least two runs on each side, each run's last-quarter mean is one draw, so the spread is between seeds (a
  seed's whole trajectory is one draw: its steps are not independent of each other);
- with one run on a side, each step of the last quarter is a draw, so the spread is the run's own step-to-step
  spread. Steps are not independent (a reward still rising shows as a difference), which more seeds fix.
"No difference found" is not proof of equality: the 95% interval of the difference says how large a difference the
runs could have hidden.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.errors import UserError
from grpo_launch.report.summary import Report

LEVEL = 0.05            # the test's level: the usual 5%, two-sided
STATISTIC = ("Welch's t-test on the last quarter's mean rewards, a draw per seed (per step with one run a side); "
             "two-sided, 5%")
TASK_FIELDS = ("source", "path", "config", "split", "prompt_column", "answer_column", "system_prompt")
# overrides that do not change a layout (runs differing only in them are repeats), and the recipe, named already;
# nor do the ports a run listens on (vllm.port, placement.async_lora.proxy.port, vllm.group_port)
LAYOUT_FREE = ("seed=", "run.", "recipe=")
PORT_KEY = re.compile(r"^[\w.]*[._]port=")


def task_of(report: Report) -> dict[str, Any]:
    inputs = report.run.plan.trainer_inputs
    task = {f"data.{f}": getattr(inputs.data, f) for f in TASK_FIELDS}
    task["chat prompts"] = inputs.chat_prompts
    task["rewards"] = sorted((r.fn, r.weight) for r in inputs.rewards)
    return task


def check_comparable(reports: list[Report]) -> None:
    """A `UserError` naming every run whose task or rewards differ from the first run's, and how."""
    first = task_of(reports[0])
    problems = []
    for report in reports[1:]:
        task = task_of(report)
        diff = [f"{k}: {first[k]!r} vs {task[k]!r}" for k in first if first[k] != task[k]]
        if diff:
            problems.append(f"{report.run.name} is not comparable with {reports[0].run.name}: a different task or "
                            f"reward ({'; '.join(diff)})")
    if problems:
        raise UserError("\n  ".join(problems), key="RUN_DIR",
                        hint="compare runs of the same task and rewards (recipes, placements and seeds may differ)")


def layout_of(report: Report) -> tuple[str, tuple[str, ...]]:
    return report.run.plan.recipe, tuple(o for o in report.run.overrides
                                         if not o.startswith(LAYOUT_FREE) and not PORT_KEY.match(o))


# -- ratios --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    label: str
    value: float | None
    how: str = ""                              # how it was normalised, from the two plans


def time_to_samples(report: Report, samples: float) -> float | None:
    """Seconds of training until `samples` had been trained (interpolated within the step that crossed it)."""
    done = elapsed = 0.0
    for record in report.run.measures:
        step_samples = record.get(m.SAMPLES_TRAINED) or 0
        if step_samples and done + step_samples >= samples:
            return elapsed + record[m.STEP_S] * (samples - done) / step_samples
        done += step_samples
        elapsed += record[m.STEP_S]
    return None


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(first: Report, other: Report) -> list[Ratio]:
    """`other` against `first`, in the seeds' terms (above 1: `other` is faster, except for times)."""
    u0, u1 = first.units, other.units
    out = [
        Ratio(f"throughput per training {u0.name} (completions/s)",
              _over(other.completion_rate(u1.training), first.completion_rate(u0.training)),
              f"the whole layouts' ratio x {u0.training}/{u1.training} ({u1.training} vs {u0.training} training "
              f"{u0.plural})"),
        Ratio(f"throughput per {u0.name} held (completions/s)",
              _over(other.completion_rate(u1.held), first.completion_rate(u0.held)),
              f"the whole layouts' ratio x {u0.held}/{u1.held} ({u1.held} vs {u0.held} {u0.plural} held)"),
        Ratio("throughput of the whole layout (completions/s)",
              _over(other.completion_rate(1), first.completion_rate(1))),
        Ratio("median step time", _over(other.median_step_s, first.median_step_s)),
    ]
    samples = min(first.samples_trained, other.samples_trained)
    out.append(Ratio(f"wall time for the same {samples:,} samples",
                     _over(time_to_samples(other, samples), time_to_samples(first, samples)) if samples else None))
    return out


# -- parity --------------------------------------------------------------------------------------------------------
def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-14
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for k in range(1, 500):
        for numerator in (k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k)),
                          -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    return incomplete_beta(df / 2, 0.5, df / (df + t * t))


def t_critical(df: float, level: float = LEVEL) -> float:
    """The |t| whose two-sided tail is `level` (bisection on the tail)."""
    low, high = 0.0, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided_p(mid, df) > level else (low, mid)
    return (low + high) / 2


def _mean_var(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values) / (len(values) - 1)


@dataclass(frozen=True)
class Parity:
    first: str
    other: str
    unit: str                                  # what one draw is: "run" (a seed's last quarter) or "step"
    n: tuple[int, int]                         # draws on each side
    means: tuple[float, float]
    difference: float | None                   # other - first
    half_width: float | None                   # of the 95% interval of the difference
    t: float | None
    df: float | None
    p: float | None

    @property
    def verdict(self) -> str:
        if self.p is None:
            return "too few steps to test (at least 2 in each last quarter)"
        if self.p < LEVEL:
            return "different"
        return "parity (no difference found)"

    def __str__(self) -> str:
        if self.p is None:
            return f"{self.other} vs {self.first}: {self.verdict}"
        return (f"{self.other} vs {self.first}: last-quarter mean reward {self.means[1]:.3f} vs {self.means[0]:.3f} "
                f"({self.n[1]} vs {self.n[0]} {self.unit}s), difference {self.difference:+.3f} (95% interval "
                f"+/-{self.half_width:.3f}), t = {self.t:.2f}, df = {self.df:.1f}, p = {self.p:.2f}: {self.verdict}")

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "other": self.other, "statistic": STATISTIC, "unit": self.unit, "n": list(self.n),
                "means": list(self.means), "difference": self.difference, "half_width_95": self.half_width,
                "t": self.t, "df": self.df, "p": self.p, "verdict": self.verdict}


def last_quarter(report: Report) -> list[float]:
    rewards = [r for _, r in report.rewards]
    return rewards[-max(1, len(rewards) // 4):] if rewards else []


def draws(first: list[Report], other: list[Report]) -> tuple[str, list[float], list[float]]:
    """What parity tests: each run's last-quarter mean when both sides have repeats, else each last-quarter step."""
    if len(first) >= 2 and len(other) >= 2:
        def mean(r: Report) -> float:
            return sum(last_quarter(r)) / len(last_quarter(r))

        return "run", [mean(r) for r in first if r.rewards], [mean(r) for r in other if r.rewards]
    return "step", [v for r in first for v in last_quarter(r)], [v for r in other for v in last_quarter(r)]


def parity(first: list[Report], other: list[Report], labels: tuple[str, str]) -> Parity:
    """Welch's t-test of `other`'s last-quarter rewards against `first`'s (`draws` says which)."""
    unit, a, b = draws(first, other)
    means = (sum(a) / len(a) if a else math.nan, sum(b) / len(b) if b else math.nan)
    labels = (*labels, unit)
    if len(a) < 2 or len(b) < 2:
        return Parity(*labels, (len(a), len(b)), means, None, None, None, None, None)
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    ea, eb = va / len(a), vb / len(b)
    se = math.sqrt(ea + eb)
    diff = mb - ma
    if se == 0:
        same = diff == 0
        return Parity(*labels, (len(a), len(b)), (ma, mb), diff, 0.0, 0.0 if same else math.inf, math.inf,
                      1.0 if same else 0.0)
    df = (ea + eb) ** 2 / ((ea ** 2 / (len(a) - 1) if ea else 0) + (eb ** 2 / (len(b) - 1) if eb else 0))
    t = diff / se
    return Parity(*labels, (len(a), len(b)), (ma, mb), diff, t_critical(df) * se, t, df, t_two_sided_p(t, df))


@dataclass(frozen=True)
class Comparison:
    reports: list[Report]
    ratios: list[list[Ratio]]                  # per run after the first, against the first
    groups: list[tuple[str, list[Report]]]     # runs of one layout (repeats with other seeds), first group first
    parity: list[Parity]                       # each group against the first group

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.reports],
                "ratios_against_first": [{"run": r.run.name, "ratios": [{"label": x.label, "value": x.value,
                                                                        "how": x.how} for x in rs]}
                                         for r, rs in zip(self.reports[1:], self.ratios, strict=True)],
                "groups": [{"layout": name, "runs": [r.run.name for r in members]} for name, members in self.groups],
                "parity": [p.to_json() for p in self.parity]}


def compare(reports: list[Report]) -> Comparison:
    check_comparable(reports)
    groups: dict[tuple, list[Report]] = {}
    for report in reports:
        groups.setdefault(layout_of(report), []).append(report)
    named = [(" ".join((recipe, *overrides)), members) for (recipe, overrides), members in groups.items()]
    first_name, first = named[0]
    return Comparison(reports, [ratios(reports[0], r) for r in reports[1:]], named,
                      [parity(first, members, (first_name, name)) for name, members in named[1:]])
