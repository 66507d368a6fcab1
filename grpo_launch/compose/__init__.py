"""Compose: recipe name + command-line overrides + search path -> a typed, validated `Config`.

Hydra and OmegaConf live here and nowhere else, through their public APIs: `hydra.compose` over a search path of
recipe directories, and the schema (`compose.schema.Config`) as the primary config's structured config, so that
OmegaConf itself rejects unknown keys, converts types and finds missing values. Overrides use Hydra's grammar
(`key=value`, `group=option`, `+key=value`, `~key`); every error a user can make (a malformed override, an unknown
key, recipe or group option, a wrong type, a missing value, a bound) becomes a `UserError` naming the key and where
its value came from (`compose.origins`), before anything is written. A `Composer` composes each choice of group
options with Hydra once and applies the key overrides to a copy, so the combinations of a sweep (`compose.sweep`)
that differ only in keys cost milliseconds. Hydra, OmegaConf and PyYAML are imported where they are used: a recipe
the composition cache answers for (`compose.cache`) reads no YAML and runs no Hydra.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_launch.compose import cache, recipes, schema, trl_checks
from grpo_launch.compose.grammar import parse_override
from grpo_launch.compose.hydra_errors import unknown_key, user_error
from grpo_launch.compose.interpolations import check_defaults, check_no_environment
from grpo_launch.compose.origins import Origins, dotted
from grpo_launch.compose.recipes import PRIMARY_DIR
from grpo_launch.contracts.builtins import names_a_path
from grpo_launch.contracts.shell import shell_line
from grpo_launch.errors import UserError, collect

SCHEMA_NAME = "grpo_launch_schema"                  # the schema's name in Hydra's ConfigStore


@dataclass(frozen=True)
class Composed:
    recipe: str                      # the recipe's name (its file name under recipe/)
    config: schema.Config            # typed and validated
    overrides: tuple[str, ...]       # the command-line overrides as given
    choices: dict[str, str]          # the option chosen in each config group
    origins: Origins                 # where each value came from, for the errors about a key


def _translate_overrides(overrides: Sequence[str], dirs: list[Path]) -> tuple[list[str], list[Any]]:
    """The user's overrides as they are applied: group options checked and quoted, for Hydra's defaults list; key
    overrides parsed, keys of free-form mappings (trainer.*, env.set.*) added where the recipe leaves them out.
    Sweeps, group@package and hydra.* are refused."""
    groups, keys = [], []
    for text in overrides:
        o = parse_override(text)
        key = o.key_or_group
        if o.is_sweep_override():
            raise UserError(f"'{text}': sweeps (a,b, range(), choice()) are for `grpo plan -m`, which plans every "
                            f"combination side by side; here give {key} one value", key=key,
                            hint=shell_line(["grpo", "plan", "-m", *overrides]))
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
            groups.append(f"{key}='{value}'")  # quoted: zero=2 names the option file "2", not the integer 2
            continue
        if key.split(".")[0] == "hydra":
            raise UserError(f"'{text}': hydra.* settings are managed by grpo-launch", key=key,
                            hint="add recipe directories with --recipes-dir or $GRPO_RECIPES_PATH")
        if key.startswith("trainer.") and key.count(".") != 1:
            raise UserError(f"'{key}': trainer.* keys are TRL field names, one level deep", key=key)
        free = schema.opens_mapping(key)
        if o.is_delete() and not free:
            raise UserError(f"'{text}': {key} is a key of the schema, which cannot be removed", key=key,
                            hint=f"give it another value: {key}=... (null where it takes none)")
        if (o.is_add() or o.is_force_add()) and not free and schema.type_at(dotted(key)) is None:
            raise unknown_key(key)  # OmegaConf would add it to the schema's section, and the typed config drop it
        plain = not (o.is_delete() or o.is_add() or o.is_force_add())
        # A free-form mapping's key may be new; anything else must exist in the schema, which OmegaConf checks.
        keys.append(parse_override(f"++{text}") if plain and free else o)
    return groups, keys


def _apply_key_overrides(cfg: Any, overrides: list[Any]) -> None:
    """Key overrides applied to a composed config the way Hydra applies them once it has merged the defaults list
    (its documented grammar: key=value replaces, merging mappings; +key=value adds; ++key=value adds or replaces;
    ~key[=value] deletes), through OmegaConf's public API. So one Hydra composition of the group options serves
    every combination of keys of a sweep. Failures are raised in Hydra's words, which `hydra_errors.user_error`
    reads."""
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    for o in overrides:
        key, value = o.key_or_group, o.value()
        try:
            if o.is_delete():
                found = OmegaConf.select(cfg, key, throw_on_missing=False)
                if found is None:
                    raise ConfigCompositionException(f"Could not delete from config. '{key}' does not exist.")
                if value is not None and value != found:
                    raise ConfigCompositionException(f"Could not delete from config. The value of '{key}' is "
                                                     f"{found} and not {value}.")
                parent, _, leaf = key.rpartition(".")
                with open_dict(cfg):
                    del (OmegaConf.select(cfg, parent) if parent else cfg)[leaf]
            elif o.is_add() and OmegaConf.select(cfg, key, throw_on_missing=False) is not None \
                    and not isinstance(value, (dict, list)):
                raise ConfigCompositionException(f"Could not append to config. An item is already at '{key}'.")
            elif o.is_add() or o.is_force_add():
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            else:
                try:
                    OmegaConf.update(cfg, key, value, merge=True)
                except (ConfigAttributeError, ConfigKeyError) as e:
                    raise ConfigCompositionException(f"Could not override '{key}'.\nTo append to your config use "
                                                     f"+{o.input_line}") from e
        except OmegaConfBaseException as e:
            raise ConfigCompositionException(f"Error merging override {o.input_line}") from e


def _quoted(path: Path) -> str:
    return "'file://" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _hydra_compose(dirs: list[Path], groups: list[str]) -> tuple[Any, dict[str, str]]:
    """Hydra's composition of the defaults list with these group options: the config before any key override
    (a DictConfig in struct mode), and the option chosen in each group."""
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema.Config)
    # The primary config sits alone in its directory; the recipe directories follow in search order, so the
    # first directory holding a group option wins (a user recipe shadows a shipped one).
    searchpath = f"hydra.searchpath=[{','.join(_quoted(d) for d in dirs)}]"
    quiet = ["hydra/job_logging=none", "hydra/hydra_logging=none"]  # grpo-launch configures no logging through Hydra
    try:
        with initialize_config_dir(config_dir=str(PRIMARY_DIR), version_base=None):
            cfg = hydra_compose(recipes.PRIMARY, overrides=[*groups, searchpath, *quiet], return_hydra_config=True)
        choices = {g: str(cfg.hydra.runtime.choices.get(g)) for g in recipes.GROUPS}
        with open_dict(cfg):
            del cfg["hydra"]
    except (HydraException, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        raise user_error(e, []) from None
    except RecursionError:
        raise UserError("cannot compose the recipe: Hydra recursed without end, on a file whose defaults list "
                        "includes itself or on a value nested too deeply", key=None,
                        hint="check the defaults lists of the recipe's group option files") from None
    return cfg, choices


def _chosen_recipe(groups: list[str]) -> str:
    """The recipe a composition with these group options reads: the one chosen, else the primary config's."""
    chosen = [g.partition("=")[2].strip("'") for g in groups if g.startswith("recipe=")]
    return chosen[-1] if chosen else recipes.primary_choices()["recipe"]


def _interpolated(cfg: Any) -> bool:
    """Whether any value of a composed config, as written before it is resolved, holds an interpolation, `${...}`."""
    from omegaconf import OmegaConf

    pending = [OmegaConf.to_container(cfg, resolve=False)]
    while pending:
        value = pending.pop()
        if isinstance(value, str) and "${" in value:
            return True
        if isinstance(value, dict):
            pending += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            pending += value
    return False


def _typed(cfg: Any, keys: list[Any]) -> tuple[schema.Config, bool]:
    """The composed config with the key overrides applied, as the typed `Config`, and whether it held an
    interpolation (whose value, a resolver's, may differ the next time: such a composition is never cached)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        _apply_key_overrides(cfg, keys)
        check_no_environment(cfg)  # before anything resolves
        interpolated = _interpolated(cfg)
        config = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise user_error(e, [o.input_line for o in keys]) from None
    except RecursionError:
        raise UserError("cannot compose the recipe: a value is nested too deeply", key=None) from None
    assert isinstance(config, schema.Config)
    return config, interpolated


class Composer:
    """Composes recipes over one search path. Hydra's composition of the defaults list is most of the cost, so each
    choice of group options is composed by Hydra once and the key overrides are applied to a copy of it (as Hydra
    applies them after the defaults list): the combinations of a sweep that differ only in keys cost milliseconds.
    Compositions that succeeded are also kept in the cache (`compose.cache`)."""

    def __init__(self, recipe_dirs: Sequence[str | Path] = (), *, store: bool = True) -> None:
        self.dirs = recipes.search_path(recipe_dirs)
        self.cache_inputs = cache.inputs(self.dirs) if cache.enabled() else None
        self.store = store  # False: read the cache, add nothing to it (a rehearsal writes only its run directory)
        self._by_groups: dict[tuple[str, ...], tuple[Any, dict[str, str]] | UserError] = {}

    def _groups(self, groups: list[str], origins: Origins) -> tuple[Any, dict[str, str]]:
        key = tuple(groups)
        if key not in self._by_groups:
            try:
                recipes.check_includes(self.dirs, _chosen_recipe(groups))
                self._by_groups[key] = _hydra_compose(self.dirs, groups)
            except UserError as e:
                self._by_groups[key] = e
        found = self._by_groups[key]
        if isinstance(found, UserError):
            raise origins.locate(found)
        cfg, choices = found
        return copy.deepcopy(cfg), choices

    def compose(self, overrides: Sequence[str] = ()) -> Composed:
        overrides = tuple(overrides)
        entry = cache.key(self.cache_inputs, overrides) if self.cache_inputs is not None else None
        cached = cache.load(entry) if entry else None
        interpolated = False
        if cached:
            config, choices = cached
        else:
            groups, keys = _translate_overrides(overrides, self.dirs)
            cfg, choices = self._groups(groups, Origins(tuple(self.dirs), None, overrides))
            check_defaults(self.dirs, choices)
            try:
                config, interpolated = _typed(cfg, keys)
            except UserError as e:
                raise Origins(tuple(self.dirs), tuple(choices.items()), overrides).locate(e) from None
        origins = Origins(tuple(self.dirs), tuple(choices.items()), overrides)
        try:
            collect(lambda: schema.check_bounds(config), lambda: trl_checks.check_trainer_names(config.trainer))
        except UserError as e:
            raise origins.locate(e, config) from None
        if entry and not cached and not interpolated and self.store:
            cache.store(entry, dataclasses.asdict(config), choices)
        return Composed(recipe=choices["recipe"], config=config, overrides=overrides, choices=choices,
                        origins=origins)


def compose(overrides: Sequence[str] = (), recipe_dirs: Sequence[str | Path] = (), *, store: bool = True) -> Composed:
    return Composer(recipe_dirs, store=store).compose(overrides)


def anchored(composed: Composed, cwd: Path) -> Composed:
    """The composition with the paths its processes read made absolute against `cwd`, where grpo was started: the
    processes run in the run directory. Reward files need none of this: they are copied into the run directory."""
    config = composed.config
    data, model = config.data, config.model
    if data.source == "files":
        # data.eval is a file too, where it has a suffix (a plan check says so otherwise, naming it as given)
        held_out = str(cwd / Path(data.eval).expanduser()) if data.eval and Path(data.eval).suffix else data.eval
        data = dataclasses.replace(data, path=str(cwd / Path(data.path).expanduser()), eval=held_out)  # absolute stays
    if names_a_path(model.name_or_path):
        model = dataclasses.replace(model, name_or_path=str(cwd / Path(model.name_or_path).expanduser()))
    if (data, model) == (config.data, config.model):
        return composed
    return dataclasses.replace(composed, config=dataclasses.replace(config, data=data, model=model))
