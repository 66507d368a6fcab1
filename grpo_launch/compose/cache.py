"""A cache of composed recipes. The same recipe files and overrides compose to the same config, so a `grpo plan`
or `grpo run` that composed them before skips Hydra and OmegaConf (about 100 ms, most of `grpo plan`'s own time).

The key is everything the composition reads: the path, size and modification time of every recipe file on the
search path, the overrides as given, and the source of the schema and of the composition code. A recipe file with
an interpolation (`${...}`) makes the composition uncacheable: its value may come from the environment. Entries
are JSON files under `$GRPO_CACHE_DIR` (default `$XDG_CACHE_HOME/grpo-launch/compose`), written atomically; an
unreadable entry is a miss; `GRPO_COMPOSE_CACHE=0` turns the cache off. Only compositions that succeeded are
stored, so a mistake is always reported by the full composition.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpo_launch.compose import schema
from grpo_launch.contracts.typed import build

CODE = Path(__file__).resolve().parents[1]
KEYED_CODE = ("compose", "contracts")  # what a composed config is made by
FORMAT = 1


def enabled() -> bool:
    return os.environ.get("GRPO_COMPOSE_CACHE", "1") != "0"


def cache_dir() -> Path:
    explicit = os.environ.get("GRPO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-launch" / "compose"


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def inputs(dirs: Sequence[Path]) -> str | None:
    """Everything a composition reads but its overrides (read once for the many compositions of a sweep), or None
    when it cannot be cached."""
    parts = []
    for d in dirs:
        for path in sorted(d.rglob("*.yaml")):
            if "${" in path.read_text():
                return None
            parts.append(_stamp(path))
    for room in KEYED_CODE:
        parts += [_stamp(p) for p in sorted((CODE / room).rglob("*.py"))]
    parts.append(_stamp(Path(__file__).with_name("primary") / "config.yaml"))
    return "\n".join(parts)


def key(read: str, overrides: Sequence[str]) -> str:
    """The entry's name for these overrides, over what `inputs` found."""
    return hashlib.sha256("\n".join([f"format {FORMAT}", *overrides, "--", read]).encode()).hexdigest()


def load(entry: str) -> tuple[schema.Config, dict[str, str]] | None:
    try:
        data = json.loads((cache_dir() / f"{entry}.json").read_text())
        return build(schema.Config, data["config"]), data["choices"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(entry: str, config: dict[str, Any], choices: dict[str, str]) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{entry}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"config": config, "choices": choices}))
        tmp.replace(directory / f"{entry}.json")
    except OSError:
        pass  # a cache that cannot be written only costs time
