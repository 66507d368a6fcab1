"""`grpo plan`: show what would run where, before any GPU is touched."""

from __future__ import annotations

import json

import typer

from grpo_launch.cli.app import QUOTING_NOTE, OverridesArgument, RecipesDirOption, app, recipe_arguments

EXAMPLES = """
[bold]Examples[/]

  grpo plan                                        the embedded CPU recipe (tiny-cpu)
  grpo plan recipe=qwen72b-colocate                32 ranks on 4 nodes, vLLM TP 8 colocated, sleep level 2
  grpo plan recipe=qwen72b-colocate --memory       with every GPU's and node's memory, phase by phase
  grpo plan recipe=qwen7b-server vllm.tensor_parallel_size=4 trainer.learning_rate=2e-6
  grpo plan ./my-recipe.yaml trainer.learning_rate=2e-6   a recipe file by its path
  grpo plan recipe=qwen1.5b-colocate zero=3 --json | jq '.processes[].argv'
  grpo plan recipe=qwen72b-colocate --dry-run      also print every file grpo run would write
  grpo plan recipe=qwen72b-colocate zero=2 --suggest   why it does not fit, and three layouts that do
  grpo plan recipe=qwen72b-colocate cluster.gpu_hour_price=2.5   the predicted step, GPU-hours and cost
  grpo plan -m recipe=qwen7b-server,qwen7b-colocate vllm.tensor_parallel_size=1,2,4 zero=2,3
                                                   12 layouts side by side (comma lists, range(), choice())
  grpo plan -m recipe=qwen72b-colocate placement.colocate.sleep_level=0,2 zero=3,3-offload --sort throughput --json
""" + QUOTING_NOTE


@app.command(epilog=EXAMPLES)
def plan(
    overrides: list[str] | None = OverridesArgument,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (a stable contract) instead."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Also print the full text of every generated file."),
    memory: bool = typer.Option(False, "--memory", help="Show the memory estimate in full: every GPU and node, "
                                "each phase, what it holds (by default one verdict line for the GPUs and one for "
                                "the nodes' host memory)."),
    suggest: bool = typer.Option(False, "--suggest", help="Also search the knobs left free (placement, ZeRO and "
                                 "offload, vLLM TP, sleep level, gpu_memory_utilization, micro-batch) for the best "
                                 "three layouts that fit in memory, with the overrides to apply."),
    force: bool = typer.Option(False, "--force", help="Plan a layout even when the memory estimate says it does "
                               "not fit."),
    multirun: bool = typer.Option(False, "-m", "--multirun", help="Sweep: plan every combination of the overrides' "
                                  "values (Hydra's sweep grammar: a,b,c, range(1,5), choice(a,b), glob(*) over a "
                                  "group) and print one table, a row per layout, refused ones with their reason."),
    sort: str | None = typer.Option(None, "--sort", metavar="COLUMN", help="With -m: order the rows by a column, "
                                    "best first (throughput, step, gpu-hours, headroom, ranks, fits, vllm-gpus, or "
                                    "a swept key)."),
    max_combinations: int | None = typer.Option(None, "--max-combinations", metavar="N", min=1, help="With -m: "
                                                "the most combinations a sweep may plan (default 1000); a sweep of "
                                                "more is refused before any is planned."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Resolve a recipe into the plan: each GPU's role, each process's command and environment, the files. Every
    check runs but those that read your files (reward files and modules, a files dataset, a local model), which the
    plan names as left to `grpo run` (and `grpo run --dry-run`)."""
    from grpo_launch.cli.user_files import file_checks
    from grpo_launch.compose import compose
    from grpo_launch.errors import UserError
    from grpo_launch.plan import build_plan

    overrides, recipes_dir = recipe_arguments(overrides or [], recipes_dir or [])
    if multirun:
        return _sweep(overrides, recipes_dir, as_json=as_json, sort=sort, dry_run=dry_run, suggest=suggest,
                      memory=memory, limit=max_combinations)
    if sort is not None:
        raise UserError("--sort orders the rows of a sweep", key="--sort", hint="use it with -m")
    composed = compose(overrides, recipes_dir)
    the_plan = build_plan(composed)
    advice = None
    if suggest or not (force or the_plan.memory.fits):
        from grpo_launch.plan.advisor import advise, check_fit

        advice = advise(composed, the_plan)
        if not (force or suggest):
            check_fit(composed, the_plan, advice)  # a misfit is an error; --suggest shows the tables first
    left = file_checks(composed, the_plan)
    if as_json:
        data = the_plan.to_json()
        if suggest:
            data["suggestions"] = [{"overrides": list(s.overrides), "summary": s.summary} for s in advice.suggestions]
        if left:
            data["left_to_run"] = [{"key": c.key, "check": c.what} for c in left]
        typer.echo(json.dumps(data, indent=2))
    else:
        from rich.text import Text

        from grpo_launch.cli.console import console as plain_console
        from grpo_launch.cli.plan_view import print_plan

        console = plain_console()
        print_plan(the_plan, show_files=dry_run, memory_tables=memory or suggest, console=console)
        for c in left:
            console.print(Text.assemble(("left to grpo run", "bold"), f" (it reads your files) {c.key}: {c.what}"),
                          soft_wrap=True)
        if suggest:
            from grpo_launch.cli.memory_view import print_advice

            print_advice(advice, console)
    if suggest and not force:
        check_fit(composed, the_plan, advice)


def _sweep(overrides: list[str], recipes_dir: list[str], *, as_json: bool, sort: str | None, dry_run: bool,
           suggest: bool, memory: bool, limit: int | None) -> None:
    from grpo_launch.compose.sweep import MAX_COMBINATIONS, compose_sweep
    from grpo_launch.errors import UserError
    from grpo_launch.plan.sweep import plan_sweep, sort_rows

    for flag, given in (("--dry-run", dry_run), ("--suggest", suggest), ("--memory", memory)):
        if given:
            raise UserError(f"{flag} shows one plan; -m compares many", key=flag,
                            hint=f"pick a row of the sweep and run grpo plan {flag} with its overrides")
    sweep, composed = compose_sweep(overrides, recipes_dir, limit=limit or MAX_COMBINATIONS)
    rows = plan_sweep(sweep, composed)
    if sort is not None:
        rows = sort_rows(rows, sort, sweep.keys)
    if as_json:
        from grpo_launch.cli.sweep_view import sweep_json

        typer.echo(json.dumps(sweep_json(sweep.keys, rows), indent=2))
    else:
        from grpo_launch.cli.sweep_view import print_sweep

        print_sweep(sweep.keys, rows)
    if all(r.plan is None for r in rows):  # nothing to compare: as bad as a single plan that is refused
        first = rows[0].error
        raise UserError(f"none of the {len(rows)} combinations can be planned; the first: {first.message}",
                        key=first.key, hint=first.hint, origin=first.origin)
