"""Where each value of a composed recipe came from: the command line, the recipe, a group option file, or the
schema's default.

Hydra merges one option file of each config group in the primary config's order (cluster, model, data, placement,
zero), the recipe after them, and then applies the command line's key overrides: the last of these to set a key is
where its value came from. Errors about a key say so (`Origins.locate`), so that a value a recipe set, which an
override then made invalid, is not mistaken for one the user typed:

    trainer.beta=0.0 (set by recipe tiny-cpu) is not a field of AsyncGRPOConfig: ...

Reading the option files is cheap (a few small YAML files) and happens only when an error asks.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from grpo_launch.compose import recipes, schema
from grpo_launch.compose.grammar import parse_override
from grpo_launch.errors import UserError, UserErrors

PACKAGE_HEADER = re.compile(r"^\s*#\s*@package\s+(\S+)")
SCHEMA_DEFAULT = "the schema default"
TRL_DEFAULT = "TRL's default"
_ABSENT = object()


def dotted(key: str) -> str:
    """'rewards[0].fn' -> 'rewards.0.fn': one spelling of a path for list entries."""
    return re.sub(r"\[(\d+)\]", r".\1", key)


def shown(value: Any) -> str:
    """A value as it would be written in an override: true, null, 0.0, [a,b], {fn:sevens}."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{shown(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value):
        return shown(dataclasses.asdict(value))
    return str(value)


def value_at(config: Any, path: str) -> Any:
    """The typed config's value at a dotted path (list entries by index), or `_ABSENT`."""
    value = config
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part, _ABSENT)
        elif isinstance(value, list) and part.isdigit():
            value = value[int(part)] if int(part) < len(value) else _ABSENT
        elif dataclasses.is_dataclass(value) and part in {f.name for f in dataclasses.fields(value)}:
            value = getattr(value, part)
        else:
            return _ABSENT
        if value is _ABSENT:
            return value
    return value


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Every value of a nested mapping by its dotted key below `prefix` (an empty mapping is a value)."""
    if isinstance(doc, dict) and doc:
        return {key: value for k, v in doc.items() for key, value in flatten(v, f"{prefix}{k}.").items()}
    return {prefix.rstrip("."): doc} if prefix else {}


def _keys_of(path: Path, group: str) -> dict[str, Any]:
    """The dotted keys an option file sets, under its package: the group's name unless the file's header says
    `# @package _global_` (or another package)."""
    import yaml

    text = path.read_text()
    package = group
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):
            break
        if found := PACKAGE_HEADER.match(line):
            package = found.group(1)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(doc, dict):
        return {}
    doc.pop("defaults", None)
    return flatten(doc, "" if package == "_global_" else f"{package}.")


def _recipe_choices(path: Path) -> dict[str, str]:
    """The group options a recipe file chooses in its defaults list (`- override /cluster: cpu`)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}
    entries = (doc.get("defaults") if isinstance(doc, dict) else None) or []
    return {key.removeprefix("override").strip().lstrip("/"): str(option)
            for entry in entries if isinstance(entry, dict) for key, option in entry.items()}


@dataclass(frozen=True)
class Origins:
    """Where the values of one composition came from. `choices` are Hydra's (None when the composition failed:
    then they are read from the recipe's defaults list as Hydra would choose them)."""

    dirs: tuple[Path, ...]
    choices: tuple[tuple[str, str], ...] | None
    overrides: tuple[str, ...]                 # the command line's, as given

    @cached_property
    def command_line(self) -> list[tuple[str, str]]:
        """(dotted key or group, value as written) of each override that sets one, in order."""
        out = []
        for o in map(parse_override, self.overrides):
            if not o.is_delete() and not o.is_sweep_override():
                value = o.value() if o.key_or_group in recipes.GROUPS else o.input_line.partition("=")[2]
                out.append((dotted(o.key_or_group), str(value)))
        return out

    @cached_property
    def _files(self) -> list[tuple[str, dict[str, Any]]]:
        """(what set it, the keys it sets) of each option file, in Hydra's merge order."""
        choices = dict(self.choices) if self.choices is not None else self._guessed_choices()
        out = []
        for group in recipes.primary_choices():  # the primary config's defaults list: Hydra's merge order
            path = recipes.group_options(self.dirs, group).get(choices.get(group, ""))
            if path is not None:
                label = f"recipe {choices[group]}" if group == "recipe" else f"{group} option {choices[group]}"
                out.append((f"set by {label}", _keys_of(path, group)))
        return out

    def _guessed_choices(self) -> dict[str, str]:
        given = {key: value for key, value in self.command_line if key in recipes.GROUPS}
        choices = recipes.primary_choices()
        choices["recipe"] = given.get("recipe", choices["recipe"])
        recipe = recipes.group_options(self.dirs, "recipe").get(choices["recipe"])
        if recipe is not None:
            choices.update(_recipe_choices(recipe))
        return {**choices, **given}

    def of(self, key: str) -> tuple[str, Any] | None:
        """(where the value at `key` came from, the value as written there), or None when nothing set it."""
        path = dotted(key)
        parts = path.split(".")
        prefixes = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
        for given, value in reversed(self.command_line):
            if given not in recipes.GROUPS and (given in prefixes or given.startswith(path + ".")):
                return "set on the command line", value
        for phrase, keys in reversed(self._files):
            for prefix in sorted(prefixes, key=len, reverse=True):
                if prefix in keys:
                    return phrase, keys[prefix]
        return None

    def locate(self, error: UserError, config: schema.Config | None = None) -> UserError:
        """`error` saying where the value of its key came from: after `key=value` when the message starts with it,
        else in parentheses after the message's first line. Errors about no recipe key are returned as they are;
        several errors found together are each located."""
        if isinstance(error, UserErrors):
            return UserErrors([self.locate(e, config) for e in error.errors])
        if error.key is None or error.origin is not None or error.key in recipes.GROUPS:
            return error
        path = dotted(error.key)
        found = self.of(path)
        if found is None and schema.type_at(path) is None:
            return error
        trl_default = found is None and path.startswith("trainer.")  # a TRL field nothing set
        phrase, written = found or (TRL_DEFAULT if trl_default else SCHEMA_DEFAULT, _schema_default(path))
        value = value_at(config, path) if config is not None else _ABSENT
        assignment = error.key if trl_default else f"{error.key}={shown(written if value is _ABSENT else value)}"
        first, newline, rest = error.message.partition("\n")
        if mentioned := re.match(rf"{re.escape(error.key)}=[^\s:,;]*", first):
            first = f"{first[:mentioned.end()]} ({phrase}){first[mentioned.end():]}"
        else:
            first = f"{first} ({assignment} is {phrase})"
        return UserError(first + newline + rest, key=error.key, hint=error.hint, origin=phrase)


def _schema_default(path: str) -> Any:
    defaults = {key: default for key, _, default, _ in schema.schema_keys()}
    return defaults.get(path)
