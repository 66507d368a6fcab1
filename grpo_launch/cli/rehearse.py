"""`grpo rehearse` (the same as `grpo run --rehearse`): a recipe's whole process graph, small, for real, on this
CPU machine, before the GPUs are paid for. docs/rehearse.md says what is kept, shrunk, and impossible on a CPU."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from grpo_launch.cli.app import QUOTING_NOTE, GraceOption, OverridesArgument, RecipesDirOption, app, recipe_arguments

if TYPE_CHECKING:
    from rich.console import Console

    from grpo_launch.compose.schema import Config
    from grpo_launch.launch.result import RunResult
    from grpo_launch.plan.rehearse import Feature

EXAMPLES = """
[bold]Examples[/]

  grpo rehearse recipe=qwen72b-colocate            2 loopback nodes, ZeRO-3 + CPU offload, colocated vLLM: ~2 min
  grpo run recipe=qwen72b-colocate --rehearse      the same
  grpo rehearse recipe=qwen1.5b-async-lora         2 vLLM replicas, the proxy, LoRA adapters through it
  grpo rehearse recipe=my-recipe data.path=prompts.jsonl rewards='[{fn: my_rewards.py:score}]'
""" + QUOTING_NOTE
HUB_PROBE_S = 5.0
STATUS_STYLE = {"kept": "green", "shrunk": "yellow", "could not": "red"}


@app.command(epilog=EXAMPLES)
def rehearse(
    overrides: list[str] | None = OverridesArgument,
    grace_s: float = GraceOption,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every line the processes print."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Rehearse a recipe: show its real plan, run its process graph small on this CPU machine (a tiny model of the
    family, 2 steps, at most 2 loopback nodes, real vLLM, the recipe's rewards and data), and report each feature
    as kept, shrunk (from -> to) or could not (why). Exits 0 only when the rehearsal run succeeded."""
    overrides, dirs = recipe_arguments(list(overrides or []), list(recipes_dir or []))
    code = rehearse_recipe(overrides, dirs, grace_s=grace_s, verbose=verbose)
    if code:
        raise typer.Exit(code)


def rehearse_recipe(overrides: list[str], dirs: list[str], *, grace_s: float, verbose: bool) -> int:
    from rich.markup import escape

    from grpo_launch.cli.console import console as plain_console
    from grpo_launch.cli.console import rule
    from grpo_launch.cli.launching import nodes_to_run, start
    from grpo_launch.cli.plan_view import print_plan, processes_table
    from grpo_launch.cli.user_files import check_user_files
    from grpo_launch.compose import anchored, compose
    from grpo_launch.materialize import new_run_dir
    from grpo_launch.plan import build_plan
    from grpo_launch.plan.advisor import check_fit
    from grpo_launch.plan.rehearse import derive, processes_feature

    console = plain_console()
    composed = anchored(compose(overrides, dirs, store=False), Path.cwd())
    real = build_plan(composed)
    check_user_files(composed, real)
    rule(console, escape(f"the recipe: {composed.recipe}"))
    print_plan(real, console=console)
    if not real.memory.fits:
        console.print("[bold red]the recipe's own plan does not fit in memory[/] (above): the rehearsal runs its "
                      "process graph all the same; `grpo plan --suggest` shows layouts that fit")
    rehearsal = derive(composed.config, real, host_memory_gib=host_memory_gib(), hub=hub_problem(composed.config),
                       schedulers=schedulers_here(composed.config), environment=tuple(os.environ))
    rehearsed = dataclasses.replace(composed, recipe=f"{composed.recipe}-rehearsal", config=rehearsal.config)
    the_plan = build_plan(rehearsed)
    the_plan = dataclasses.replace(the_plan, files={**the_plan.files, **rehearsal.files})
    check_fit(rehearsed, the_plan)
    features = (*rehearsal.features, processes_feature(real, the_plan))
    rule(console, escape(f"the rehearsal: {rehearsed.recipe}"))
    console.print(processes_table(the_plan))
    target = new_run_dir(rehearsed)
    # This process's own caches stay out of ~ too: matplotlib's fonts (for the reward curve) go into the run
    # directory, and a built model kept by earlier runs is used but none is added (launch.prepared).
    os.environ.setdefault("MPLCONFIGDIR", str(target.resolve() / "cache" / "matplotlib"))
    if os.environ.get("GRPO_MODEL_CACHE") != "0":
        os.environ["GRPO_MODEL_CACHE"] = "read"
    run_dir, result = start(rehearsed, the_plan, dirs, run_dir=target, nodes=nodes_to_run(the_plan, None),
                            grace_s=grace_s, console=console, verbose=verbose)
    code = result.code if result is not None else 0
    print_report(console, composed.recipe, features, code, result, run_dir)
    return code


def print_report(console: Console, recipe: str, features: tuple[Feature, ...], code: int, result: RunResult | None,
                 run_dir: Path | None) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from grpo_launch.cli.console import rule
    from grpo_launch.contracts.rundir import read_metrics

    rule(console, escape(f"rehearsal report: {recipe}"))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("feature", "the recipe", "the rehearsal", "status", "why"):
        table.add_column(column, overflow="fold")
    for f in features:
        table.add_row(Text(f.name), Text(str(f.real)), Text(str(f.rehearsal) if f.status != "kept" else "as is"),
                      Text(f.status, style=STATUS_STYLE[f.status]), Text(f.why))
    console.print(table)
    if code == 0:
        records = read_metrics(run_dir).training if run_dir is not None else []
        steps = records[-1]["step"] if records else "every"
        console.print(f"[bold green]rehearsal passed[/]: the whole process graph ran, {steps} steps trained")
        return
    if result is not None and result.failures:
        first = result.failures[0]
        console.print("[bold red]rehearsal failed[/] " + escape(
            f"in {first.process}" + (f", {first.rank_error.where}" if first.rank_error else "")
            + f": {first.rank_error.record.error if first.rank_error else first.reason}"))
        console.print(f"  its log: {escape(str(first.log))}")
    else:
        console.print(f"[bold red]rehearsal failed[/] with exit code {code}")
    console.print("  the real run would fail the same way: fix it before the GPUs are paid for")


def host_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def hub_problem(config: Config) -> str | None:
    """None when the recipe's hub dataset can be loaded from here (or it has none), else why not."""
    import urllib.error
    import urllib.request

    data = config.data
    if data.source != "hub":
        return None
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return "HF_HUB_OFFLINE is set"
    url = f"{os.environ.get('HF_ENDPOINT', 'https://huggingface.co').rstrip('/')}/api/datasets/{data.path}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_S):
            return None
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code}"
    except OSError as e:
        return str(getattr(e, "reason", e))


def schedulers_here(config: Config) -> tuple[str, ...]:
    """The schedulers that can run a job from this machine: always grpo-launch's own, and the recipe's where its
    launcher says a rehearsal can run through it here (a Slurm controller answering)."""
    from grpo_launch.launch.schedulers import LAUNCHERS

    here = tuple(name for name, launcher in LAUNCHERS.items() if launcher.node_rank)
    kind = config.scheduler.kind
    return here + ((kind,) if kind not in here and LAUNCHERS[kind].rehearses_here() else ())
