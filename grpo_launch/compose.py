"""Compose: recipe name + command-line overrides + search path -> a typed, validated `Config`.

Hydra and OmegaConf live here and nowhere else. Overrides use Hydra's grammar (`key=value`, `group=option`,
`+key=value`, `~key`); every error a user can make (a malformed override, an unknown key, recipe or group
option, a wrong type, a missing value) becomes a `UserError` naming the key, before anything is written.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpo_launch import recipes, schema, trl_fields
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.plan import PLACEMENTS


@dataclass(frozen=True)
class Composed:
    recipe: str                      # the recipe's name (its file name under recipe/)
    config: schema.Config            # typed and validated
    resolved: dict                   # the same, as the plain dict Hydra composed (written to the run dir)
    overrides: tuple[str, ...]       # the command-line overrides as given
    choices: dict[str, str]          # the option chosen in each config group


def _all_schema_keys() -> list[str]:
    return [k for k, *_ in schema.schema_keys()]


def _check_key_path(path: str) -> None:
    """An override's key must exist in the schema (trainer.* is checked against TRL once the placement is known)."""
    top = path.split(".")[0]
    if top == "trainer":
        if path.count(".") != 1:
            raise UserError(f"'{path}': trainer.* keys are TRL field names, one level deep", key=path)
        return
    if top == "hydra":
        raise UserError(f"'{path}': hydra.* settings are managed by grpo-launch", key=path,
                        hint="add recipe directories with --recipes-dir or $GRPO_RECIPES_PATH")
    # Paths into lists (rewards.0.weight) are checked when the whole config is validated.
    tp: Any = schema.Config
    walked = []
    for part in path.split("."):
        if typing.get_origin(tp) in (list, dict):
            return
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in hints:
            here = ".".join(walked)
            candidates = _all_schema_keys() + [f"trainer.{n}" for n in trl_fields.fields_of("GRPOConfig")]
            hint = did_you_mean(path, candidates)
            if not hint and here:
                hint = did_you_mean(part, hints, prefix=f"{here}.")
            raise UserError(f"unknown key '{path}'{hint}", key=path,
                            hint="see `grpo recipes show` or docs/recipe-reference.md for every key")
        walked.append(part)
        tp = hints[part]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))


def _translate_overrides(overrides: Sequence[str], dirs: list[Path]) -> list[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except OverrideParseException as e:
            first = str(e).splitlines()[0] if str(e) else "unparseable"
            raise UserError(f"malformed override '{text}': {first}", key=text,
                            hint="overrides look like key=value, group=option, +key=value or ~key; "
                                 "quote values with spaces: key='a b'") from None
        if o.is_sweep_override():
            raise UserError(f"'{text}': sweeps (a,b or range()) are not supported; run one configuration at "
                            f"a time", key=o.key_or_group)
        key = o.key_or_group
        if o.package is not None:
            raise UserError(f"'{text}': group@package overrides are not supported", key=key)
        if key in recipes.GROUPS:
            if o.is_delete() or o.is_add():
                raise UserError(f"'{text}': the {key} group always has one option; choose it with {key}=NAME",
                                key=key)
            value = o.value()
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise UserError(f"'{text}': {key}=NAME takes one option name", key=key)
            recipes.check_option(dirs, key, str(value))
            out.append(f"{key}='{value}'")  # quoted: zero=2 names the option file "2", not the integer 2
            continue
        _check_key_path(key)
        if o.is_delete():
            out.append(text)
        elif o.is_add() or o.is_force_add():
            out.append(text)
        else:
            out.append("++" + text)  # the schema allows the key; add it where the recipe leaves it out
    return out


def _hydra_compose(dirs: list[Path], overrides: list[str]) -> tuple[dict, dict[str, str]]:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    search = create_config_search_path(None)
    for d in reversed(dirs):  # each lands right after Hydra's own entry, so the final order is `dirs`
        search.append("grpo-launch", f"file://{d}", anchor="hydra")
    try:
        cfg = ConfigLoaderImpl(config_search_path=search).load_configuration(
            recipes.PRIMARY, overrides=overrides, run_mode=RunMode.RUN, from_shell=False)
        choices = {g: str(cfg.hydra.runtime.choices.get(g)) for g in recipes.GROUPS}
        with open_dict(cfg):
            del cfg["hydra"]
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise UserError(f"missing required value '{missing[0]}'", key=missing[0],
                            hint=f"set it in the recipe or on the command line: {missing[0]}=...")
        data = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        message = lines[0] if lines else type(e).__name__
        raise UserError(f"cannot compose the recipe: {message}", key=None,
                        hint=" ".join(lines[1:3]) or None) from None
    assert isinstance(data, dict)
    return data, choices


def compose(overrides: Sequence[str] = (), recipe_dirs: Sequence[str | Path] = ()) -> Composed:
    dirs = recipes.search_path(recipe_dirs)
    data, choices = _hydra_compose(dirs, _translate_overrides(overrides, dirs))
    config = schema.build_section(schema.Config, data)
    trl_fields.check_trainer_args(config.trainer, PLACEMENTS[config.placement.kind].CONFIG_CLASS)
    return Composed(recipe=choices["recipe"], config=config, resolved=data, overrides=tuple(overrides),
                    choices=choices)
