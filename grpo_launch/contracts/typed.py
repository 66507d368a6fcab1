"""Typed values back from JSON: the one reader of plan.json (`contracts.plan`) and of cached recipes
(`compose.cache`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from functools import cache
from typing import Any


@cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


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
        return tp(**{f.name: build(hints[f.name], value[f.name]) for f in dataclasses.fields(tp)
                     if f.init and f.name in value})
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return tuple(build(item, v) for v in value)
    if origin is list:
        return [build(typing.get_args(tp)[0], v) for v in value]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    return value
