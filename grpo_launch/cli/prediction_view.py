"""The rich view of a plan's step-time prediction: the phases of one optimizer step, the run's time and GPU-hours."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from grpo_launch.contracts.performance import StepPrediction


def hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def _phases(p: StepPrediction) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name, justify in (("phase", "left"), ("s", "right"), ("share", "right"), ("how", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "how", overflow="fold",
                         style="dim" if name == "how" else "")
    for phase in p.phases:
        share = "beside" if not phase.on_trainer_clock else f"{phase.seconds / p.step_s:.0%}" if p.step_s else "-"
        table.add_row(f"  {phase.name}", f"{phase.seconds:.2f}", share, Text(phase.detail))
    return table


def print_prediction(p: StepPrediction | None, console: Console) -> None:
    if p is None:
        return
    if not p.predicted:
        console.print(f"[bold]step time[/] {escape(p.note)}")
        if p.phases:
            console.print(_phases(p))
        return
    median = f", {p.median_step_s:.1f} s without a sync" if p.median_step_s != p.step_s else ""
    mfu = f" · MFU {p.mfu:.1%}" if p.mfu is not None else ""
    console.print(f"[bold]step time[/] {p.step_s:.1f} s predicted on {escape(p.accelerator)}{median} · "
                  f"{p.samples_per_step:,.0f} completions per step · {p.samples_per_hour_per_gpu:,.0f} per hour "
                  f"per GPU held ({p.gpus_held} GPUs){mfu}")
    console.print(_phases(p))
    console.print(Text(f"  bottleneck: {p.bottleneck}"))
    if p.max_steps is None:
        console.print("  trainer.max_steps is unset: no run time")
    else:
        cost = f", cost {p.cost:,.2f} at {p.gpu_hour_price:g} per GPU-hour" if p.cost is not None else \
            " (set cluster.gpu_hour_price for a cost)"
        console.print(f"  {p.max_steps} steps: {hours(p.run_hours)} h, {hours(p.gpu_hours)} GPU-hours{cost}")
    for assumption in p.assumptions:
        console.print(f"[dim]  assumes {escape(assumption)}; docs/performance-model.md[/]")
