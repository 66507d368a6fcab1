"""Starting a planned run, for `grpo run` and `grpo rehearse`: write its run directory, then supervise its nodes on
this machine, or submit it to a scheduler and follow the job; the metrics and the reward curve at the end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from rich.console import Console

    from grpo_launch.compose import Composed
    from grpo_launch.launch.result import RunResult
    from grpo_launch.plan import Plan


def nodes_to_run(plan: Plan, node_rank: int | None) -> list[int]:
    """The nodes this `grpo run` starts: --node-rank's, or every node when all of them are this machine."""
    from grpo_launch.errors import UserError

    kind = plan.scheduler.kind
    if node_rank is not None:
        if kind != "local":
            raise UserError(f"--node-rank is for scheduler=local; the {kind} job starts every node itself",
                            key="--node-rank", hint="drop --node-rank")
        if not 0 <= node_rank < plan.nodes:
            raise UserError(f"--node-rank {node_rank} is not a node of this plan (0..{plan.nodes - 1})",
                            key="--node-rank")
        return [node_rank]
    groups = plan.scheduler.groups
    if kind == "local" and len(groups) > 1:
        raise UserError(f"the {plan.nodes} nodes of this plan are other machines ({plan.scheduler.addresses})",
                        key="--node-rank", hint="start `grpo run --node-rank K` on each machine with the same run.dir "
                                                "on shared storage, or let a scheduler do it: scheduler=slurm or "
                                                "scheduler=skypilot")
    return list(range(plan.nodes))


def launch_local(composed: Composed, the_plan: Plan, dirs: list[str], *, run_dir: Path | None = None,
                 nodes: list[int], join: bool = False, grace_s: float, console: Console,
                 verbose: bool) -> tuple[Path, RunResult]:
    """Write the run directory (`run_dir`: a run's to continue, or a new one's path; default: new under run.root)
    and supervise `nodes` of the plan on this machine."""
    from grpo_launch.launch import curves
    from grpo_launch.launch.node import prepare_node, run_nodes
    from grpo_launch.materialize import materialize

    prepared = prepare_node(the_plan, nodes, console)  # addresses, ports, environment: before anything is written
    run_dir = materialize(composed, the_plan, dirs, run_dir=run_dir, join=join).resolve()
    console.print(f"[bold]run directory[/] {escape(str(run_dir))}")
    if join and the_plan.nodes > 1:
        console.print(f"[yellow]node {nodes[0]} of {the_plan.nodes}: start the others (`grpo run --node-rank K`, the "
                      f"same run.dir) within run.rendezvous_timeout_s[/]")
    # the node of trainer rank 0 (which logs the metrics) draws the curve; others sharing run.dir leave it be
    logs_metrics = any(0 in p.ranks for p in the_plan.processes if p.node in nodes)
    plotter = curves.CurvePlotter(run_dir, f"{composed.recipe} ({run_dir.name})") if logs_metrics else None
    result = run_nodes(prepared, run_dir, nodes, grace_s=grace_s, console=console, verbose=verbose)
    _finish(run_dir, result.code, console, plotter.finish() if plotter else None, draw=logs_metrics)
    return run_dir, result


def _finish(run_dir: Path, code: int, console: Console, curve: Path | None, *, draw: bool = True) -> None:
    from grpo_launch.launch import curves

    records = curves.read_metrics(run_dir) if draw else []
    if records:
        console.print(f"[bold]metrics[/] {curves.summary(records)}")
        if curve is not None:
            console.print(f"[bold]reward curve[/] {escape(str(curve))}")
    console.print(f"[bold]{'done' if code == 0 else 'failed'}[/] run directory: {escape(str(run_dir))}")


# scheduler: (where its nodes find the run directory, what to do where the scheduler is not installed)
SCHEDULED = {
    "slurm": ("every node must see it: shared storage",
              "Slurm is not installed here: nothing submitted. On a Slurm login node, with the run directory on "
              "shared storage:"),
    "skypilot": ("SkyPilot copies it to every node as the task's workdir",
                 "SkyPilot is not installed here: nothing launched. Install it with your cloud's extra (pip install "
                 "'skypilot[aws]', [gcp], [kubernetes], ...), check it with `sky check`, then:"),
}


def submit(composed: Composed, the_plan: Plan, dirs: list[str], *, run_dir: Path | None = None,
           console: Console) -> int:
    """A scheduler's job: write the run directory (the job file in it), submit it from there and follow it; its
    exit code (0 when nothing could be submitted here, after saying how to)."""
    import shutil

    from grpo_launch.contracts.shell import shell_line, shell_word
    from grpo_launch.launch import curves, skypilot, slurm
    from grpo_launch.materialize import materialize

    where, missing = SCHEDULED[the_plan.scheduler.kind]
    run_dir = materialize(composed, the_plan, dirs, run_dir=run_dir).resolve()
    console.print(f"[bold]run directory[/] {escape(str(run_dir))} ({where})")
    if shutil.which(the_plan.scheduler.submit[0]) is None:
        console.print(f"[yellow]{missing}[/]")
        console.print(f"  cd {shell_word(str(run_dir))} && {shell_line(the_plan.scheduler.submit)}", markup=False)
        return 0
    if the_plan.scheduler.kind == "slurm":
        code = slurm.submit_and_follow(the_plan, run_dir, console, poll_s=composed.config.scheduler.slurm.poll_s)
    else:
        code = skypilot.launch(the_plan, run_dir, console)
    records = curves.read_metrics(run_dir)
    curve = curves.plot(run_dir, records, f"{composed.recipe} ({run_dir.name})") if records else None
    _finish(run_dir, code, console, curve)
    return code
