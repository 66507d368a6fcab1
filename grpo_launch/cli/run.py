"""`grpo run`: compose, plan, write the run directory, start and supervise every process."""

from __future__ import annotations

from pathlib import Path

import typer

from grpo_launch.cli.app import QUOTING_NOTE, GraceOption, OverridesArgument, RecipesDirOption, app, recipe_arguments

EXAMPLES = """
[bold]Examples[/]

  grpo run                                         train the embedded CPU recipe (tiny-cpu), ~1 minute
  grpo run launcher=torchrun zero=2                the same under torchrun and DeepSpeed ZeRO-2
  grpo run recipe=qwen7b-server                    vLLM server on GPUs 6-7, trainer on 0-5
  grpo run --dry-run recipe=qwen72b-colocate       print every command and file, write nothing
  grpo run --resume runs/tiny-cpu/20261129-171500  continue from its newest checkpoint
  grpo run --resume runs/tiny-cpu/20261129-171500 trainer.max_steps=40 --force
  grpo run --resume runs/tiny-cpu/20261129-171500 --from-scratch   it saved no checkpoint: train it again
  grpo run recipe=tiny-cpu-async-lora              proxy + 2 CPU replicas, LoRA adapter versions through the proxy
  grpo run recipe=qwen72b-colocate --rehearse      its whole process graph small, here on CPU, before the GPUs
  grpo run recipe=qwen1.5b-async-lora scheduler=hf-jobs --preflight   the async post's Jobs, its bucket checked first
""" + QUOTING_NOTE


def config_changes(old: dict, new: dict) -> list[str]:
    """'key: old -> new' for every key whose value differs. A key the schema gained since the run (absent from its
    config.yaml) at its default is no change: it did what the default does."""
    from grpo_launch.compose.origins import flatten
    from grpo_launch.compose.schema import schema_keys

    a, b = flatten(old), flatten(new)
    defaults = {key: default for key, _, default, _ in schema_keys()}
    return [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not (k not in a and k in defaults and b.get(k) == defaults[k])]


def _resumed(run_dir: Path, overrides: list[str], recipes_dir: list[str]) -> tuple[list[str], list[str], dict]:
    """What a resumed run composes: the stored overrides and then the given ones, the given recipe directories ahead
    of the stored ones; and the config the run had. The run's recipe, scheduler and run directory stay."""
    from grpo_launch.compose.grammar import parse_override
    from grpo_launch.contracts.rundir import read_config, read_overrides
    from grpo_launch.errors import UserError

    stored = read_overrides(run_dir, key="--resume")
    config = read_config(run_dir, key="--resume")
    kept = {"recipe": stored.recipe, "scheduler": config.choices.get("scheduler"),
            "scheduler.kind": (config.values.get("scheduler") or {}).get("kind"), "run.dir": str(run_dir),
            "run.root": (config.values.get("run") or {}).get("root")}
    for text in overrides:
        o = parse_override(text)
        key = o.key_or_group
        if key in kept and (o.is_delete() or str(o.value()) not in (kept[key], str(kept[key]))):
            raise UserError(f"--resume continues {run_dir} with {key}={kept[key]}; '{text}' would change it", key=key,
                            hint="a resumed run keeps its recipe, scheduler and run directory: start a new run for "
                                 "another")
    return [*stored.overrides, *overrides], list(dict.fromkeys([*recipes_dir, *stored.recipes_dirs])), \
        config.document()


def check_resumable(run_dir: Path, from_scratch: bool) -> None:
    """A resumed run resumes from a checkpoint: one that has none would silently train again from step 0 (and
    overwrite its final model), so that takes --from-scratch; with a checkpoint there, --from-scratch is refused.
    Where the run's checkpoints are kept elsewhere (SkyPilot's node 0, the Jobs' bucket) the trainer looks there."""
    from grpo_launch.contracts.rundir import checkpoints_of, read_plan, resumable_checkpoints
    from grpo_launch.contracts.schedulers import declared
    from grpo_launch.errors import UserError

    plan = read_plan(run_dir, key="--resume")
    if declared(plan.scheduler.kind).logs_elsewhere:
        return
    facts = plan.trainer_facts
    output = checkpoints_of(run_dir, facts.output_dir)
    found = resumable_checkpoints(output, marked=plan.marks_checkpoints)
    if found and from_scratch:
        raise UserError(f"--from-scratch: {run_dir} has {found[0].name} to resume from", key="--from-scratch",
                        hint="drop --from-scratch to resume from it, or start a new run to train from step 0")
    if found or from_scratch:
        return
    why = ("it saves none, trainer.save_strategy=no" if not facts.saves_checkpoints else
           f"no checkpoint in {output} is whole, the run stopped before its first save")
    raise UserError(f"--resume {run_dir}: there is no checkpoint to resume from ({why}), and it would train again "
                    f"from step 0", key="--resume",
                    hint="add --from-scratch to train it again from step 0 in its run directory, or start a new run")


@app.command(epilog=EXAMPLES)
def run(
    overrides: list[str] | None = OverridesArgument,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every command and file; write and start nothing."),
    resume: Path | None = typer.Option(
        None, "--resume", metavar="RUN_DIR", help="Continue a run from its newest checkpoint, with its stored "
                                                  "overrides; KEY=VALUE adds to them (a changed value needs --force). "
                                                  "The run's recipe, scheduler and run directory stay."),
    force: bool = typer.Option(False, "--force", help="Launch even when the memory estimate says the layout does not "
                               "fit; with --resume, also accept a config that changed since the run."),
    from_scratch: bool = typer.Option(False, "--from-scratch", help="With --resume of a run that has no checkpoint "
                                      "(it saves none, or stopped before its first): train it again from step 0 in "
                                      "its run directory. Without it such a resume is refused."),
    node_rank: int | None = typer.Option(
        None, "--node-rank", metavar="K", help="Start only node K's processes: on each machine of a multi-node plan "
                                               "whose nodes are other machines (the same run.dir on shared storage)."),
    grace_s: float = GraceOption,
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
    from rich.markup import escape
    from rich.text import Text

    from grpo_launch.cli.console import console as plain_console
    from grpo_launch.cli.console import rule
    from grpo_launch.cli.user_files import check_user_files
    from grpo_launch.compose import anchored, compose
    from grpo_launch.contracts.shell import shell_line
    from grpo_launch.errors import UserError
    from grpo_launch.materialize import check_run_dir, composed_config, new_run_dir, run_files
    from grpo_launch.plan import build_plan

    if multirun:
        raise UserError("grpo run starts one run at a time: -m (a sweep) is for grpo plan -m, which plans every "
                        "combination side by side", key="-m",
                        hint=f"{shell_line(['grpo', 'plan', '-m', *(overrides or [])])}, then grpo run with the "
                             f"overrides of the row you pick")
    overrides, dirs = recipe_arguments(list(overrides or []), list(recipes_dir or []))
    if rehearse:
        from grpo_launch.cli.rehearse import rehearse_recipe

        for flag, given in (("--resume", resume), ("--from-scratch", from_scratch), ("--dry-run", dry_run),
                            ("--node-rank", node_rank), ("--preflight", preflight)):
            if given not in (None, False):
                raise UserError(f"{flag} is for a real run; a rehearsal is a run of its own", key=flag,
                                hint=f"drop {flag}")
        code = rehearse_recipe(overrides, dirs, grace_s=grace_s, verbose=verbose)
        if code:
            raise typer.Exit(code)
        return
    old = None
    if resume is not None:
        overrides, dirs, old = _resumed(resume, overrides, dirs)
    composed = anchored(compose(overrides, dirs), Path.cwd())
    the_plan = build_plan(composed)
    if not force:
        from grpo_launch.plan.advisor import check_fit

        check_fit(composed, the_plan)  # an out-of-memory layout fails here, not twenty minutes into the run
    from grpo_launch.cli.launching import nodes_to_run

    nodes = nodes_to_run(the_plan, node_rank)
    if old is not None:
        changes = config_changes(old, composed_config(composed).document())
        if changes and not force:
            raise UserError(f"the config changed since {resume} ran:\n    " + "\n    ".join(changes),
                            key="--resume", hint="resume with the same config, or add --force to accept the change")
        check_resumable(resume, from_scratch)
    elif from_scratch:
        raise UserError("--from-scratch goes with --resume: a new run starts from step 0 anyway", key="--from-scratch",
                        hint="drop --from-scratch")
    target = resume or new_run_dir(composed)
    check_user_files(composed, the_plan)
    try:
        check_run_dir(composed, target)
    except UserError as e:
        raise composed.origins.locate(e, composed.config) from None
    console = plain_console()
    if dry_run:
        from grpo_launch.launch.schedulers import LAUNCHERS
        from grpo_launch.launch.schedulers.base import Options

        launcher = LAUNCHERS[the_plan.scheduler.kind]
        if not launcher.missing(the_plan):  # what `grpo run` checks here before it writes or starts anything
            launcher.prepare(the_plan, Options(grace_s=grace_s, nodes=tuple(nodes), preflight=preflight), console)
        console.print(f"[bold]would write[/] {escape(str(target))}/ (dry run: nothing is written or started)",
                      soft_wrap=True)
        from grpo_launch.plan.launch_script import command_line

        for step in the_plan.prepare:
            console.print(Text.assemble(("prepare", "bold"), f" {step.name}: {shell_line(step.argv)}"))
        for p in the_plan.processes:
            console.print(Text.assemble(("start", "bold"), f" {p.name} (node {p.node}): {command_line(p)}"),
                          soft_wrap=True)
        for name, text in run_files(composed, the_plan, dirs).items():
            rule(console, escape(name))
            console.print(text, markup=False, soft_wrap=True)
        if the_plan.scheduler.submit:
            submit = launcher.submit_command(the_plan, target.resolve())
            console.print(Text.assemble(("would then run", "bold"), f" {shell_line(submit)} (in the run directory)"))
        return
    from grpo_launch.cli.launching import start

    result = start(composed, the_plan, dirs, run_dir=resume, nodes=nodes, join=node_rank is not None, grace_s=grace_s,
                   console=console, verbose=verbose, preflight=preflight)[1]
    if result is not None and result.code:
        raise typer.Exit(result.code)
