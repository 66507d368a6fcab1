"""How a setting is declared once: its type (the dataclass annotation), default, one-line doc and bounds.

A section is a keyword-only dataclass whose fields come from `knob`. The recipe schema (`compose.schema`) is built
from such sections and so are the settings a process takes on its own command line (`contracts.proxy`), so a
default, a doc line or a bound is written in exactly one place. `violation` checks the bounds of one value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

# No default: the recipe or the command line must set it. OmegaConf's mark for a missing mandatory value, so the
# recipe schema (a structured config) reports it by name; written out so that contracts import nothing.
REQUIRED: Any = "???"


def knob(default: Any = REQUIRED, doc: str = "", *, factory: Any = None, choices: tuple | None = None,
         ge: float | None = None, le: float | None = None, gt: float | None = None, lt: float | None = None) -> Any:
    meta = {"doc": doc, "choices": choices, "ge": ge, "le": le, "gt": gt, "lt": lt}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def doc_of(section: type, name: str) -> str:
    return section.__dataclass_fields__[name].metadata["doc"]


def default_of(section: type, name: str) -> Any:
    f = section.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def violation(value: Any, meta: dict) -> str | None:
    """What is wrong with `value` by the bounds in `meta` (a knob's metadata), or None when it is within them. A
    number is finite: no bound holds for nan, and inf is no size."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(str(c) for c in choices)}; got {value!r}"
    for bound, holds, sym in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        if meta.get(bound) is not None and not holds(value, meta[bound]):
            return f"must be {sym} {meta[bound]}, got {value!r}"
    return None
