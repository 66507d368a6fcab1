"""What a finished run shows: the reward curve (and loss, KL, completion length) as a PNG, and a summary."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from grpo_launch.contracts.rundir import CURVES_FILE, METRICS_FILE

PANELS = (("reward", "mean reward"), ("loss", "loss"), ("kl", "KL to reference"),
          ("completions/mean_length", "completion length (tokens)"))


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


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [r["reward"] for r in records if "reward" in r]
    if not rewards:
        return {"steps": 0}
    first, last = quarters(rewards)
    return {"steps": records[-1]["step"], "reward_first_quarter": round(first, 4),
            "reward_last_quarter": round(last, 4), "reward_final": round(rewards[-1], 4)}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def preload_plotting() -> threading.Thread:
    """Import matplotlib (about half a second) in the background while the run trains, not after it."""
    thread = threading.Thread(target=_pyplot, name="preload-matplotlib", daemon=True)
    thread.start()
    return thread


def plot(run_dir: Path, records: list[dict[str, Any]], title: str) -> Path | None:
    panels = [(key, label) for key, label in PANELS if any(key in r for r in records)]
    if not panels:
        return None
    plt = _pyplot()

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
    out = run_dir / CURVES_FILE
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
