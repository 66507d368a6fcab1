"""`grpo plan`: show what would run where, before any GPU is touched."""

from __future__ import annotations

import json

import typer

from grpo_launch.cli.app import RecipesDirOption, app

EXAMPLES = """
[bold]Examples[/]

  grpo plan                                        the embedded CPU recipe (tiny-cpu)
  grpo plan recipe=qwen72b-colocate                32 ranks on 4 nodes, vLLM TP 8 colocated, sleep level 2
  grpo plan recipe=qwen7b-server vllm.tensor_parallel_size=4 trainer.learning_rate=2e-6
  grpo plan recipe=qwen1.5b-colocate zero=3 --json | jq '.processes[].argv'
  grpo plan recipe=qwen72b-colocate --dry-run      also print every file grpo run would write
  grpo plan recipe=qwen72b-colocate zero=2 --suggest   why it does not fit, and three layouts that do
"""


@app.command(epilog=EXAMPLES)
def plan(
    overrides: list[str] | None = typer.Argument(
        None, metavar="[recipe=NAME] [KEY=VALUE]...",
        help="Hydra overrides: recipe=NAME, a group option (placement=server, zero=3-offload, cluster=...), "
             "or any key (vllm.tensor_parallel_size=4, trainer.learning_rate=1e-6)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (a stable contract) instead."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Also print the full text of every generated file."),
    suggest: bool = typer.Option(False, "--suggest", help="Also search the knobs left free (placement, ZeRO and "
                                 "offload, vLLM TP, sleep level, gpu_memory_utilization, micro-batch) for the best "
                                 "three layouts that fit in memory, with the overrides to apply."),
    force: bool = typer.Option(False, "--force", help="Plan a layout even when the memory estimate says it does "
                               "not fit."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Resolve a recipe into the plan: each GPU's role, each process's command and environment, the files."""
    from grpo_launch.compose import compose
    from grpo_launch.plan import build_plan

    composed = compose(overrides or [], recipes_dir or [])
    the_plan = build_plan(composed)
    advice = None
    if suggest or not (force or the_plan.memory.fits):
        from grpo_launch.plan.advisor import advise, check_fit

        advice = advise(composed, the_plan)
        if not (force or suggest):
            check_fit(composed, the_plan, advice)  # a misfit is an error; --suggest shows the tables first
    if as_json:
        data = the_plan.to_json()
        if suggest:
            data["suggestions"] = [{"overrides": list(s.overrides), "summary": s.summary} for s in advice.suggestions]
        typer.echo(json.dumps(data, indent=2))
    else:
        from grpo_launch.cli.plan_view import print_plan

        print_plan(the_plan, show_files=dry_run)
        if suggest:
            from rich.console import Console

            from grpo_launch.cli.memory_view import print_advice

            print_advice(advice, Console(highlight=False))
    if suggest and not force:
        check_fit(composed, the_plan, advice)
