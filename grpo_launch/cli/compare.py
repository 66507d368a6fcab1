"""`grpo compare RUN_DIR RUN_DIR ...`: runs side by side, ratios against the first, reward parity."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from grpo_launch.cli.app import app

EXAMPLES = """
[bold]Examples[/]

  grpo compare runs/tiny-cpu-colocate/A runs/tiny-cpu-server/B     colocate against server, both normalisations
  grpo compare runs/tiny-cpu-colocate/* runs/tiny-cpu-server/*     every seed: parity of the pooled layouts
  grpo compare RUN_A RUN_B --json | jq .parity
"""


@app.command(epilog=EXAMPLES)
def compare(
    run_dirs: list[Path] = typer.Argument(..., metavar="RUN_DIR RUN_DIR...", help="Two or more run directories; "
                                          "the first is the baseline."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON; draws nothing."),
    out: Path = typer.Option(Path("compare.png"), "--out", metavar="PNG", help="Where to draw the overlaid reward "
                             "curves."),
) -> None:
    """Compare runs of one task side by side, in the seeds' terms, and test their rewards for parity.

    The report's table with a column per run; against the first run: throughput per training GPU (the colocate
    post's normalisation, derived from the two plans), per GPU held, step time and wall time for the same samples;
    the reward curves overlaid; and whether the rewards are at parity (Welch's t-test on the last quarter's steps).
    Runs of another task or reward are refused."""
    from rich.console import Console

    from grpo_launch.cli.report_view import table
    from grpo_launch.errors import UserError
    from grpo_launch.report import compare as comparing
    from grpo_launch.report import plots, run, summary

    if len(run_dirs) < 2:
        raise UserError("compare needs at least two run directories", key="RUN_DIR",
                        hint="grpo compare RUN_A RUN_B (the first is the baseline)")
    reports = [summary.summarize(run.read_run(d)) for d in run_dirs]
    comparison = comparing.compare(reports)
    if as_json:
        typer.echo(json.dumps(comparison.to_json(), indent=1, default=str))
        return
    console = Console(highlight=False)
    headers = [f"{i}: {r.run.plan.recipe}\n{r.run.path.name}\nseed {r.run.seed}" for i, r in enumerate(reports)]
    console.print(table({h: summary.rows(r) for h, r in zip(headers, reports, strict=True)}))
    first = reports[0].run.name
    for report, found in zip(reports[1:], comparison.ratios, strict=True):
        console.print(f"\n[bold]{report.run.name}[/] against [bold]{first}[/] (throughput above 1: faster; times "
                      f"above 1: slower)")
        for ratio in found:
            value = "-" if ratio.value is None else f"{ratio.value:.3f}x"
            console.print(f"  {ratio.label:55} {value:>9}  {ratio.how}", soft_wrap=True)
    console.print(f"\n[bold]reward parity[/] ({comparing.STATISTIC})", soft_wrap=True)
    for name, members in comparison.groups:
        seeds = ", ".join(str(r.run.seed) for r in members)
        console.print(f"  layout {name}: {len(members)} run(s), seed(s) {seeds}", soft_wrap=True)
    for found in comparison.parity:
        console.print(f"  {found}", soft_wrap=True)
    if not comparison.parity:
        console.print("  one layout only: nothing to test")
    console.print(f"[bold]plot[/] {plots.draw_overlay(comparison, out)}")
