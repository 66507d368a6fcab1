"""A cache of composed recipes. The same recipe files and overrides compose to the same config, so a `grpo plan`
or `grpo run` that composed them before skips Hydra and OmegaConf (about 100 ms, most of `grpo plan`'s own time).

The key is everything a composition depends on, by content:
- every `*.yaml` file under each directory of the search path, symlinked folders and files followed: its path
  relative to its directory and a hash of its bytes (so `cp -p`, `rsync -a` or `tar x`, which keep a file's size
  and modification time, still change the key);
- the overrides as given;
- the versions of Hydra and OmegaConf, read from their sources without importing them, and grpo-launch's composing
  code by content (`compose/`, `contracts/`: what makes a `Config`, so a new version or a development edit alike).

A composition whose config holds an interpolation (`${...}`: from a recipe file, a group option file or the command
line) is never stored, because a resolver's value can change between runs (`${oc.env:X}`, `${now:...}`). Only
compositions that succeeded are stored, so a mistake is always reported by the full composition. Entries are JSON
files under `$GRPO_CACHE_DIR` (default `$XDG_CACHE_HOME/grpo-launch/compose`), written atomically; an unreadable
entry is a miss. At most `MAX_ENTRIES` are kept: a hit marks its entry used, and storing past the bound removes the
least recently used. `GRPO_COMPOSE_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from grpo_launch.compose import schema
from grpo_launch.contracts import userdirs
from grpo_launch.contracts.typed import build

CODE = Path(__file__).resolve().parents[1]
KEYED_CODE = ("compose", "contracts")  # what a composed config is made by
# Where each library states its version: read as text, so a cache hit imports neither.
VERSION_SOURCES = {"hydra": "__init__.py", "omegaconf": "version.py"}
VERSION = re.compile(rb"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
FORMAT = 2
MAX_ENTRIES = 256            # about 5 KiB each
MAX_KEYED_BYTES = 64 << 20   # recipe directories holding more YAML than this are not cached (hashing would cost more)


def enabled() -> bool:
    return os.environ.get("GRPO_COMPOSE_CACHE", "1") != "0"


def cache_dir() -> Path:
    return userdirs.cache_dir("compose", "GRPO_CACHE_DIR")


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:  # a dangling link or an unreadable file: Hydra fails on it if it reads it
        return f"unreadable ({e.strerror})"


def _files(root: Path, suffix: str) -> list[Path]:
    """Every file under `root` whose name ends with `suffix`, symlinked folders followed (each real folder once, so
    a link cycle ends), in a stable order."""
    found, seen = [], set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders.sort()
        found += [Path(folder, n) for n in sorted(names) if n.endswith(suffix)]
    return found


def _version(package: str) -> str:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    source = Path(next(iter(spec.submodule_search_locations))) / VERSION_SOURCES[package]
    found = VERSION.search(source.read_bytes()) if source.is_file() else None
    return found.group(1).decode() if found else _digest(source)


def inputs(dirs: Sequence[Path]) -> str | None:
    """Everything a composition reads but its overrides (read once for the many compositions of a sweep), or None
    when it cannot be cached."""
    parts = [f"{package} {_version(package)}" for package in VERSION_SOURCES]
    for room in KEYED_CODE:
        parts += [f"{p.relative_to(CODE)} {_digest(p)}" for p in _files(CODE / room, "")
                  if "__pycache__" not in p.parts]
    size = 0
    for d in dirs:
        parts.append(f"directory {d}")
        for path in _files(d, ".yaml"):
            try:
                size += path.stat().st_size
            except OSError:
                pass
            if size > MAX_KEYED_BYTES:
                return None
            parts.append(f"{path.relative_to(d)} {_digest(path)}")
    return "\n".join(parts)


def key(read: str, overrides: Sequence[str]) -> str:
    """The entry's name for these overrides, over what `inputs` found."""
    text = json.dumps([FORMAT, list(overrides), read])  # unambiguous however the overrides are written
    return hashlib.sha256(text.encode()).hexdigest()


def load(entry: str) -> tuple[schema.Config, dict[str, str]] | None:
    path = cache_dir() / f"{entry}.json"
    try:
        data = json.loads(path.read_text())
        found = build(schema.Config, data["config"]), data["choices"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.utime(path)  # used now: the last to be evicted
    except OSError:
        pass
    return found


def store(entry: str, config: dict[str, Any], choices: dict[str, str]) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{entry}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"config": config, "choices": choices}))
        tmp.replace(directory / f"{entry}.json")
        _evict(directory)
    except OSError:
        pass  # a cache that cannot be written only costs time


def _evict(directory: Path) -> None:
    """Remove the least recently used entries past `MAX_ENTRIES`."""
    with os.scandir(directory) as found:
        entries = [e for e in found if e.name.endswith(".json")]
    if len(entries) <= MAX_ENTRIES:
        return
    used = []
    for e in entries:
        try:
            used.append((e.stat().st_mtime_ns, e.path))
        except OSError:
            pass  # removed by another grpo meanwhile
    for _, path in sorted(used)[:len(used) - MAX_ENTRIES]:
        try:
            os.unlink(path)
        except OSError:
            pass
