"""Typed values back from JSON: the one reader of plan.json and the run directory's other records
(`contracts.rundir`) and of cached recipes (`compose.cache`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any


@dataclass(frozen=True)
class ChosenBy:
    """Marks a field whose type is chosen by a sibling field's value, `Annotated[A | B | None, ChosenBy("kind",
    type_of)]`: read back as `type_of(the sibling's value)` (None: no value)."""

    field: str
    type_of: Callable[[Any], type | None]


@cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp, include_extras=True)


def _field(hint: Any, record: dict[str, Any], value: Any) -> Any:
    """One field of a dataclass read from `record`."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        chosen = next((e for e in extras if isinstance(e, ChosenBy)), None)
        if chosen is None:
            return build(base, value)
        tp = chosen.type_of(record[chosen.field])
        return None if tp is None or value is None else build(tp, value)
    return build(hint, value)


def build(tp: Any, value: Any) -> Any:
    """`value` read from JSON, as type `tp`: dataclasses field by field (derived keys the JSON adds are skipped),
    tuples from lists, enumerations from their values, optional values as given."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return build(tp, value)
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: _field(hints[f.name], value, value[f.name]) for f in dataclasses.fields(tp)
                     if f.init and f.name in value})
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return tuple(build(item, v) for v in value)
    if origin is list:
        return [build(typing.get_args(tp)[0], v) for v in value]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    return value
