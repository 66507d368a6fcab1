"""Hydra's override grammar, read by Hydra's public parser: one place turns an override's text into an `Override`
(or a `UserError` naming the malformed text), for composition, sweeps and the origins of values."""

from __future__ import annotations

from functools import cache
from typing import Any

from grpo_launch.errors import UserError

MAX_NESTING = 32  # lists, mappings and calls inside each other: a recipe needs a few; OmegaConf recurses on each


@cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_override(text: str) -> Any:
    """One override (`key=value`, `group=option`, `+key=value`, `++key=value`, `~key`, a sweep) as an `Override`."""
    from hydra.errors import OverrideParseException

    depth = _nesting(text)
    if depth > MAX_NESTING:
        raise UserError(f"override '{text[:60]}...' nests lists, mappings or calls {depth} deep; at most "
                        f"{MAX_NESTING}", key=text.partition("=")[0], hint="flatten the value, or set its parts "
                                                                          "one key at a time (a.b.c=1)")
    try:
        (override,) = _parser().parse_overrides([text])
    except OverrideParseException as e:
        first = str(e).splitlines()[0] if str(e) else "unparseable"
        raise UserError(f"malformed override '{text}': {first}", key=text,
                        hint="overrides look like key=value, group=option, +key=value or ~key; "
                             "quote values with spaces: key='a b'") from None
    return override


def _nesting(text: str) -> int:
    """How deep brackets nest in an override's text, outside quoted strings (as Hydra's grammar quotes them)."""
    depth = deepest = 0
    quote, escaped = None, False
    for ch in text:
        if quote:
            escaped, quote = (False, quote) if escaped else (ch == "\\", None if ch == quote else quote)
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]})":
            depth -= 1
    return deepest
