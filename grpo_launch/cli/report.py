"""`grpo report RUN_DIR`: what a run measured, in the seeds' terms, with its bottleneck and its pictures."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from grpo_launch.cli.app import app

EXAMPLES = """
[bold]Examples[/]

  grpo report runs/tiny-cpu/20261201-185303       the table, the bottleneck, phase_timeline.png
  grpo report runs/tiny-cpu-server/20261201-190000 --json | jq .phase_share
  grpo report runs/qwen7b-server/20261201-190000 --fetch   a SkyPilot run: bring its metrics here first
"""


def fetch_logs(run_dir: Path) -> None:
    """Run the command the run's scheduler gives (its launcher's `logs`) for bringing the nodes' metrics and logs
    into the run directory: SkyPilot's node 0, a Storage Bucket."""
    import shutil
    import subprocess

    from grpo_launch.contracts.rundir import read_plan
    from grpo_launch.contracts.shell import shell_line
    from grpo_launch.errors import UserError
    from grpo_launch.launch.schedulers import LAUNCHERS

    plan = read_plan(run_dir)
    if plan.scheduler is None:
        return
    fetch = LAUNCHERS[plan.scheduler.kind].logs(plan, run_dir).fetch
    if not fetch:
        return  # written here already (this machine, or a Slurm job's shared storage)
    if shutil.which(fetch[0]) is None:
        raise UserError(f"--fetch runs `{shell_line(fetch)}`, and {fetch[0]} is not installed here",
                        key="--fetch", hint=f"install {fetch[0]}, or copy metrics.jsonl and logs/ into "
                                            f"{run_dir} yourself")
    done = subprocess.run(fetch, cwd=run_dir)
    if done.returncode:
        raise UserError(f"`{shell_line(fetch)}` failed (exit {done.returncode})", key="--fetch",
                        hint=f"can this machine reach the {plan.scheduler.kind} job's storage (SkyPilot: is the "
                             f"cluster up, and known to ssh, whose config `sky status` writes)?")


def show_report(run_dir: Path, console, *, plots: bool = True, title: str | None = None) -> None:
    """The report's table, diagnosis and plots for a run directory (read as it is now)."""
    from rich.markup import escape

    from grpo_launch.cli.report_view import findings_text, table
    from grpo_launch.report import diagnosis, run, summary
    from grpo_launch.report import plots as drawing

    data = run.read_run(run_dir)
    report = summary.summarize(data)
    columns = {"measured": summary.rows(report)}
    prediction = data.plan.prediction
    if prediction is not None and prediction.predicted:  # `grpo plan`'s step-time model beside what was measured
        columns["predicted"] = summary.predicted_rows(prediction)
    console.print(table(columns, title=title or f"{data.name} · placement={data.plan.placement} · seed {data.seed}"))
    if "predicted" in columns:
        console.print("[dim]predicted train includes the old policy's log-probability forward, measured as "
                      "score[/]")
    findings = diagnosis.diagnose(report)
    if findings:
        console.print("[bold]bottleneck[/]")
        console.print(findings_text(findings), end="")
    if plots:
        for path in drawing.draw_report(data, data.name):
            console.print(f"[bold]plot[/] {escape(str(path))}")


@app.command(epilog=EXAMPLES)
def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="A run directory (finished, failed or running)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (for scripts); draws nothing."),
    fetch: bool = typer.Option(False, "--fetch", help="First bring the nodes' metrics and logs into RUN_DIR, with "
                               "the command the run's scheduler gives (SkyPilot: rsync from node 0)."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Draw phase_timeline.png (and eval_curve.png) "
                               "into RUN_DIR."),
) -> None:
    """Report a run in the seeds' terms, with its bottleneck and a phase timeline.

    Wall and step time, throughput per training GPU and per GPU held, the phase split, MFU, samples trained,
    staleness, rewards and eval scores; the bottleneck and the knob that moves it; phase_timeline.png. A running run
    is reported as far as it got."""
    from rich.console import Console

    if fetch:
        fetch_logs(run_dir)
    if as_json:
        from grpo_launch.report import diagnosis, run, summary

        data = summary.summarize(run.read_run(run_dir))
        out = data.to_json()
        out["diagnosis"] = [{"kind": f.kind, "text": f.text, "knob": f.knob, "value": f.value}
                            for f in diagnosis.diagnose(data)]
        typer.echo(json.dumps(out, indent=1, default=str))
        return
    show_report(run_dir, Console(highlight=False), plots=plots)
