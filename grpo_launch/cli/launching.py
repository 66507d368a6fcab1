"""Starting a planned run, for `grpo run` and `grpo rehearse`: write its run directory, then start it through its
scheduler's launcher (`launch.schedulers`: supervised here, or submitted and followed); the metrics and the reward
curve at the end."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from rich.console import Console

    from grpo_launch.compose import Composed
    from grpo_launch.launch.result import RunResult
    from grpo_launch.launch.schedulers.base import Launcher
    from grpo_launch.plan import Plan


def nodes_to_run(plan: Plan, node_rank: int | None) -> list[int]:
    """The nodes this `grpo run` starts: --node-rank's, or every node when all of them are this machine (or when a
    scheduler's job starts them)."""
    from grpo_launch.errors import UserError
    from grpo_launch.launch.schedulers import LAUNCHERS

    by_hand = [name for name, launcher in LAUNCHERS.items() if launcher.node_rank]
    kind = plan.scheduler.kind
    if node_rank is not None:
        if not LAUNCHERS[kind].node_rank:
            raise UserError(f"--node-rank is for scheduler={'|'.join(by_hand)}; the {kind} job starts every node "
                            f"itself", key="--node-rank", hint="drop --node-rank")
        if not 0 <= node_rank < plan.nodes:
            raise UserError(f"--node-rank {node_rank} is not a node of this plan (0..{plan.nodes - 1})",
                            key="--node-rank")
        return [node_rank]
    if LAUNCHERS[kind].node_rank and len(plan.scheduler.groups) > 1:
        others = ", ".join(f"scheduler={name}" for name, launcher in LAUNCHERS.items() if not launcher.node_rank)
        raise UserError(f"the {plan.nodes} nodes of this plan are other machines ({plan.scheduler.addresses})",
                        key="--node-rank", hint=f"start `grpo run --node-rank K` on each machine with the same run.dir "
                                                f"on shared storage, or let a scheduler do it: {others}")
    return list(range(plan.nodes))


def start(composed: Composed, the_plan: Plan, dirs: list[str], *, run_dir: Path | None = None, nodes: list[int],
          join: bool = False, grace_s: float, console: Console, verbose: bool,
          preflight: bool = False) -> tuple[Path, RunResult | None]:
    """Write the run directory (`run_dir`: a run's to continue, or a new one's path; default: new under run.root)
    and start it through its scheduler: the run directory, and how the run ended (None when its scheduler is not
    installed here and nothing was started, after saying how to start it)."""
    from grpo_launch.contracts.rundir import clear_node_failures, release_run_lock
    from grpo_launch.contracts.shell import shell_line, shell_word
    from grpo_launch.errors import UserError
    from grpo_launch.launch.schedulers import LAUNCHERS
    from grpo_launch.launch.schedulers.base import Options
    from grpo_launch.materialize import materialize
    from grpo_launch.report.plots import CurvePlotter

    launcher = LAUNCHERS[the_plan.scheduler.kind]
    if preflight and not launcher.preflight:
        able = ", ".join(f"scheduler={name}" for name, other in LAUNCHERS.items() if other.preflight)
        raise UserError(f"--preflight checks storage and network shared by separately started machines ({able}); "
                        f"scheduler={launcher.name} has none to check", key="--preflight", hint="drop --preflight")
    options = Options(grace_s=grace_s, verbose=verbose, nodes=tuple(nodes), join=join, preflight=preflight)
    missing = launcher.missing(the_plan)
    locked = None  # the run directory whose nodes this `grpo run` holds (`contracts.rundir.RunLock`)
    try:
        if run_dir is not None and run_dir.exists() and not missing:  # before anything is checked or written again
            locked = _lock(launcher, the_plan, run_dir.resolve(), nodes)
        started = the_plan if missing else launcher.prepare(the_plan, options, console)
        run_dir = materialize(composed, the_plan, dirs, run_dir=run_dir, join=join).resolve()
        if locked is None and not missing:
            locked = _lock(launcher, the_plan, run_dir, nodes)
        if not join:  # a resumed run's nodes start afresh: an earlier run's failure records are not this one's
            clear_node_failures(run_dir, range(the_plan.nodes))
        console.print(f"[bold]run directory[/] {escape(str(run_dir))} ({escape(launcher.reach)})")
        if missing:
            console.print(f"[yellow]{escape(missing)}[/]")
            submit = shell_line(launcher.submit_command(the_plan, run_dir))
            console.print(f"  cd {shell_word(str(run_dir))} && {submit}", markup=False)
            return run_dir, None
        keeps = launcher.keeps_metrics(the_plan, options)
        title = f"{composed.recipe} ({run_dir.name})"
        plotter = CurvePlotter(run_dir, title, also=lambda: _report_plots(run_dir, title)) if keeps else None
        result = launcher.run(started, run_dir, console, options)
        if plotter is not None:
            plotter.finish()
        _finish(run_dir, result.code, console, [plotter.curve, *plotter.drawn] if plotter else [], draw=keeps)
        return run_dir, result
    finally:
        if locked is not None:
            release_run_lock(locked, nodes, os.getpid(), socket.gethostname())


def _lock(launcher: Launcher, plan: Plan, run_dir: Path, nodes: list[int]) -> Path:
    """This `grpo run`'s hold on `nodes` of `run_dir`; refused while another holds one of them, or while the jobs an
    earlier one submitted still run by the scheduler's own record (its `grpo run` gone, the job not)."""
    from grpo_launch.contracts.rundir import RUN_LOCK, release_run_lock, take_run_lock
    from grpo_launch.errors import UserError

    pid, host = os.getpid(), socket.gethostname()
    held = take_run_lock(run_dir, nodes, pid, host)
    if held is not None:
        raise UserError(f"{run_dir} is running: its node {held.node} is held by {held.holder}", key="--resume",
                        hint=f"wait for that run to end, or `grpo stop {run_dir}`; if its machine went down with it, "
                             f"remove {run_dir / RUN_LOCK.format(node=held.node)}")
    if (job := launcher.running(plan, run_dir)) is not None:
        release_run_lock(run_dir, nodes, pid, host)
        raise UserError(f"{run_dir} is running: {job}, which an earlier `grpo run` submitted", key="--resume",
                        hint=f"`grpo stop {run_dir}` ends it; resume it after that")
    return run_dir


def _report_plots(run_dir: Path, title: str) -> list[Path]:
    from grpo_launch.report import plots, run

    return plots.draw_report(run.read_run(run_dir, fetch_hint=False), title)


def _finish(run_dir: Path, code: int, console: Console, pictures: list[Path | None], *, draw: bool = True) -> None:
    """The report's table and bottleneck (what `grpo report` shows), the pictures drawn, the run directory; paths as
    written (never markup)."""
    from grpo_launch.contracts.rundir import read_metrics

    if draw and read_metrics(run_dir).training:
        from grpo_launch.cli.report import show_report

        show_report(run_dir, console, plots=False, title=f"[bold]report[/] ({escape(run_dir.name)})")
        for picture in pictures:
            if picture is not None:
                console.print(f"[bold]plot[/] {escape(str(picture))}")
    console.print(f"[bold]{'done' if code == 0 else 'failed'}[/] run directory: {escape(str(run_dir))}")
