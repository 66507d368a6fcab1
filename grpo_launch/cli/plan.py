"""`grpo plan`: show what would run where, before any GPU is touched."""

from __future__ import annotations

import json

import typer

from grpo_launch.cli import RecipesDirOption, app

EXAMPLES = """
[bold]Examples[/]

  grpo plan                                        the embedded CPU recipe (tiny-cpu)
  grpo plan recipe=qwen72b-colocate                32 ranks on 4 nodes, vLLM TP 8 colocated, sleep level 2
  grpo plan recipe=qwen7b-server vllm.tensor_parallel_size=4 trainer.learning_rate=2e-6
  grpo plan recipe=qwen1.5b-colocate zero=3 --json | jq '.processes[].argv'
  grpo plan recipe=qwen72b-colocate --dry-run      also print every file grpo run would write
"""


@app.command(epilog=EXAMPLES)
def plan(
    overrides: list[str] | None = typer.Argument(  # noqa: UP007 (typer needs Optional)
        None, metavar="[recipe=NAME] [KEY=VALUE]...",
        help="Hydra overrides: recipe=NAME, a group option (placement=server, zero=3-offload, cluster=...), "
             "or any key (vllm.tensor_parallel_size=4, trainer.learning_rate=1e-6)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (a stable contract) instead."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Also print the full text of every generated file."),
    recipes_dir: list[str] | None = RecipesDirOption,  # noqa: UP007
) -> None:
    """Resolve a recipe into the plan: each GPU's role, each process's command and environment, the files."""
    from grpo_launch.compose import compose
    from grpo_launch.plan import build_plan

    the_plan = build_plan(compose(overrides or [], recipes_dir or []))
    if as_json:
        typer.echo(json.dumps(the_plan.to_json(), indent=2))
        return
    from grpo_launch.view import print_plan

    print_plan(the_plan, show_files=dry_run)
