"""The report's pictures: the reward curve, the phase timeline, the eval curve, and compare's overlaid reward curves;
and `CurvePlotter`, which draws a run's pictures as its trainer closes.

The timeline has a row per trainer rank (what its measure records say it did, phase by phase) and a row per vLLM
engine, derived from the ranks' marks, not measured on the engine:
- an engine inside trainer ranks (colocate) generates and takes weights exactly when its first rank does;
- a server engine generates while trainer rank 0 waits on its answers and reloads weights while rank 0 syncs, and
  is idle otherwise (the colocate post's ping-pong);
- an async replica is paused for the adapter load while the trainer publishes; when it generates otherwise is not
  seen by the trainer, and the row says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.plan import Engine
from grpo_launch.contracts.rundir import CURVES_FILE, EVAL_FILE, TIMELINE_FILE, MetricsTail, read_metrics
from grpo_launch.report.run import RunData
from grpo_launch.report.summary import steady

COLORS = {Phase.GENERATE: "#4c78a8", Phase.SCORE: "#72b7b2", Phase.SYNC: "#b279a2", Phase.TRAIN: "#f58518",
          Phase.WAIT: "#e45756", Phase.EVAL: "#54a24b", Phase.SAVE: "#9d755d", Phase.OTHER: "#bab0ac"}
UNSEEN = "#eeeeee"
UNSEEN_NOTE = ("replicas: sync = paused while the trainer publishes an adapter version; hatched = generating or idle, "
               "which the trainer does not see")
# What a vLLM engine's row shows, from the trainer ranks' marks: when it generates and when it takes weights.
ENGINE_PHASES = (Phase.GENERATE, Phase.SYNC)
CURVE_PANELS = ((m.REWARD, "mean reward"), (m.LOSS, "loss"), ("kl", "KL to reference"),
                ("completions/mean_length", "completion length (tokens)"))
POLL_S = 0.25   # how often CurvePlotter looks for the trainer's closing record
# A step needs about a centimetre to show its phases: a longer run shows its last steps (its steady state).
TIMELINE_STEPS = 24


def _merged(segments: list[list], phases: tuple[Phase, ...]) -> list[tuple[float, float]]:
    """(start, width) of the segments of `phases`, adjacent ones joined."""
    out: list[list[float]] = []
    for phase, start, end in segments:
        if phase not in phases:
            continue
        if out and start - out[-1][1] < m.SEGMENT_S:
            out[-1][1] = end
        else:
            out.append([start, end])
    return [(a, b - a) for a, b in out]


def _engine_rows(engine: Engine, by_rank: dict[int, list[list]], overlapped: bool) -> tuple[str, list[tuple]]:
    """(label, [(phase, segments)]) of a vLLM engine, from the trainer ranks' marks (see the module's note)."""
    if engine.ranks:
        source = by_rank.get(engine.ranks[0], [])
        label = f"vLLM {engine.index} (in rank{'s' if len(engine.ranks) > 1 else ''} " \
                f"{','.join(map(str, engine.ranks))})"
        return label, [(p, _merged(source, (p,))) for p in ENGINE_PHASES]
    source = by_rank.get(0, [])
    if overlapped:
        return f"{engine.process} (replica)", [(Phase.SYNC, _merged(source, (Phase.SYNC,)))]
    return f"{engine.process} (server)", [(p, _merged(source, (p,))) for p in ENGINE_PHASES]


def draw_timeline(run: RunData, title: str) -> Path | None:
    records = steady(run.measures)[-TIMELINE_STEPS:]
    timelines = run.timelines()
    if not records or not timelines:
        return None
    steps = [r["step"] for r in records]
    by_rank = {rank: [s for step in steps for s in by_step.get(step, [])] for rank, by_step in timelines.items()}
    t0 = records[0]["time"] - records[0][m.STEP_S]
    overlapped = any(m.STALENESS_MEAN in r for r in records)
    rows: list[tuple[str, list[tuple[str, list[tuple[float, float]]]], bool]] = []
    for rank in sorted(by_rank):
        rows.append((f"trainer rank {rank}", [(p, _merged(by_rank[rank], (p,))) for p in Phase], False))
    for engine in run.plan.engines:
        label, bars = _engine_rows(engine, by_rank, overlapped)
        rows.append((label, bars, overlapped and not engine.ranks))
    plt = pyplot()
    end = records[-1]["time"] - t0
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.42 * len(rows)))
    for y, (_, bars, unseen) in enumerate(reversed(rows)):
        if unseen:
            ax.broken_barh([(0, end)], (y - 0.35, 0.7), facecolors=UNSEEN, hatch="//", edgecolor="#cccccc",
                           linewidth=0)
        for phase, spans in bars:
            ax.broken_barh([(a - t0, w) for a, w in spans], (y - 0.35, 0.7), facecolors=COLORS[phase], linewidth=0)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)], fontsize=8)
    ax.set_xlim(0, end)
    ax.set_xlabel(f"seconds from the start of step {records[0]['step']}")
    for record in records:  # step boundaries
        ax.axvline(record["time"] - t0, color="black", linewidth=0.4, alpha=0.4)
    used = [p for p in Phase if any(dict(b).get(p) for _, b, _ in rows)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[p]) for p in used]
    height = fig.get_size_inches()[1]
    fig.legend(handles, used, loc="upper center", bbox_to_anchor=(0.6, 1 - 0.3 / height), ncol=len(used),
               fontsize=8, frameon=False)
    fig.suptitle(f"{title}: steps {records[0]['step']}-{records[-1]['step']} (blank: idle)", fontsize=10,
                 y=1 - 0.08 / height)
    if any(unseen for _, _, unseen in rows):
        fig.text(0.01, 0.1 / height, UNSEEN_NOTE, fontsize=7, color="#555555")
    fig.subplots_adjust(left=0.2, right=0.98, top=1 - 0.62 / height, bottom=0.7 / height)
    return saved(fig, run.path / TIMELINE_FILE)


def draw_eval(run: RunData, title: str) -> Path | None:
    if not run.evals:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    steps = [r["step"] for r in run.evals]
    ax.plot(steps, [r[m.EVAL_REWARD] for r in run.evals], marker="o", label="eval (held-out)")
    train = [(r["step"], r[m.REWARD]) for r in run.training if r.get(m.REWARD) is not None]
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], alpha=0.4, label="training")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.15, right=0.97, bottom=0.15, top=0.88)
    return saved(fig, run.path / EVAL_FILE)


def draw_report(run: RunData, title: str) -> list[Path]:
    """Every picture of `grpo report` that the run's records allow."""
    return [p for p in (draw_timeline(run, title), draw_eval(run, title)) if p is not None]


def draw_overlay(comparison: Any, out: Path) -> Path:
    """The reward curves of compared runs in one PNG: against step and against training wall time; a colour per
    layout, the spread (reward_std) shaded."""
    plt = pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for g, (name, members) in enumerate(comparison.groups):
        color = palette[g % len(palette)]
        for i, report in enumerate(members):
            records = [r for r in report.run.training if r.get(m.REWARD) is not None]
            steps = [r["step"] for r in records]
            rewards = [r[m.REWARD] for r in records]
            spread = [r.get("reward_std", 0.0) or 0.0 for r in records]
            label = name if i == 0 else None
            by_step.plot(steps, rewards, color=color, linewidth=1.3, label=label)
            by_step.fill_between(steps, [a - s for a, s in zip(rewards, spread, strict=True)],
                                 [a + s for a, s in zip(rewards, spread, strict=True)], color=color, alpha=0.08)
            ends = {r["step"]: r["time"] for r in report.run.measures}
            start = report.run.measures[0]["time"] - report.run.measures[0][m.STEP_S] if report.run.measures else None
            timed = [(ends[s] - start, v) for s, v in zip(steps, rewards, strict=True) if s in ends and start]
            if timed:
                by_time.plot([t for t, _ in timed], [v for _, v in timed], color=color, linewidth=1.3)
    for ax, label in ((by_step, "step"), (by_time, "training wall time (s)")):
        ax.set_xlabel(label)
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=7, loc="lower right")
    fig.suptitle("reward curves, overlaid (shaded: the spread within each step)", fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.88, wspace=0.22)
    return saved(fig, out)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def saved(fig, out: Path) -> Path:
    """Write the figure to `out` as a PNG, then free it."""
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out


def draw_curves(run_dir: Path, records: list[dict[str, Any]], title: str) -> Path | None:
    """The reward curve (with its spread), and the loss, KL and completion length where the records have them."""
    panels = [(key, label) for key, label in CURVE_PANELS if any(key in r for r in records)]
    if not panels:
        return None
    plt = pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=2.5, linewidth=1.4)
        if key == m.REWARD:
            stds = [r.get("reward_std", 0.0) for r in records if key in r]
            ax.fill_between([p[0] for p in points], [p[1] - s for p, s in zip(points, stds, strict=True)],
                            [p[1] + s for p, s in zip(points, stds, strict=True)], alpha=0.15)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    # Fixed margins, not tight_layout(): it measures every tick label, about 40% of the plot's time at the end of a
    # run (benchmarks/run_overhead.py). Sized for the panels' 4.2-inch widths and one-line titles.
    fig.subplots_adjust(left=0.22 / len(panels) + 0.02, right=0.98, bottom=0.15, top=0.8, wspace=0.32)
    return saved(fig, run_dir / CURVES_FILE)


class CurvePlotter:
    """Draws the reward curve in the background, as soon as the trainer logs its closing record: matplotlib's import
    (about 0.2 s of CPU) and the drawing then use the idle CPU of the trainer's teardown (a barrier, the process
    group, the launcher's exit: most of a second), where during training they would take CPU from the ranks. A run
    that ends without the closing record (a failure, Ctrl-C) is plotted when `finish` is called. `also` draws more
    pictures then (the report's), in the same thread; `drawn` lists them."""

    def __init__(self, run_dir: Path, title: str, also: Callable[[], list[Path]] | None = None) -> None:
        self.run_dir = run_dir
        self.title = title
        self.also = also
        self.tail = MetricsTail(run_dir, from_end=True)  # a resumed run's earlier records are old
        self.finishing = threading.Event()
        self.records_read = 0  # training records read while waiting for the closing one
        self.curve: Path | None = None
        self.drawn: list[Path] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._draw, name="reward-curve", daemon=True)
        self.thread.start()

    def _draw(self) -> None:
        try:
            while not self.finishing.wait(POLL_S):
                records = self.tail.new_records()
                if any(m.is_closing(r) for r in records):
                    break
                self.records_read += len(records)
            training = read_metrics(self.run_dir).training
            self.curve = draw_curves(self.run_dir, training, self.title) if training else None
            if self.also is not None:
                self.drawn = self.also()
        except BaseException as e:  # noqa: BLE001  (raised again by finish, in the caller's thread)
            self.error = e

    def finish(self) -> Path | None:
        """The curve's path (None when there is nothing to draw), once drawn."""
        self.finishing.set()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.curve
