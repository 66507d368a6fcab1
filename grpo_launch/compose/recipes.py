"""Where recipes live: the search path, the config groups, and the recipe listing.

Search order (the first directory holding a file wins, so a user recipe shadows a shipped one of the same name):
`--recipes-dir` options, then `$GRPO_RECIPES_PATH` (os.pathsep-separated), then the user directory
(`$XDG_CONFIG_HOME/grpo-launch/recipes`, by default `~/.config/grpo-launch/recipes`), then the shipped recipes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpo_launch.errors import UserError, did_you_mean

ENV_VAR = "GRPO_RECIPES_PATH"
GROUPS = ("cluster", "model", "data", "placement", "zero", "scheduler", "recipe")
PRIMARY = "config"  # the primary config's name (compose/primary/config.yaml)


def shipped_dir() -> Path:
    """The recipes shipped with grpo-launch: inside the package in a wheel, at the repository root in a checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "recipes", package.parent / "recipes"):
        if (candidate / "recipe").is_dir():
            return candidate
    raise RuntimeError(f"grpo-launch is installed without its recipes (looked in {package})")


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "grpo-launch" / "recipes"


def search_path(extra_dirs: Sequence[str | Path] = ()) -> list[Path]:
    dirs: list[Path] = []
    for d in extra_dirs:
        path = Path(d).expanduser()
        if not path.is_dir():
            raise UserError(f"--recipes-dir '{d}' is not a directory", key="--recipes-dir")
        dirs.append(path.resolve())
    for d in filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep)):
        path = Path(d).expanduser()
        if not path.is_dir():
            raise UserError(f"{ENV_VAR} names '{d}', which is not a directory", key=ENV_VAR)
        dirs.append(path.resolve())
    if user_dir().is_dir():
        dirs.append(user_dir().resolve())
    dirs.append(shipped_dir())
    return list(dict.fromkeys(dirs))


def group_options(dirs: Sequence[Path], group: str) -> dict[str, Path]:
    """Option name -> file, the first directory on the search path winning."""
    options: dict[str, Path] = {}
    for d in dirs:
        for f in sorted((d / group).glob("*.yaml")):
            options.setdefault(f.stem, f)
    return options


def check_option(dirs: Sequence[Path], group: str, name: str) -> Path:
    options = group_options(dirs, group)
    if name not in options:
        what = "recipe" if group == "recipe" else f"{group} option"
        raise UserError(f"unknown {what} '{name}'{did_you_mean(name, options)}", key=group,
                        hint=f"available: {', '.join(sorted(options))}")
    return options[name]


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    description: str
    path: Path
    shipped: bool


def list_recipes(dirs: Sequence[Path]) -> list[RecipeInfo]:
    shipped = shipped_dir()
    out = []
    for name, path in sorted(group_options(dirs, "recipe").items()):
        doc = yaml.safe_load(path.read_text()) or {}
        out.append(RecipeInfo(name, str(doc.get("description", "")), path, path.is_relative_to(shipped)))
    return out


def copy_recipe(dirs: Sequence[Path], source: str, name: str, dest_root: Path) -> Path:
    """Copy recipe `source` to `dest_root/recipe/name.yaml`, never overwriting."""
    src = check_option(dirs, "recipe", source)
    if not name or "/" in name or name.startswith("."):
        raise UserError(f"'{name}' is not a usable recipe name", key="NAME", hint="use letters, digits, '-', '.'")
    dest = dest_root / "recipe" / f"{name}.yaml"
    if dest.exists():
        raise UserError(f"{dest} already exists", key="NAME", hint="pick another name or edit that file")
    dest.parent.mkdir(parents=True, exist_ok=True)
    lines = src.read_text().splitlines(keepends=True)
    # Hydra reads `# @package` only from the leading comment lines, so the note goes after them.
    n = 0
    while n < len(lines) and re.match(r"^\s*#\s*@", lines[n]):
        n += 1
    note = f"# Copied from recipe '{source}' by `grpo recipes new {name} --from {source}`.\n"
    tmp = dest.with_suffix(".yaml.tmp")
    tmp.write_text("".join(lines[:n]) + note + "".join(lines[n:]))
    tmp.rename(dest)
    return dest
