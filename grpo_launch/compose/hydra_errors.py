"""Hydra's and OmegaConf's errors in a user's words: the key, what is wrong with it, how to fix it.

Composition (`compose`) raises what Hydra and OmegaConf raise; `user_error` reads the key and the kind of mistake
from them (an unknown key, with a did-you-mean or the key's new name where it moved; a wrong type; a missing value)
and makes the `UserError` the CLI shows.
"""

from __future__ import annotations

import re
import typing
from typing import Any

from grpo_launch.compose import schema
from grpo_launch.compose.grammar import parse_override
from grpo_launch.contracts import trl_fields
from grpo_launch.errors import UserError, did_you_mean

_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               dict: "a mapping"}


def _every_key() -> list[str]:
    return [k for k, *_ in schema.schema_keys()] + [f"trainer.{n}" for n in trl_fields.all_field_names()]


def _omegaconf_cause(e: BaseException) -> Any:
    from omegaconf.errors import OmegaConfBaseException

    while e is not None and not (isinstance(e, OmegaConfBaseException) and getattr(e, "full_key", None)):
        e = e.__cause__ or e.__context__
    return e


def user_error(e: BaseException, overrides: list[str]) -> UserError:
    """A composition error as the user should read it: the key, what is wrong with it, how to fix it."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, ValidationError

    text = str(e)
    cause = _omegaconf_cause(e)
    full_key = cause.full_key if cause is not None else None
    if full_key is None:  # a group file's error carries the key in its text only
        found = re.search(r"full_key: (\S+)", text)
        full_key = found.group(1) if found else None
    if full_key is not None:
        if isinstance(cause, MissingMandatoryValue) or "Missing mandatory value" in text:
            return UserError(f"missing required value '{full_key}'", key=full_key,
                             hint=f"set it in the recipe or on the command line: {full_key}=...")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) or " not in '" in text:
            return unknown_key(_unknown_path(text, full_key, overrides))
        if isinstance(cause, ValidationError) or "ValidationError" in text:
            return _wrong_type(full_key, cause.msg if cause is not None else text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    message = lines[0] if lines else type(e).__name__
    return UserError(f"cannot compose the recipe: {message}", key=None, hint=" ".join(lines[1:3]) or None)


def _unknown_path(text: str, full_key: str, overrides: list[str]) -> str:
    """The unknown key's whole path. Hydra names the override it could not apply ("Could not override 'a.b'");
    OmegaConf names the key from the value's own root when the value is a whole section or list of them."""
    found = re.search(r"Could not override '([^']+)'", text)
    if not found:
        return full_key
    overridden = found.group(1)
    if full_key == overridden or full_key.startswith(overridden + "."):
        return full_key
    if typing.get_origin(schema.type_at(overridden)) is list:  # find the entry holding the unknown key
        key = full_key.split(".")[0]
        for given in map(parse_override, overrides):
            if given.key_or_group == overridden and isinstance(given.value(), list):
                index = next((i for i, v in enumerate(given.value()) if isinstance(v, dict) and key in v), 0)
                return f"{overridden}[{index}].{full_key}"
    return f"{overridden}.{full_key}" if schema.type_at(overridden) is not None else overridden


def unknown_key(path: str) -> UserError:
    dotted = re.sub(r"\[(\d+)\]", r".\1", path)
    if dotted.startswith("rewards."):  # a list entry: suggest the entry's own keys
        index, _, rest = dotted[len("rewards."):].partition(".")
        fields = [k for k, *_ in schema.schema_keys(schema.Reward)]
        return UserError(f"unknown key 'rewards[{index}].{rest}'"
                         f"{did_you_mean(rest, fields, prefix=f'rewards[{index}].')}", key=path,
                         hint=f"each reward takes {', '.join(fields)}")
    if (new := schema.moved_to(dotted)) is not None:
        return UserError(f"unknown key '{path}': it moved; did you mean '{new}'?", key=path,
                         hint=f"rename it to {new} (see docs/recipe-reference.md)")
    return UserError(f"unknown key '{path}'{did_you_mean(path, _every_key())}", key=path,
                     hint="see `grpo recipes show` or docs/recipe-reference.md for every key")


def _wrong_type(path: str, message: str) -> UserError:
    if "'None'" in message or "is not Optional" in message:
        return UserError(f"'{path}' must not be null", key=path, hint="give it a value, or drop it to use the default")
    dotted = re.sub(r"\[(\d+)\]", r".\1", path)
    tp = schema.type_at(dotted)
    origin = typing.get_origin(tp) or tp
    kind = _KIND_NAMES.get(origin, "a mapping of keys") if tp is not None else "another type"
    found = re.search(r"Value '(.*)' (?:of type|is not)", message) or re.search(r"to string: '(.*)'", message)
    got = f", got {found.group(1)!r}" if found else ""
    hint = f"Hydra list syntax: {path}=[a,b]" if origin is list else None
    return UserError(f"'{path}' must be {kind}{got}", key=path, hint=hint)
