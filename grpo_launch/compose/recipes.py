"""Where recipes live: the search path, the config groups, and the recipe listing.

Search order (the first directory holding a file wins, so a user recipe shadows a shipped one of the same name):
`--recipes-dir` options, then `$GRPO_RECIPES_PATH` (os.pathsep-separated), then the user directory
(`$XDG_CONFIG_HOME/grpo-launch/recipes`, by default `~/.config/grpo-launch/recipes`), then the shipped recipes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.contracts import userdirs
from grpo_launch.errors import UserError, did_you_mean, yaml_problem

ENV_VAR = "GRPO_RECIPES_PATH"
GROUPS = ("cluster", "model", "data", "placement", "zero", "scheduler", "recipe")
PRIMARY = "config"  # the primary config's name
PRIMARY_DIR = Path(__file__).with_name("primary")  # config.yaml alone: one option per group, the schema first


def shipped_dir() -> Path:
    """The recipes shipped with grpo-launch: inside the package in a wheel, at the repository root in a checkout."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "recipes", package.parent / "recipes"):
        if (candidate / "recipe").is_dir():
            return candidate
    raise RuntimeError(f"grpo-launch is installed without its recipes (looked in {package})")


def user_dir() -> Path:
    return userdirs.config_dir("recipes")


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


def check_includes(dirs: Sequence[Path], name: str) -> None:
    """A recipe chooses group options in its defaults list (`- override /cluster: cpu`); it does not include recipes,
    itself or another: Hydra recurses without end on the first and merges the second out of sight of `grpo plan`'s
    origins. Its entries are `_self_` and absolute group choices; a relative entry names a file of recipe/."""
    import yaml

    path = group_options(dirs, "recipe").get(name)
    try:
        doc = yaml.safe_load(path.read_bytes()) if path is not None else None
    except (OSError, ValueError, yaml.YAMLError):
        return  # Hydra reports the file's own error
    entries = doc.get("defaults") if isinstance(doc, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        for target in [entry] if isinstance(entry, str) else list(entry) if isinstance(entry, dict) else []:
            group = str(target).removeprefix("override").strip()
            if group == "_self_" or (group.startswith("/") and group.strip("/").split("/")[0] != "recipe"):
                continue
            shown = entry if isinstance(entry, str) else f"{target}: {entry[target]}"
            raise UserError(f"recipe '{name}' ({path}) includes a recipe in its defaults list ('{shown}'): a recipe "
                            f"chooses group options, it does not include recipes", key="recipe",
                            hint="copy the settings you want from the other recipe; choose group options with "
                                 "`- override /GROUP: OPTION`")


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    description: str
    path: Path
    shipped: bool


def list_recipes(dirs: Sequence[Path]) -> list[RecipeInfo]:
    import yaml

    shipped = shipped_dir()
    out = []
    for name, path in sorted(group_options(dirs, "recipe").items()):
        try:
            doc = yaml.safe_load(path.read_bytes())
        except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: not UTF-8
            raise UserError(f"recipe file {path} cannot be read: {yaml_problem(e)}", key=str(path),
                            hint="fix it, or move it out of the recipe directory") from None
        description = doc.get("description", "") if isinstance(doc, dict) else ""
        out.append(RecipeInfo(name, str(description), path, path.is_relative_to(shipped)))
    return out


RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # what `recipe=NAME` can select
RECIPE_FILE_SUFFIXES = (".yaml", ".yml")
GLOBAL_PACKAGE = re.compile(r"^\s*#\s*@package\s+_global_\s*$", re.MULTILINE)


def names_recipe_file(argument: str) -> bool:
    """Whether a command-line argument is the path of a recipe file (`grpo plan ./my-recipe.yaml`), not an
    override: no '=', and a YAML file's suffix."""
    return "=" not in argument and argument.endswith(RECIPE_FILE_SUFFIXES)


def recipe_file(argument: str, links: Path) -> tuple[str, Path]:
    """The recipe a path names, as (its name, a recipe directory that holds it): `DIR/recipe/NAME.yaml` is recipe
    NAME of DIR; a file anywhere else is linked (not copied: an edit shows) as `<links>/<digest>/recipe/NAME.yaml`,
    so Hydra, the composition cache and the origins of values read it like any recipe on the search path."""
    path = Path(argument).expanduser()
    if not path.is_file():
        raise UserError(f"recipe file {argument} does not exist", key="recipe",
                        hint="give the path of a recipe file, or recipe=NAME for a recipe on the search path "
                             "(`grpo recipes` lists them)")
    name = path.stem
    if not RECIPE_NAME.fullmatch(name):
        raise UserError(f"recipe file {argument}: '{name}' is not a usable recipe name", key="recipe",
                        hint="rename the file: letters, digits, '-', '_' and '.', starting with a letter or digit")
    try:
        text = path.read_text()
    except (OSError, ValueError) as e:
        raise UserError(f"recipe file {argument} cannot be read: {yaml_problem(e)}", key="recipe") from None
    if not GLOBAL_PACKAGE.search(text):
        raise UserError(f"recipe file {argument} does not start with '# @package _global_': Hydra would read its "
                        f"keys under 'recipe.'", key="recipe",
                        hint="start it as the shipped recipes do (`grpo recipes new NAME --from tiny-cpu` writes one "
                             "to edit): '# @package _global_', a defaults list of group options, then the keys; "
                             "TRL's arguments go under 'trainer:'")
    path = path.resolve()
    if path.parent.name == "recipe" and path.suffix == ".yaml":
        return name, path.parent.parent
    holder = links / hashlib.sha256(str(path).encode()).hexdigest()[:16]
    link = holder / "recipe" / f"{name}.yaml"
    if not (link.is_symlink() and link.resolve() == path):
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".{name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(path)
            tmp.replace(link)
        except OSError as e:
            raise UserError(f"recipe file {argument}: cannot link it into {holder}: {e.strerror}", key="recipe",
                            hint=f"move it to DIR/recipe/{name}.yaml and use --recipes-dir DIR recipe={name}"
                            ) from None
    return name, holder


def copy_recipe(dirs: Sequence[Path], source: str, name: str, dest_root: Path, *, force: bool = False
                ) -> tuple[Path, Path | None]:
    """Copy recipe `source` to `dest_root/recipe/name.yaml`, never overwriting: the new file, and the recipe of that
    name elsewhere on the search path it shadows or is shadowed by (refused unless `force`)."""
    src = check_option(dirs, "recipe", source)
    if not RECIPE_NAME.fullmatch(name):
        raise UserError(f"'{name}' is not a usable recipe name", key="NAME",
                        hint="use letters, digits, '-', '_' and '.', starting with a letter or digit")
    dest = dest_root / "recipe" / f"{name}.yaml"
    if dest.exists():
        raise UserError(f"{dest} already exists", key="NAME", hint="pick another name or edit that file")
    shadowing = _shadowing(dirs, name, dest_root)
    if shadowing is not None and not force:
        raise UserError(f"recipe '{name}' exists already: {shadowing}", key="NAME",
                        hint="pick another name, or add --force to write it anyway")
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
    return dest, shadowing


def _shadowing(dirs: Sequence[Path], name: str, dest_root: Path) -> str | None:
    """What a new recipe `name` in `dest_root` would do to the recipe of that name on the search path, in words."""
    holders = [d for d in dirs if (d / "recipe" / f"{name}.yaml").is_file()]
    if not holders:
        return None
    other = holders[0] / "recipe" / f"{name}.yaml"
    default = " (the embedded default, which `grpo plan` plans without recipe=)" if \
        name == primary_choices()["recipe"] else ""
    dest, order = dest_root.expanduser().resolve(), list(dirs)
    if dest not in order and dest == user_dir().resolve():  # created by this copy, the user directory is searched
        order.insert(len(order) - 1, dest)                   # just before the shipped recipes
    if dest not in order:
        return f"the copy would shadow {other}{default} wherever its directory comes first on the search path"
    if order.index(dest) > order.index(holders[0]):
        return f"the copy would be shadowed by {other}{default}, which comes first on the search path"
    return f"the copy would shadow {other}{default}"


def primary_choices() -> dict[str, str]:
    """The option the primary config chooses in each group (`recipe`: the embedded default recipe)."""
    import yaml

    defaults = yaml.safe_load((PRIMARY_DIR / f"{PRIMARY}.yaml").read_text())["defaults"]
    return {group: str(option) for entry in defaults if isinstance(entry, dict) for group, option in entry.items()}
