"""How a setting is declared once: its type (the dataclass annotation), default, one-line doc and bounds.

A section is a keyword-only dataclass whose fields come from `knob`. The recipe schema (`compose.schema`) is built
from such sections and so are the settings a process takes on its own command line (`contracts.proxy`), so a
default, a doc line or a bound is written in exactly one place. `violation` checks the bounds of one value.

Text is bounded too, because values are written into scripts and job files (`contracts.shell`): no text holds a
control character (a line break would start a new line of a script or end `#SBATCH` parsing) unless its knob says
`any_text` (it reaches only plan.json), and a knob with a `form` (an environment variable name, a Slurm partition)
takes only values of that form, because it is written where quoting cannot reach (`env NAME=...`, `#SBATCH`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# No default: the recipe or the command line must set it. OmegaConf's mark for a missing mandatory value, so the
# recipe schema (a structured config) reports it by name; written out so that contracts import nothing.
REQUIRED: Any = "???"
# Unicode's control characters (C0, DEL, C1) and its line and paragraph separators, which YAML reads as line breaks.
_CONTROL_CATEGORIES = ("Cc", "Zl", "Zp")


@dataclass(frozen=True)
class Form:
    """The form of a text value that is written out where no quoting reaches it."""

    what: str                                  # in words: "an environment variable name"
    pattern: str                               # a regular expression the whole value must match

    def fits(self, text: str) -> bool:
        return re.fullmatch(self.pattern, text) is not None


ENV_NAME = Form("an environment variable name", r"[A-Za-z_][A-Za-z0-9_]*")


def knob(default: Any = REQUIRED, doc: str = "", *, factory: Any = None, choices: tuple | None = None,
         ge: float | None = None, le: float | None = None, gt: float | None = None, lt: float | None = None,
         form: Form | None = None, any_text: bool = False) -> Any:
    """A setting. `form`: the form every text of the value takes (a list's items, a mapping's keys); `any_text`:
    its text may hold control characters (line breaks), because it is never written into a script or a command."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "le": le, "gt": gt, "lt": lt, "form": form,
            "any_text": any_text}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def doc_of(section: type, name: str) -> str:
    return section.__dataclass_fields__[name].metadata["doc"]


def default_of(section: type, name: str) -> Any:
    f = section.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def control_character(text: str) -> str | None:
    """The first control character (or line separator) in `text`, or None."""
    return next((c for c in text if unicodedata.category(c) in _CONTROL_CATEGORIES), None)


def texts(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every text in a value, with its key below `path`: itself, a section's fields, a list's items (`key[i]`), a
    mapping's keys and values (`key.name`), at any depth."""
    if isinstance(value, str):
        yield path, value
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from texts(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(value, dict):
        for k, v in value.items():
            key = f"{path}.{k}" if path else str(k)
            yield from texts(k, key)
            yield from texts(v, key)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from texts(v, f"{path}[{i}]")


def _named(value: Any) -> list[Any]:
    """What a form applies to: the value, a list's items, a mapping's keys."""
    if isinstance(value, dict):
        return list(value)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def violation(value: Any, meta: dict) -> str | None:
    """What is wrong with `value` by the bounds in `meta` (a knob's metadata), or None when it is within them. A
    number is finite: no bound holds for nan, and inf is no size."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if not meta.get("any_text"):
        for _, text in texts(value):
            if (c := control_character(text)) is not None:
                return (f"holds the control character {c!r} in {text!r}: values are written into scripts and job "
                        f"files, where it would end a line")
    form = meta.get("form")
    if form is not None:
        for name in _named(value):
            if not (isinstance(name, str) and form.fits(name)):
                return f"takes {form.what} ({form.pattern}); got {name!r}"
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(str(c) for c in choices)}; got {value!r}"
    for bound, holds, sym in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                              ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        if meta.get(bound) is not None and not holds(value, meta[bound]):
            return f"must be {sym} {meta[bound]}, got {value!r}"
    return None
