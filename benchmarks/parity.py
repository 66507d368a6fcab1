"""The colocate post's quality claim in miniature, for real: the same task trained three ways, over three seeds,
then `grpo compare`d: does generating with vLLM inside the trainer ranks (colocate), with a vLLM server beside them
(server), or with transformers' own generate inside the trainer reach the same reward?

- tiny-cpu-colocate: vLLM's CPU build in each of 2 trainer processes;
- tiny-cpu-server: a real `vllm serve`, the trainer in 2 processes;
- tiny-cpu with vllm.enabled=false: TRL's transformers generation, no vLLM (its evaluation off, as the others have
  none: the eval draws random numbers the training would otherwise draw).
All three: the sevens task, 2 ranks x 16 completions a step (groups of 4), learning rate 0.01, temperature 1, the
same number of steps (--steps, 20 by default). Each layout's seeds pool their last quarter of steps; Welch's
t-test compares each layout with colocate (grpo_launch.report.compare says how).

9 real runs take several minutes here (a vLLM server starts in 20-45 s): `make bench` (or `make bench-parity` alone), or
`python benchmarks/parity.py [--seeds 42 43 44] [--steps 20] [--work DIR]`. Runs already finished in --work are
kept, so the runs can be made a seed at a time and compared at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_launch.report import compare, run, summary

BIN = Path(sys.executable).parent
LAYOUTS = {  # name -> overrides: the same task, batch and steps
    "colocate": ["recipe=tiny-cpu-colocate"],
    "server": ["recipe=tiny-cpu-server"],
    "transformers": ["recipe=tiny-cpu", "data.eval=null", "data.eval_samples=null"],
}


def finished(run_dir: Path) -> bool:
    try:
        return run.read_run(run_dir, fetch_hint=False).state == "finished"
    except Exception:  # noqa: BLE001  (not a run, or half of one: made again)
        return False


def train(work: Path, layout: str, seed: int, steps: int) -> Path:
    run_dir = work / "runs" / f"{layout}-seed{seed}"
    if finished(run_dir):
        print(f"  {layout:12} seed {seed}: kept from an earlier run ({run_dir})", flush=True)
        return run_dir
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    start = time.perf_counter()
    done = subprocess.run([str(BIN / "grpo"), "run", *LAYOUTS[layout], f"seed={seed}", f"trainer.max_steps={steps}",
                           f"run.dir={run_dir}"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"})
    if done.returncode:
        sys.exit(f"{layout} seed {seed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    report = summary.summarize(run.read_run(run_dir))
    print(f"  {layout:12} seed {seed}: {time.perf_counter() - start:5.0f} s, last-quarter reward "
          f"{report.last_quarter_reward:.3f}, median step {report.median_step_s:.2f} s", flush=True)
    return run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a new temporary dir)")
    parser.add_argument("--runs-only", action="store_true", help="make the runs, compare nothing yet")
    args = parser.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="grpo-parity-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"parity: {', '.join(LAYOUTS)} x seeds {', '.join(map(str, args.seeds))}, {args.steps} steps each, in "
          f"{work}", flush=True)
    for seed in args.seeds:  # a seed at a time, every layout: load on the machine hits the layouts alike
        for layout in LAYOUTS:
            train(work, layout, seed, args.steps)
    if args.runs_only:
        return 0
    dirs = sorted((work / "runs").iterdir(), key=lambda d: (list(LAYOUTS).index(d.name.split("-seed")[0]), d.name))
    reports = [summary.summarize(run.read_run(d)) for d in dirs if finished(d)]
    found = compare.compare(reports)
    print(f"\nparity ({compare.STATISTIC}), each layout's seeds pooled, against colocate:")
    for name, members in found.groups:
        quarters = [r.last_quarter_reward for r in members]
        rates = [r.completion_rate(r.units.training) for r in members]
        print(f"  {name:60} last-quarter reward by seed {', '.join(f'{q:.3f}' for q in quarters)}; completions/s "
              f"per training CPU process {', '.join(f'{x:.1f}' for x in rates)}")
    for parity in found.parity:
        print(f"  {parity}")
    out = work / "parity.png"
    subprocess.run([str(BIN / "grpo"), "compare", *map(str, dirs), "--out", str(out)], check=True,
                   env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.DEVNULL)
    print(f"  overlaid reward curves: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
