"""`grpo run recipe=tiny-cpu` against a plain hand-written TRL script launched with `accelerate launch`, same model,
data, reward and arguments, measured alternately in the same run. Reports wall time and steps/s ratios, at the
recipe's 20 steps and at 100: the 100-step figure shows a cost per step (streaming each line, the metrics, the
training view), the 20-step one mostly the fixed cost (composing, writing the run directory, drawing the curves).

Target, at 20 and at 100 steps: wall-time ratio <= 1.03 and steps/s ratio >= 0.99 (the median of the rounds).
The machine's load average is printed beside each figure: on a loaded machine, more rounds (--rounds N). Two
ratios less sensitive to other load are printed beside the targets: the best round's wall time, and the CPU
seconds of the whole process tree (what grpo-launch itself adds, whatever else runs).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import grpo_launch
from grpo_launch.compose import compose
from grpo_launch.plan import build_plan

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
WALL_TARGET = 1.03
STEPS_PER_SECOND_TARGET = 0.99
PLAIN_STEPS_PER_SECOND = re.compile(r"'train_steps_per_second': '([0-9.]+)'")  # TRL's closing record, printed
RUN_DIR = re.compile(r"run directory: (\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run(NamedTuple):
    wall: float                      # seconds
    steps_per_second: float          # TRL's train_steps_per_second: the training loop alone
    cpu: float                       # CPU seconds of the whole process tree (user + system)


def timed(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(argv[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stdout + done.stderr


def plain_run(argv: list[str], cwd: Path) -> Run:
    wall, cpu, out = timed(argv, cwd)
    return Run(wall, float(PLAIN_STEPS_PER_SECOND.search(out).group(1)), cpu)


def grpo_run(argv: list[str], cwd: Path) -> Run:
    """grpo run's console shows the training view, not TRL's records: its steps/s is in the run's metrics.jsonl."""
    wall, cpu, out = timed(argv, cwd)
    last = json.loads((Path(RUN_DIR.search(out).group(1)) / "metrics.jsonl").read_text().splitlines()[-1])
    return Run(wall, float(last["train_steps_per_second"]), cpu)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def compare(work: Path, model: Path, steps: int, rounds: int, port: str) -> dict[str, float]:
    """Both launches at `steps` steps, alternately; the ratios grpo / plain: of the median wall time and steps/s
    (the targets), and, less sensitive to other load on the machine, of the best wall time and the median CPU."""
    results: dict[str, list[Run]] = {"plain": [], "grpo": []}
    print(f"{steps} steps, load average before: {load()}")
    for i in range(rounds):  # alternate, so load changes hit both alike
        results["plain"].append(plain_run(
            [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
             "--main_process_port", port, "--mixed_precision", "no", "--dynamo_backend", "no",
             str(HERE / "plain_grpo.py"), str(model), str(steps), str(work / f"plain-{steps}-{i}")], work))
        results["grpo"].append(grpo_run(
            [str(BIN / "grpo"), "run", f"model.name_or_path={model}", f"run.root={work / 'runs'}",
             f"trainer.max_steps={steps}", f"run.main_process_port={port}"], work))
        plain, ours = results["plain"][-1], results["grpo"][-1]
        print(f"  round {i + 1}: plain {plain.wall:6.2f} s {plain.steps_per_second:6.2f} steps/s {plain.cpu:6.1f} "
              f"CPU s   grpo {ours.wall:6.2f} s {ours.steps_per_second:6.2f} steps/s {ours.cpu:6.1f} CPU s   "
              f"load {load()}")
    median = {k: Run(*(statistics.median(getattr(r, f) for r in v) for f in Run._fields)) for k, v in results.items()}
    print(f"  {'median':28} {'wall s':>8} {'steps/s':>8} {'CPU s':>8}")
    for name, label in (("plain", "accelerate launch plain.py"), ("grpo", "grpo run tiny-cpu")):
        print(f"  {label:28} {median[name].wall:8.2f} {median[name].steps_per_second:8.2f} {median[name].cpu:8.1f}")
    best = {k: min(r.wall for r in v) for k, v in results.items()}
    return {"wall": median["grpo"].wall / median["plain"].wall,
            "steps/s": median["grpo"].steps_per_second / median["plain"].steps_per_second,
            "best wall": best["grpo"] / best["plain"], "cpu": median["grpo"].cpu / median["plain"].cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds at each step count (median)")
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 100])
    args = parser.parse_args()
    # As a wheel's install does: an editable checkout under PYTHONDONTWRITEBYTECODE would compile every module of
    # grpo-launch in `grpo run` and in each trainer rank at every start, which no installed copy does.
    compileall.compile_dir(Path(grpo_launch.__file__).parent, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    model = work / "model"  # where the recipe's build step writes (--out model, relative to the run directory)
    (build_model,) = build_plan(compose(["recipe=tiny-cpu"])).prepare  # the recipe's own model, built once
    subprocess.run([sys.executable, *build_model.argv[1:]], cwd=work, check=True, capture_output=True)
    plain_run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port",
               str(free_port()), str(HERE / "plain_grpo.py"), str(model), "2", str(work / "warmup")], work)  # caches
    print(f"target at each step count: wall-time ratio <= {WALL_TARGET}, steps/s ratio >= {STEPS_PER_SECOND_TARGET} "
          f"(grpo run / plain accelerate launch), {os.cpu_count()} CPUs")
    # One rendezvous port for every run (each ends before the next starts): grpo run's overrides stay the same, so
    # its composition comes from the cache after the first round, as a user's repeated runs do.
    port = str(free_port())
    for steps in args.steps:  # the recipe's 20 steps, then a longer run: a cost per step shows at 100
        ratio = compare(work, model, steps, args.rounds, port)
        print(f"  {steps} steps: wall-time ratio {ratio['wall']:.3f} "
              f"({'meets' if ratio['wall'] <= WALL_TARGET else 'MISSES'} <= {WALL_TARGET}), steps/s ratio "
              f"{ratio['steps/s']:.3f} ({'meets' if ratio['steps/s'] >= STEPS_PER_SECOND_TARGET else 'MISSES'} >= "
              f"{STEPS_PER_SECOND_TARGET}), median of {args.rounds} alternating rounds; best-round wall ratio "
              f"{ratio['best wall']:.3f}, CPU-seconds ratio {ratio['cpu']:.3f}; load average after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
