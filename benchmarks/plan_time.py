"""`grpo plan` wall time against the bare imports it needs, and a 12-combination sweep (`grpo plan -m`) against
one `grpo plan`, measured in the same run.

Baseline: `python -c "import hydra, omegaconf, typer, rich"`. Target: `grpo plan` at most 1.5x the baseline.
Sweep target: `grpo plan -m recipe=qwen7b-server,qwen7b-colocate vllm.tensor_parallel_size=1,2,4 zero=2,3` at
most 3x one `grpo plan recipe=qwen7b-server`, warm and cold alike (Hydra composes each of the 4 choices of group
options once; the 3 TP values are key overrides applied to a copy).

Prediction target: the step-time prediction (grpo_launch.estimate.step_time) adds at most 10% to that sweep's
planning, measured in this process: the same 12 combinations composed and planned with the prediction and with it
replaced by nothing, interleaved, median of each.

`grpo plan` keeps each successful composition in a cache (grpo_launch/compose/cache.py), so planning a recipe again
skips Hydra. Both are measured: "warm" is a repeated `grpo plan` (the cache answers), "cold" has the cache off
(GRPO_COMPOSE_CACHE=0): Hydra composes the recipe every time, which alone costs about 90 ms here, half of it Hydra's
own config (an empty config costs that much too). The target is stated for the warm runs; cold ones are printed
beside them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 15
BASELINE = [sys.executable, "-c", "import hydra, omegaconf, typer, rich"]
GRPO = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()"]
CASES = {
    "grpo plan (tiny-cpu)": [*GRPO, "plan"],
    "grpo plan recipe=qwen72b-colocate": [*GRPO, "plan", "recipe=qwen72b-colocate"],
    "grpo plan recipe=qwen1.5b-async-lora --json": [*GRPO, "plan", "recipe=qwen1.5b-async-lora", "--json"],
}
TARGET = 1.5
SWEEP = [*GRPO, "plan", "-m", "recipe=qwen7b-server,qwen7b-colocate", "vllm.tensor_parallel_size=1,2,4", "zero=2,3"]
ONE = [*GRPO, "plan", "recipe=qwen7b-server"]
SWEEP_TARGET = 3.0
PREDICTION_TARGET = 1.10
PREDICTION_RUNS = 60


def wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={"COLUMNS": "160", "PATH": "", **env})
    return time.perf_counter() - start


def prediction_overhead() -> None:
    """The sweep composed and planned in this process, with and without the step-time prediction."""
    import grpo_launch.plan as planning
    from grpo_launch.compose.sweep import compose_sweep
    from grpo_launch.plan.sweep import plan_sweep

    overrides = SWEEP[SWEEP.index("-m") + 1:]
    predict = planning.predict_step_time

    def sweep_s(with_prediction: bool) -> float:
        planning.predict_step_time = predict if with_prediction else (lambda *args: None)
        try:
            start = time.perf_counter()
            sweep, composed = compose_sweep(overrides, [])
            plan_sweep(sweep, composed)
            return time.perf_counter() - start
        finally:
            planning.predict_step_time = predict

    sweep_s(True), sweep_s(False)  # warm the composition cache
    samples: dict[bool, list[float]] = {True: [], False: []}
    for run in range(PREDICTION_RUNS):  # in pairs, alternating which goes first: load changes hit both alike
        for with_prediction in ((True, False) if run % 2 else (False, True)):
            samples[with_prediction].append(sweep_s(with_prediction))
    with_, without = (statistics.median(samples[w]) for w in (True, False))
    ratio = statistics.median(a / b for a, b in zip(samples[True], samples[False], strict=True))
    verdict = "meets" if ratio <= PREDICTION_TARGET else "MISSES"
    print()
    print(f"{'grpo plan -m, 12 combinations, in-process, prediction on/off':56} {'on':>8} {'off':>8} {'ratio':>6}")
    print(f"  {'composed and planned (warm cache)':54} {with_ * 1000:6.1f}ms {without * 1000:6.1f}ms "
          f"{ratio:6.3f} {verdict} <= {PREDICTION_TARGET:.2f}x ({PREDICTION_RUNS} pairs, median of their ratios)")


def main() -> int:
    cache = tempfile.mkdtemp(prefix="grpo-bench-cache-")
    modes = {"warm": {"GRPO_CACHE_DIR": cache}, "cold": {"GRPO_COMPOSE_CACHE": "0"}}
    runs = [("baseline", BASELINE, {})] + [(f"{name} [{mode}]", argv, env) for mode, env in modes.items()
                                            for name, argv in CASES.items()]
    runs += [(f"{name} [{mode}]", argv, env) for mode, env in modes.items()
             for name, argv in (("one plan", ONE), ("sweep of 12", SWEEP))]
    for _, argv, env in runs:  # warm the file cache (and the composition cache)
        wall(argv, env)
    samples: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(RUNS):  # interleaved, so load changes hit every command alike
        for label, argv, env in runs:
            samples[label].append(wall(argv, env))
    base = statistics.median(samples["baseline"])
    print(f"{'command':56} {'median':>8} {'ratio':>6}")
    print(f"{'import hydra, omegaconf, typer, rich':56} {base * 1000:7.0f}ms {1.0:6.2f}")
    worst = {mode: 0.0 for mode in modes}
    for label, _, _ in runs[1:1 + len(modes) * len(CASES)]:
        median = statistics.median(samples[label])
        mode = label.rsplit("[", 1)[1].rstrip("]")
        worst[mode] = max(worst[mode], median / base)
        print(f"{label:56} {median * 1000:7.0f}ms {median / base:6.2f}")
    verdict = "meets" if worst["warm"] <= TARGET else "MISSES"
    print(f"worst warm ratio {worst['warm']:.2f} {verdict} the target of <= {TARGET:.1f}x; worst cold ratio "
          f"{worst['cold']:.2f} ({RUNS} runs each, median)")
    print()
    print(f"{'grpo plan -m, 12 combinations, against one grpo plan':56} {'sweep':>8} {'one':>8} {'ratio':>6}")
    for mode in modes:
        sweep, one = (statistics.median(samples[f"{name} [{mode}]"]) for name in ("sweep of 12", "one plan"))
        verdict = "meets" if sweep / one <= SWEEP_TARGET else "MISSES"
        print(f"  {mode:54} {sweep * 1000:6.0f}ms {one * 1000:6.0f}ms {sweep / one:6.2f} {verdict} <= "
              f"{SWEEP_TARGET:.0f}x")
    prediction_overhead()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
