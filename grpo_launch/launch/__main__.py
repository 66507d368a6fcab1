"""`python -m grpo_launch.launch --run-dir DIR --node K`: one node's processes of a run directory, supervised.

What the Slurm job (one srun task per node) and the SkyPilot task (every node's run script) start; it reads
plan.json and never re-composes the recipe. `--first-failure` prints the exit code of the node that failed first
(nothing when none did): how the Slurm job passes it on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.rundir import read_node_failures, read_plan
from grpo_launch.errors import EXIT_USER_ERROR, UserError
from grpo_launch.launch.node import prepare_node, run_nodes
from grpo_launch.launch.result import GRACE_S


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_launch.launch", description=__doc__)
    parser.add_argument("--run-dir", default=".", help="the run directory holding plan.json")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--node", type=int, help="this node's index in the plan")
    which.add_argument("--first-failure", action="store_true",
                       help="print the exit code of the node that failed first, if any, and exit")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    if args.first_failure:
        first = read_node_failures(run_dir)[:1]
        print(*(f.code for f in first))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    try:
        plan = read_plan(run_dir, key="--run-dir")
        if not 0 <= args.node < plan.nodes:
            raise UserError(f"--node {args.node} is not a node of this plan (0..{plan.nodes - 1})", key="--node")
        plan = prepare_node(plan, [args.node], console)
    except UserError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}")
        return EXIT_USER_ERROR
    console.print(f"[bold]node {args.node}[/] of {plan.nodes}: {escape(str(run_dir))}")
    return run_nodes(plan, run_dir, [args.node], grace_s=args.grace, console=console).code


if __name__ == "__main__":
    sys.exit(main())
