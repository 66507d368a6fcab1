"""Node addresses that are known only where the job runs.

A plan whose machines a scheduler picks (Slurm, SkyPilot), or whose `cluster.hosts` is left empty on GPUs, names
node K's address as the reference `${GRPO_HOST_K}`. The job file sets `GRPO_HOST_0..N-1` from the scheduler (Slurm:
each node's NodeAddr; SkyPilot: SKYPILOT_NODE_IPS) and the shell, the supervisor and the trainer entrypoint
substitute them: the same plan.json serves every node.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from grpo_launch.errors import UserError

VARIABLE = "GRPO_HOST_{node}"
LOOPBACK = "127.0.0.1"      # this machine, as every process binds and reaches it
EVERY_INTERFACE = "0.0.0.0"
REFERENCE = re.compile(r"\$\{GRPO_HOST_(\d+)\}")


def reference(node: int) -> str:
    """Node `node`'s address, as the job's environment gives it."""
    return "${" + VARIABLE.format(node=node) + "}"


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.0.0.0/8, ::1, localhost): nothing else can reach what binds it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def variables_in(value: Any) -> set[str]:
    """The GRPO_HOST_K variables a JSON-like value refers to."""
    if isinstance(value, str):
        return {VARIABLE.format(node=int(n)) for n in REFERENCE.findall(value)}
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return set().union(*(variables_in(v) for v in value))
    return set()


def resolve(value: Any, env: Mapping[str, str]) -> Any:
    """`value` (a JSON-like tree) with every `${GRPO_HOST_K}` replaced by its value in `env`."""
    if isinstance(value, str):
        return REFERENCE.sub(lambda m: _address(env, int(m.group(1))), value)
    if isinstance(value, Mapping):
        return {k: resolve(v, env) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve(v, env) for v in value)
    return value


def _address(env: Mapping[str, str], node: int) -> str:
    name = VARIABLE.format(node=node)
    if not env.get(name):
        raise UserError(f"{name} is not set: the plan takes node {node}'s address from the environment",
                        key="cluster.hosts", hint="set cluster.hosts to every node's address, or export "
                                                  "GRPO_HOST_0.. (the Slurm and SkyPilot job files do)")
    return env[name]
