"""Materialize: a plan -> a run directory. The only stage that writes files before launch.

    runs/<recipe>/<timestamp>/
      config.yaml      the composed config, every key (what the run used)
      overrides.yaml   the recipe, command-line overrides and recipe directories (what `--resume` re-composes)
      plan.json        the plan (what the trainer entrypoint and the supervisor read)
      deepspeed.json, accelerate.yaml, launch.sh   the generated files, reusable without grpo-launch
      rewards/         reward functions given as files, copied so the run is self-contained
      logs/            one log per process

A new run directory is written under a temporary name and renamed into place, so a failure leaves nothing
half-written.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

from grpo_launch.compose import Composed
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import (
    CONFIG_FILE,
    LOGS_DIR,
    OVERRIDES_FILE,
    PLAN_FILE,
    REWARDS_DIR,
    ComposedConfig,
    Overrides,
    config_text,
    overrides_text,
    plan_text,
    same_plan,
)
from grpo_launch.contracts.shell import shell_word
from grpo_launch.errors import UserError
from grpo_launch.plan.documents import document_text


def composed_config(composed: Composed) -> ComposedConfig:
    return ComposedConfig(composed.recipe, composed.choices, dataclasses.asdict(composed.config))


def run_files(composed: Composed, plan: Plan, recipe_dirs: list[str]) -> dict[str, str]:
    """Every file of a run directory, by relative path, as text."""
    files = {
        CONFIG_FILE: config_text(composed_config(composed)),
        OVERRIDES_FILE: overrides_text(Overrides(composed.recipe, tuple(composed.overrides),
                                                 tuple(str(Path(d).resolve()) for d in recipe_dirs))),
        PLAN_FILE: plan_text(plan),
    }
    for name, document in plan.files.items():
        files[name] = document_text(name, document)
    return files


def reward_sources(composed: Composed) -> list[Path]:
    """Reward functions given as 'file.py:function': the files to copy (the plan refused two of one name; `grpo run`
    checked each before writing anything, `launch.preflight`)."""
    return [Path(where).expanduser() for r in composed.config.rewards
            if (where := r.fn.rpartition(":")[0]).endswith(".py")]


def new_run_dir(composed: Composed) -> Path:
    """runs/<recipe>/<timestamp> (run.root), or run.dir when the recipe sets it."""
    if composed.config.run.dir:
        return Path(composed.config.run.dir).expanduser()
    base = Path(composed.config.run.root).expanduser() / composed.recipe / time.strftime("%Y%m%d-%H%M%S")
    candidate, n = base, 1
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate


def _run_dir_key(composed: Composed) -> str:
    return "run.dir" if composed.config.run.dir else "run.root"


def check_run_dir(composed: Composed, target: Path) -> None:
    """A run directory can be written at `target` (what `grpo run --dry-run` checks, writing nothing): the nearest
    folder of it that exists is a folder this user may write in."""
    key = _run_dir_key(composed)
    existing = target
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"cannot write the run directory {target}: {existing} is not a directory", key=key,
                        hint=f"set {key} to a directory, or a path that does not exist yet")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write the run directory {target}: {existing} is not writable", key=key,
                        hint=f"set {key} to a directory you may write in")


def write_files(root: Path, files: dict[str, str], rewards: list[Path]) -> None:
    (root / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        if name.endswith(".sh"):
            path.chmod(0o755)
    if rewards:
        (root / REWARDS_DIR).mkdir(exist_ok=True)
        for source in rewards:
            shutil.copy2(source, root / REWARDS_DIR / source.name)


def materialize(composed: Composed, plan: Plan, recipe_dirs: list[str], run_dir: Path | None = None, *,
                join: bool = False) -> Path:
    """Write a new run directory (or, given `run_dir` of an existing run, rewrite its files in place). `join`: one
    node of several sharing `run.dir`; a run directory of the same plan, written by another node, is used as is."""
    files = run_files(composed, plan, recipe_dirs)
    rewards = reward_sources(composed)
    target = run_dir or new_run_dir(composed)
    check_run_dir(composed, target)
    try:
        return _written(target, plan, files, rewards, resumed=run_dir is not None and run_dir.exists(), join=join)
    except OSError as e:  # the disk, not the plan: full, read-only, a name the file system refuses
        raise UserError(f"cannot write the run directory {target}: {e.strerror or e}", key=_run_dir_key(composed),
                        hint="free space, or choose another directory") from None


def _written(target: Path, plan: Plan, files: dict[str, str], rewards: list[Path], *, resumed: bool,
             join: bool) -> Path:
    if resumed:
        write_files(target, files, rewards)
        return target
    if join and same_plan(target, plan):  # another node of the run wrote it
        return target
    if target.exists():
        raise UserError(f"run directory {target} already exists", key="run.dir",
                        hint=f"choose another run.dir, or continue its run with `grpo run --resume "
                             f"{shell_word(str(target))}` (refused while it still runs)")
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_files(tmp, files, rewards)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if join and same_plan(target, plan):  # another node renamed its copy into place first
            return target
        raise
    return target
