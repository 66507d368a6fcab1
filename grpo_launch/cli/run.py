"""`grpo run`: compose, plan, write the run directory, start and supervise every process."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_launch.cli.app import RecipesDirOption, app

EXAMPLES = """
[bold]Examples[/]

  grpo run                                         train the embedded CPU recipe (tiny-cpu), ~1 minute
  grpo run launcher=torchrun zero=2                the same under torchrun and DeepSpeed ZeRO-2
  grpo run recipe=qwen7b-server                    vLLM server on GPUs 6-7, trainer on 0-5
  grpo run --dry-run recipe=qwen72b-colocate       print every command and file, write nothing
  grpo run --resume runs/tiny-cpu/20261129-171500  continue from its newest checkpoint
  grpo run --resume runs/tiny-cpu/20261129-171500 trainer.max_steps=40 --force
  grpo run recipe=tiny-cpu-async-lora              proxy + 2 CPU replicas, LoRA adapter versions through the proxy
  grpo run recipe=qwen72b-colocate --rehearse      its whole process graph small, here on CPU, before the GPUs
  grpo run recipe=qwen1.5b-async-lora scheduler=hf-jobs --preflight   the async post's Jobs, its bucket checked first
"""


def _flatten(doc: object, prefix: str = "") -> dict[str, object]:
    if isinstance(doc, dict):
        out: dict[str, object] = {}
        for k, v in doc.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): doc}


def config_changes(old: dict, new: dict) -> list[str]:
    """'key: old -> new' for every key whose value differs."""
    a, b = _flatten(old), _flatten(new)
    return [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def _resume_inputs(run_dir: Path, overrides: list[str], recipes_dir: list[str]) -> tuple[list[str], list[str]]:
    import yaml

    from grpo_launch.contracts.rundir import OVERRIDES_FILE
    from grpo_launch.errors import UserError

    stored_file = run_dir / OVERRIDES_FILE
    if not stored_file.is_file():
        raise UserError(f"{run_dir} is not a grpo-launch run directory (no {OVERRIDES_FILE})", key="--resume")
    stored = yaml.safe_load(stored_file.read_text())
    return (overrides or list(stored["overrides"])), (recipes_dir or list(stored["recipes_dirs"]))


@app.command(epilog=EXAMPLES)
def run(
    overrides: list[str] | None = typer.Argument(
        None, metavar="[recipe=NAME] [KEY=VALUE]...", help="Hydra overrides, as for `grpo plan`."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every command and file; write and start nothing."),
    resume: Path | None = typer.Option(
        None, "--resume", metavar="RUN_DIR", help="Continue a run from its newest checkpoint, with the same config "
                                                  "(its stored overrides when you give none)."),
    force: bool = typer.Option(False, "--force", help="Launch even when the memory estimate says the layout does not "
                               "fit; with --resume, also accept a config that changed since the run."),
    node_rank: int | None = typer.Option(
        None, "--node-rank", metavar="K", help="Start only node K's processes: on each machine of a multi-node plan "
                                               "whose nodes are other machines (the same run.dir on shared storage)."),
    grace_s: float = typer.Option(15.0, "--grace", help="Seconds between SIGTERM and SIGKILL when stopping."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show every line the processes print (TRL's raw "
                                 "log records and progress bars too) instead of the compact training view."),
    multirun: bool = typer.Option(False, "-m", "--multirun", help="Refused: grpo run starts one run at a time; "
                                  "compare the layouts of a sweep with `grpo plan -m` and run the one you pick."),
    preflight: bool = typer.Option(False, "--preflight", help="scheduler=hf-jobs: before any GPU Job, two cpu-basic "
                                   "Jobs check the bucket's mount (read-write and read-only at one path), how soon "
                                   "a file written by one is seen by the other, and that the Jobs reach each other."),
    rehearse: bool = typer.Option(False, "--rehearse", help="Run the recipe's whole process graph small, for real, "
                                  "on this CPU machine (a tiny model, 2 steps, at most 2 loopback nodes), and "
                                  "report what was exercised as is, shrunk, or could not be; `grpo rehearse` too."),
    recipes_dir: list[str] | None = RecipesDirOption,
) -> None:
    """Train: write the run directory, start every process of the plan in order, stop them all together."""
    from rich.console import Console

    from grpo_launch.compose import anchored, compose
    from grpo_launch.contracts.rundir import CONFIG_FILE
    from grpo_launch.errors import UserError
    from grpo_launch.materialize import config_document, new_run_dir, run_files
    from grpo_launch.plan import build_plan

    if multirun:
        raise UserError("grpo run starts one run at a time: -m (a sweep) is for grpo plan -m, which plans every "
                        "combination side by side", key="-m",
                        hint=f"grpo plan -m {' '.join(overrides or [])}, then grpo run with the overrides of the "
                             f"row you pick".replace("  ", " "))
    overrides, dirs = list(overrides or []), list(recipes_dir or [])
    if rehearse:
        from grpo_launch.cli.rehearse import rehearse_recipe

        for flag, given in (("--resume", resume), ("--dry-run", dry_run), ("--node-rank", node_rank),
                            ("--preflight", preflight)):
            if given not in (None, False):
                raise UserError(f"{flag} is for a real run; a rehearsal is a run of its own", key=flag,
                                hint=f"drop {flag}")
        code = rehearse_recipe(overrides, dirs, grace_s=grace_s, verbose=verbose)
        if code:
            raise typer.Exit(code)
        return
    if resume is not None:
        overrides, dirs = _resume_inputs(resume, overrides, dirs)
    composed = anchored(compose(overrides, dirs), Path.cwd())
    the_plan = build_plan(composed)
    if not force:
        from grpo_launch.plan.advisor import check_fit

        check_fit(composed, the_plan)  # an out-of-memory layout fails here, not twenty minutes into the run
    from grpo_launch.cli.launching import nodes_to_run

    nodes = nodes_to_run(the_plan, node_rank)
    console = Console(highlight=False)
    if resume is not None:
        import yaml

        old = yaml.safe_load((resume / CONFIG_FILE).read_text())
        changes = config_changes(old, config_document(composed))
        if changes and not force:
            raise UserError(f"the config changed since {resume} ran:\n    " + "\n    ".join(changes),
                            key="--resume", hint="resume with the same config, or add --force to accept the change")
    if dry_run:
        target = resume or new_run_dir(composed)
        console.print(f"[bold]would write[/] {target}/ (dry run: nothing is written or started)")
        from grpo_launch.plan.launch_script import command_line

        for step in the_plan.prepare:
            console.print(f"[bold]prepare[/] {step.name}: {' '.join(step.argv)}", markup=True)
        for p in the_plan.processes:
            console.print(f"[bold]start[/] {p.name} (node {p.node}): {command_line(p)}", soft_wrap=True)
        for name, text in run_files(composed, the_plan, dirs).items():
            console.rule(name)
            console.print(text, markup=False, soft_wrap=True)
        if the_plan.scheduler.submit:
            console.print(f"[bold]would then run[/] {' '.join(the_plan.scheduler.submit)} (in the run directory)")
        return
    from grpo_launch.cli.launching import start

    result = start(composed, the_plan, dirs, run_dir=resume, nodes=nodes, join=node_rank is not None, grace_s=grace_s,
                   console=console, verbose=verbose, preflight=preflight)[1]
    if result is not None and result.code:
        raise typer.Exit(result.code)
