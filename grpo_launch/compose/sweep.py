"""Sweeps for `grpo plan -m`: Hydra's sweep grammar expanded into combinations, each composed like one recipe.

Supported forms, over any key or config group: comma lists (`zero=2,3`), `range(start, stop[, step])`,
`choice(a, b)` (with Hydra's `sort()` and `shuffle()`), and `glob()` over a group's options. The combinations are
the cartesian product in the order the overrides are given, the first varying slowest, as Hydra's basic sweeper
orders them. `interval()` has no values to list (it is for optimizing sweepers) and is refused. A combination is
composed by a `Composer`, which composes each choice of group options once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.compose import Composed, Composer, recipes
from grpo_launch.compose.grammar import parse_override
from grpo_launch.errors import UserError

MAX_COMBINATIONS = 1000  # the default bound of a sweep (`grpo plan -m --max-combinations N` moves it)


@dataclass(frozen=True)
class Combination:
    overrides: tuple[str, ...]       # one value of every override, in the order given
    values: tuple[str, ...]          # the swept values, in the order of `Sweep.keys`


@dataclass(frozen=True)
class Sweep:
    keys: tuple[str, ...]            # the swept keys and groups, in the order given
    combinations: tuple[Combination, ...]


def _too_many(text: str, key: str, count: str, limit: int) -> UserError:
    return UserError(f"'{text}' sweeps {count} values; a sweep plans at most {limit} combinations", key=key,
                     hint="narrow it, or raise the bound with --max-combinations N")


def _values(text: str, dirs: list[Path], limit: int) -> tuple[str | None, list[str]]:
    """(the swept key, each override this one stands for); the key is None for an override that sweeps nothing.
    More than `limit` values are refused before they are listed (a range can be any length)."""
    from hydra.core.override_parser.types import RangeSweep, ValueType

    o = parse_override(text)
    if not o.is_sweep_override():
        return None, [text]
    key = o.key_or_group
    if o.is_interval_sweep():
        raise UserError(f"'{text}': interval() has no values to plan; list them (a,b,c) or use range()", key=key)
    if o.value_type is ValueType.GLOB_CHOICE_SWEEP:
        if key not in recipes.GROUPS:
            raise UserError(f"'{text}': glob() selects options of a config group ({', '.join(recipes.GROUPS)})",
                            key=key)
        values = o.value().filter(sorted(recipes.group_options(dirs, key)))
        if not values:
            raise UserError(f"'{text}' matches no {key} option", key=key,
                            hint=f"available: {', '.join(sorted(recipes.group_options(dirs, key)))}")
    else:
        swept = o.value()
        if isinstance(swept, RangeSweep) and swept.step and \
                (count := math.ceil((swept.stop - swept.start) / swept.step)) > limit:
            raise _too_many(text, key, f"{count:,}", limit)
        values = list(itertools.islice(o.sweep_string_iterator(), limit + 1))
        if len(values) > limit:
            raise _too_many(text, key, f"more than {limit:,}", limit)
    return key, [f"{o.get_key_element()}={v}" for v in values]


def expand(overrides: Sequence[str], dirs: list[Path], limit: int = MAX_COMBINATIONS) -> Sweep:
    """Every combination of the sweep's values, at most `limit` of them. A group option that does not exist is an
    error of the whole sweep (a typo, not a layout to compare), found before anything is composed."""
    keys, choices = [], []
    for text in overrides:
        key, values = _values(text, dirs, limit)
        if key is not None:
            if key in keys:
                raise UserError(f"'{text}': {key} is swept twice; give all its values in one override", key=key)
            keys.append(key)
            if key in recipes.GROUPS:
                for value in values:
                    recipes.check_option(dirs, key, str(parse_override(value).value()))
        choices.append((key is not None, values))
    count = math.prod(len(values) for _, values in choices)
    if count > limit:
        raise UserError(f"the sweep has {count:,} combinations ({' x '.join(str(len(v)) for s, v in choices if s)}); "
                        f"it plans at most {limit:,}", key=keys[0],
                        hint="sweep fewer values, or raise the bound with --max-combinations N")
    combinations = []
    for picked in itertools.product(*(values for _, values in choices)):
        swept = [p.partition("=")[2] for p, (is_swept, _) in zip(picked, choices, strict=True) if is_swept]
        combinations.append(Combination(tuple(picked), tuple(swept)))
    return Sweep(tuple(keys), tuple(combinations))


def compose_sweep(overrides: Sequence[str], recipe_dirs: Sequence[str | Path] = (), *,
                  limit: int = MAX_COMBINATIONS) -> tuple[Sweep, list[Composed | UserError]]:
    """The sweep and each combination composed, or the `UserError` that refused it (a sweep goes on past one)."""
    composer = Composer(recipe_dirs)
    sweep = expand(overrides, composer.dirs, limit)
    results: list[Composed | UserError] = []
    for combination in sweep.combinations:
        try:
            results.append(composer.compose(combination.overrides))
        except UserError as e:
            results.append(e)
    return sweep, results
