"""`grpo plan` wall time against the bare imports it needs, measured in the same run.

Baseline: `python -c "import hydra, omegaconf, typer, rich"`. Target: `grpo plan` at most 2x the baseline.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 15
BASELINE = [sys.executable, "-c", "import hydra, omegaconf, typer, rich"]
GRPO = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()"]
CASES = {
    "grpo plan (tiny-cpu)": [*GRPO, "plan"],
    "grpo plan recipe=qwen72b-colocate": [*GRPO, "plan", "recipe=qwen72b-colocate"],
    "grpo plan recipe=qwen1.5b-async-lora --json": [*GRPO, "plan", "recipe=qwen1.5b-async-lora", "--json"],
}
TARGET = 2.0


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={"COLUMNS": "160", "PATH": ""})
    return time.perf_counter() - start


def main() -> int:
    for argv in [BASELINE, *CASES.values()]:  # warm the file cache
        wall(argv)
    samples: dict[str, list[float]] = {"baseline": [], **{name: [] for name in CASES}}
    for _ in range(RUNS):  # interleaved, so load changes hit every command alike
        samples["baseline"].append(wall(BASELINE))
        for name, argv in CASES.items():
            samples[name].append(wall(argv))
    base = statistics.median(samples["baseline"])
    print(f"{'command':48} {'median':>8} {'ratio':>6}")
    print(f"{'import hydra, omegaconf, typer, rich':48} {base * 1000:7.0f}ms {1.0:6.2f}")
    worst = 0.0
    for name in CASES:
        median = statistics.median(samples[name])
        worst = max(worst, median / base)
        print(f"{name:48} {median * 1000:7.0f}ms {median / base:6.2f}")
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"worst ratio {worst:.2f} {verdict} the target of <= {TARGET:.1f}x ({RUNS} runs each, median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
