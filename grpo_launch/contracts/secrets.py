"""Secrets the processes read from the environment by name (`ProcessSpec.pass_env`, a keyed proxy's client key),
and keeping their values out of everything grpo-launch writes.

A value reaches a process through its environment only. What a process prints can still hold one (TRL's clients
carry the proxy's key in the server URL, which their error messages repeat), so the supervisor writes every line of
output, and the trainer its failure record, with each such value replaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import quote

from grpo_launch.contracts.plan import Plan

REDACTED = "***"
MIN_SECRET_LENGTH = 8  # a shorter value is not a key, and replacing it would shred the output


def secret_names(plan: Plan) -> list[str]:
    """Every variable a process of the plan reads a secret from."""
    names = [n for p in plan.processes for n in (*p.pass_env, p.probe_key_env) if n]
    if plan.trainer_inputs.server_key_env:
        names.append(plan.trainer_inputs.server_key_env)
    return list(dict.fromkeys(names))


def missing_keys(plan: Plan, environ: Mapping[str, str]) -> list[str]:
    """The variables holding a key a server requires (and its clients send) that are unset or empty."""
    names = [p.probe_key_env for p in plan.processes if p.probe_key_env]
    names += [plan.trainer_inputs.server_key_env] if plan.trainer_inputs.server_key_env else []
    return [n for n in dict.fromkeys(names) if not environ.get(n)]


def secret_values(names: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values to keep out of output: each variable's, and as a URL spells it."""
    values = {v for n in names if len(v := environ.get(n, "")) >= MIN_SECRET_LENGTH}
    return tuple(sorted(values | {quote(v, safe="") for v in values}, key=len, reverse=True))


def redact(text: str, values: tuple[str, ...]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text
