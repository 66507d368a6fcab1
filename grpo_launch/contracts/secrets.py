"""Secrets the processes read from the environment by name (`ProcessSpec.pass_env`, a keyed proxy's client key, the
key every vLLM server requires), keeping their values out of everything grpo-launch writes, and reading the key an
HTTP client presents (the proxy and the vLLM servers' guard check it alike).

A value reaches a process through its environment only. What a process prints can still hold one (TRL's clients
carry the server's key in its URL, which their error messages repeat), so the supervisor writes every line of
output, and the trainer its failure record, with each such value replaced.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping
from urllib.parse import quote

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV

REDACTED = "***"
MIN_SECRET_LENGTH = 8  # a shorter value is not a key, and replacing it would shred the output


def secret_names(plan: Plan) -> list[str]:
    """Every variable a process of the plan reads a secret from."""
    names = [n for p in plan.processes for n in (*p.pass_env, p.probe_key_env) if n]
    if plan.trainer_inputs.server_key_env:
        names.append(plan.trainer_inputs.server_key_env)
    return list(dict.fromkeys(names))


def missing_keys(plan: Plan, environ: Mapping[str, str]) -> list[str]:
    """The variables holding a key a server requires (and its clients send) that are unset or empty. The replicas'
    key is not among them: the launch makes it where it can (`launch.replica_key`)."""
    names = [p.probe_key_env for p in plan.processes if p.probe_key_env]
    names += [plan.trainer_inputs.server_key_env] if plan.trainer_inputs.server_key_env else []
    return [n for n in dict.fromkeys(names) if n != REPLICA_KEY_ENV and not environ.get(n)]


def secret_values(names: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values to keep out of output: each variable's, and as a URL spells it."""
    values = {v for n in names if len(v := environ.get(n, "")) >= MIN_SECRET_LENGTH}
    return tuple(sorted(values | {quote(v, safe="") for v in values}, key=len, reverse=True))


def redact(text: str, values: tuple[str, ...]) -> str:
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def presented_key(authorization: str) -> str | None:
    """The key a client sent: 'Bearer <key>', or HTTP Basic auth with the key as password (what TRL's clients send
    for a URL with user info, http://user:<key>@host:port); None for anything else."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(credentials.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def key_matches(authorization: str, expected: str) -> bool:
    """Whether an Authorization header presents `expected` (compared in constant time)."""
    key = presented_key(authorization)
    return key is not None and hmac.compare_digest(key.encode(), expected.encode())
