"""What prepare steps create, kept between runs: a step with a cache key (the built-in tiny model, about 9 s to
build here) is built once per key and copied into each run directory after that.

Kept under `$GRPO_MODEL_CACHE_DIR` (default `$XDG_CACHE_HOME/grpo-launch/prepared`, ~/.cache without XDG).
`GRPO_MODEL_CACHE=0` turns it off; `read` uses what is kept and adds nothing (a rehearsal writes only its run
directory). An entry is written under a temporary name and renamed into place, so a half-written one is never read.
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
    """Copy the kept entry for `key` to `target`; its path, or None when there is none (or the cache is off)."""
    entry = root() / key
    if mode() == "0" or not entry.is_dir():
        return None
    shutil.copytree(entry, target)
    return entry


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
