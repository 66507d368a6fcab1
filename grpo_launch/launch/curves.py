"""What a finished run shows: the reward curve (and loss, KL, completion length) as a PNG; and the
reading of metrics.jsonl as it grows, which the console's training view shares."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_launch.contracts.rundir import CURVES_FILE, METRICS_FILE

PANELS = (("reward", "mean reward"), ("loss", "loss"), ("kl", "KL to reference"),
          ("completions/mean_length", "completion length (tokens)"))
CLOSING_KEY = "train_runtime"   # in the record transformers logs once training ends
POLL_S = 0.25


class LogTail:
    """The lines appended to a growing file since the last read; a line still being written waits for the next."""

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        self.path = path
        self.offset = path.stat().st_size if from_end and path.exists() else 0

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                complete = f.read().rpartition(b"\n")[0]
        except FileNotFoundError:
            return []
        if not complete:
            return []
        self.offset += len(complete) + 1
        return complete.decode(errors="replace").splitlines()


class MetricsTail(LogTail):
    """The records appended to metrics.jsonl since the last read."""

    def new_records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines()]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Training log records, one per step (a resumed run logs some steps again: the later record wins)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "reward" in record or "loss" in record:
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def quarters(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of the values."""
    n = max(1, len(values) // 4)
    return sum(values[:n]) / n, sum(values[-n:]) / n


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
        self.tail = MetricsTail(run_dir / METRICS_FILE, from_end=True)  # a resumed run's earlier records are old
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
                if any(CLOSING_KEY in r for r in records):
                    break
                self.records_read += len(records)
            records = read_metrics(self.run_dir)
            self.curve = plot(self.run_dir, records, self.title) if records else None
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


def plot(run_dir: Path, records: list[dict[str, Any]], title: str) -> Path | None:
    panels = [(key, label) for key, label in PANELS if any(key in r for r in records)]
    if not panels:
        return None
    plt = pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=2.5, linewidth=1.4)
        if key == "reward":
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
