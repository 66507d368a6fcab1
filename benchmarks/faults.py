"""The fault matrix: every fault of issue 27's list injected into the real part it hits, one row each.

It runs the suite's fault tests (`pytest -m fault`: the real Slurm cluster with a controller that times out or goes
silent, the Hugging Face Jobs stand-in answering 5xx, 429 and timeouts and dropping log streams, a filesystem that
fills up under a real run, trainer ranks and `grpo run` killed mid-checkpoint, vLLM replicas killed and clients
hanging up mid-broadcast), each of which records what came of its fault (tests/fault_matrix.py), and prints them as
one table: how many were injected, what the run should have done and did, steps lost, metrics records lost, jobs
left billing, and the metrics lines a fault cut short (skipped by the readers; their steps' records come again).

Target: every run finishes (or is left running, where the control plane stayed silent past its bound, or refused,
where it must not start); 0 steps lost, 0 records lost, 0 jobs left billing. Exit 1 when a row misses it or a fault
test fails. `-k EXPR` runs some of them (pytest's -k); `--rows FILE` prints the rows a test session already wrote
(GRPO_FAULT_MATRIX=FILE pytest ...) instead of running the tests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fault_matrix import MATRIX_ENV, FaultRow, read  # noqa: E402  (the tests' own row format)

# What the matrix cannot show here, and why: each is a fault of the list whose real part no machine of ours runs.
NOT_INJECTED = (
    "SkyPilot's control plane (sky launch/queue/cancel/down): no cloud is reachable here; its commands are tested "
    "against a recording stand-in of the `sky` CLI, not injected into SkyPilot itself",
    "the Hub's own servers: 5xx, 429 and timeouts are injected into the Jobs stand-in, which speaks the routes "
    "huggingface_hub calls; Xet bucket transfers are replaced by a copy there",
    "NCCL across GPU nodes (a rank killed mid-all-reduce, node-local checkpoints on 4 nodes): no GPU; the multi-node "
    "resume decision is tested with two trainer ranks over gloo on loopback, each with checkpoints of its own",
)


def print_matrix(rows: list[FaultRow], tests_passed: bool) -> bool:
    """The table, its totals, and whether the target is met."""
    header = ("fault", "injected", "expected", "outcome", "steps lost", "records lost", "billing", "cut lines")
    width = max([len(header[0])] + [len(r.fault) for r in rows])
    print(f"  {header[0]:<{width}}  {header[1]:>8}  {header[2]:<12}  {header[3]:<12}  {header[4]:>10}  "
          f"{header[5]:>12}  {header[6]:>7}  {header[7]:>9}")
    for r in sorted(rows, key=lambda r: r.fault):
        print(f"  {r.fault:<{width}}  {r.injected:>8}  {r.expected:<12}  {r.outcome:<12}  {r.steps_lost:>10}  "
              f"{r.records_lost:>12}  {r.billing:>7}  {r.lines_skipped:>9}{'' if r.met else '  <- missed'}")
    missed = [r for r in rows if not r.met]
    totals = (sum(r.steps_lost for r in rows), sum(r.records_lost for r in rows), sum(r.billing for r in rows))
    print(f"  {'total':<{width}}  {sum(r.injected for r in rows):>8}  {'':<12}  {'':<12}  {totals[0]:>10}  "
          f"{totals[1]:>12}  {totals[2]:>7}")
    met = not missed and tests_passed
    print("target: every run as expected, 0 steps lost, 0 records lost, 0 jobs left billing: "
          + ("met" if met else f"MISSED ({len(missed)} rows missed{'' if tests_passed else '; a fault test failed'})"))
    print("not injected here:")
    for why in NOT_INJECTED:
        print(f"  - {why}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", help="only the fault tests matching this pytest expression")
    parser.add_argument("--rows", type=Path, help="print the rows this file holds; run no test")
    args = parser.parse_args()
    if args.rows:
        rows = read(args.rows)
        print(f"the fault matrix ({len(rows)} faults, from {args.rows})")
        return 0 if print_matrix(rows, True) else 1
    with tempfile.TemporaryDirectory(prefix="grpo-faults-") as tmp:
        matrix = Path(tmp) / "matrix.jsonl"
        matrix.touch()
        command = [sys.executable, "-m", "pytest", "-m", "fault", "-q", "-n", "2", "--dist", "loadfile", "-p",
                   "no:cacheprovider", *(["-k", args.k] if args.k else []), str(ROOT / "tests")]
        print("running the fault tests:", " ".join(command[1:]), flush=True)
        start = time.monotonic()
        tests = subprocess.run(command, cwd=ROOT, env={**os.environ, MATRIX_ENV: str(matrix)})
        rows = read(matrix)
    print(f"\nthe fault matrix ({len(rows)} faults, {time.monotonic() - start:.0f} s)")
    return 0 if print_matrix(rows, tests.returncode == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
