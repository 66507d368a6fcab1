"""What prepare steps create, kept between runs: a step with a cache key (the built-in tiny model, about 9 s to
build here) is built once per key and copied into each run directory after that.

Kept under `$GRPO_MODEL_CACHE_DIR` (default `$XDG_CACHE_HOME/grpo-launch/prepared`, ~/.cache without XDG).
`GRPO_MODEL_CACHE=0` turns it off; `read` uses what is kept and adds nothing (a rehearsal writes only its run
directory). An entry, and its copy in a run directory, are written under a temporary name and renamed into place,
so a half-written one is never read (a copy cut by a full disk or a SIGKILL left the model half there, and every
later start took it as built).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from grpo_launch.contracts import userdirs

MODES = ("1", "read", "0")


def mode() -> str:
    value = os.environ.get("GRPO_MODEL_CACHE", "1")
    return value if value in MODES else "1"


def root() -> Path:
    return userdirs.cache_dir("prepared", "GRPO_MODEL_CACHE_DIR")


def restore(key: str, target: Path) -> Path | None:
    """Copy the kept entry for `key` to `target`, whole or not at all; its path, or None when there is none (or the
    cache is off). A copy that fails (a full disk) raises, leaving nothing at `target`."""
    entry = root() / key
    if mode() == "0" or not entry.is_dir():
        return None
    for stale in target.parent.glob(f".{target.name}.*.partial"):  # a copy a killed start left behind
        shutil.rmtree(stale, ignore_errors=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        shutil.copytree(entry, partial, copy_function=_copy_or_stop)
        partial.rename(target)
    except _CopyFailed as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise e.error from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return entry


class _CopyFailed(Exception):
    """A file's copy failed: copytree goes on past an OSError (and keeps only its text), this stops it."""

    def __init__(self, error: OSError) -> None:
        self.error = error


def _copy_or_stop(source: str, dest: str) -> str:
    try:
        return shutil.copy2(source, dest)
    except OSError as e:
        raise _CopyFailed(e) from e


def keep(key: str, source: Path) -> None:
    """Keep what a step created for the runs after this one (unless the cache is off or read-only)."""
    if mode() != "1":
        return
    entry = root() / key
    if entry.exists():
        return
    partial = entry.with_name(f".{key}.{os.getpid()}.partial")
    try:
        shutil.copytree(source, partial)
        partial.rename(entry)
    except OSError:  # a full disk or a read-only cache costs the next run a build, nothing more
        shutil.rmtree(partial, ignore_errors=True)
