"""Hydra's override grammar, read by Hydra's public parser: one place turns an override's text into an `Override`
(or a `UserError` naming the malformed text), for composition, sweeps and the origins of values."""

from __future__ import annotations

from functools import cache
from typing import Any

from grpo_launch.errors import UserError


@cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_override(text: str) -> Any:
    """One override (`key=value`, `group=option`, `+key=value`, `++key=value`, `~key`, a sweep) as an `Override`."""
    from hydra.errors import OverrideParseException

    try:
        (override,) = _parser().parse_overrides([text])
    except OverrideParseException as e:
        first = str(e).splitlines()[0] if str(e) else "unparseable"
        raise UserError(f"malformed override '{text}': {first}", key=text,
                        hint="overrides look like key=value, group=option, +key=value or ~key; "
                             "quote values with spaces: key='a b'") from None
    return override
