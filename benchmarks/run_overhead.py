"""`grpo run recipe=tiny-cpu` against a plain hand-written TRL script launched with `accelerate launch`, same model,
data, reward and arguments, measured alternately in the same run. Reports wall time and steps/s ratios, at the
recipe's 20 steps and at 100 (grpo-launch's cost is a fixed second or so: composing, writing the run directory,
drawing the curves).

Target: grpo-launch's overhead within 5% (wall-time ratio <= 1.05, steps/s ratio >= 0.95).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_launch.compose import compose
from grpo_launch.plan import build_plan

ROUNDS = 3
HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
STEPS_PER_SECOND = re.compile(r"'train_steps_per_second': '([0-9.]+)'")


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(argv[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    match = STEPS_PER_SECOND.search(done.stdout + done.stderr)
    return wall, float(match.group(1)) if match else float("nan")


def compare(work: Path, model: Path, steps: int) -> tuple[float, float]:
    """Median wall time and steps/s of both launches at `steps` steps; returns (wall ratio, steps/s ratio)."""
    plain = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
             "--mixed_precision", "no", "--dynamo_backend", "no", str(HERE / "plain_grpo.py"), str(model), str(steps)]
    ours = [str(BIN / "grpo"), "run", f"model.name_or_path={model}", f"run.root={work / 'runs'}",
            f"trainer.max_steps={steps}"]
    results: dict[str, list[tuple[float, float]]] = {"plain": [], "grpo": []}
    for i in range(ROUNDS):  # alternate, so load changes hit both alike
        results["plain"].append(timed([*plain, str(work / f"plain-{steps}-{i}")], work))
        results["grpo"].append(timed(ours, work))
    wall = {k: statistics.median(w for w, _ in v) for k, v in results.items()}
    sps = {k: statistics.median(s for _, s in v) for k, v in results.items()}
    print(f"{steps} steps{'':20} {'wall s':>8} {'steps/s':>8}")
    for name, label in (("plain", "accelerate launch plain.py"), ("grpo", "grpo run tiny-cpu")):
        print(f"  {label:28} {wall[name]:8.2f} {sps[name]:8.2f}")
    return wall["grpo"] / wall["plain"], sps["grpo"] / sps["plain"]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    model = work / "model"  # where the recipe's build step writes (--out model, relative to the run directory)
    (build_model,) = build_plan(compose(["recipe=tiny-cpu"])).prepare  # the recipe's own model, built once
    subprocess.run([sys.executable, *build_model.argv[1:]], cwd=work, check=True, capture_output=True)
    timed([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", str(HERE / "plain_grpo.py"),
           str(model), "2", str(work / "warmup")], work)  # file caches, compiled bytecode
    for steps in (20, 100):  # the recipe's 20 steps, then a longer run: grpo-launch's cost is fixed, not per step
        wall_ratio, sps_ratio = compare(work, model, steps)
        print(f"  wall-time ratio {wall_ratio:.3f} ({'meets' if wall_ratio <= 1.05 else 'MISSES'} <= 1.05), "
              f"steps/s ratio {sps_ratio:.3f} ({'meets' if sps_ratio >= 0.95 else 'MISSES'} >= 0.95), median of "
              f"{ROUNDS} alternating rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
