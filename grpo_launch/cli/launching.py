"""Starting a planned run, for `grpo run` and `grpo rehearse`: write its run directory, then supervise its nodes on
this machine, or submit it to a scheduler and follow the job; the report and its pictures at the end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
    console.print(f"[bold]run directory[/] {run_dir}")
    if join and the_plan.nodes > 1:
        console.print(f"[yellow]node {nodes[0]} of {the_plan.nodes}: start the others (`grpo run --node-rank K`, the "
                      f"same run.dir) within run.rendezvous_timeout_s[/]")
    # the node of trainer rank 0 (which logs the metrics) draws the curve; others sharing run.dir leave it be
    logs_metrics = any(0 in p.ranks for p in the_plan.processes if p.node in nodes)
    title = f"{composed.recipe} ({run_dir.name})"
    plotter = curves.CurvePlotter(run_dir, title, also=lambda: _report_plots(run_dir, title)) if logs_metrics \
        else None
    result = run_nodes(prepared, run_dir, nodes, grace_s=grace_s, console=console, verbose=verbose)
    if plotter is not None:
        plotter.finish()
    _finish(run_dir, result.code, console, [plotter.curve, *plotter.drawn] if plotter else [], draw=logs_metrics)
    return run_dir, result


def _report_plots(run_dir: Path, title: str) -> list[Path]:
    from grpo_launch.report import plots, run

    return plots.draw_report(run.read_run(run_dir, fetch_hint=False), title)


def _finish(run_dir: Path, code: int, console: Console, pictures: list[Path | None], *, draw: bool = True) -> None:
    """The report's table and bottleneck (what `grpo report` shows), the pictures drawn, the run directory."""
    from grpo_launch.launch import curves

    if draw and curves.read_metrics(run_dir):
        from grpo_launch.cli.report import show_report

        show_report(run_dir, console, plots=False, title=f"[bold]report[/] ({run_dir.name})")
        for picture in pictures:
            if picture is not None:
                console.print(f"[bold]plot[/] {picture}")
    console.print(f"[bold]{'done' if code == 0 else 'failed'}[/] run directory: {run_dir}")


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
    import shlex
    import shutil

    from grpo_launch.launch import curves, skypilot, slurm
    from grpo_launch.materialize import materialize

    where, missing = SCHEDULED[the_plan.scheduler.kind]
    run_dir = materialize(composed, the_plan, dirs, run_dir=run_dir).resolve()
    console.print(f"[bold]run directory[/] {run_dir} ({where})")
    if shutil.which(the_plan.scheduler.submit[0]) is None:
        console.print(f"[yellow]{missing}[/]\n  cd {shlex.quote(str(run_dir))} && "
                      f"{shlex.join(the_plan.scheduler.submit)}")
        return 0
    if the_plan.scheduler.kind == "slurm":
        code = slurm.submit_and_follow(the_plan, run_dir, console, poll_s=composed.config.scheduler.slurm.poll_s)
    else:
        code = skypilot.launch(the_plan, run_dir, console)
    records = curves.read_metrics(run_dir)
    title = f"{composed.recipe} ({run_dir.name})"
    pictures = [curves.plot(run_dir, records, title), *_report_plots(run_dir, title)] if records else []
    _finish(run_dir, code, console, pictures)
    return code
