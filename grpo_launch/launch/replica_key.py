"""The run's key every `vllm serve` of the plan requires (contracts.vllm.REPLICA_KEY_ENV), in this process's
environment before anything starts, so that the replicas, the proxy, the trainer and the probes all read it by name.

It is the user's, where their environment holds it. Otherwise it is made for the run, but only where the nodes
started from here are all the plan's (one machine; or a job whose scheduler passes this environment to its nodes,
as Slurm's sbatch does): every node must hold the same key. A node that runs part of the plan and was given no key
runs its replicas without one, and says so.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, MutableMapping

from grpo_launch.contracts.plan import Plan, Role
from grpo_launch.contracts.vllm import REPLICA_KEY_BYTES, REPLICA_KEY_ENV


def needs_replica_key(plan: Plan) -> bool:
    return any(REPLICA_KEY_ENV in p.pass_env for p in plan.processes)


def provide_replica_key(plan: Plan, nodes: Collection[int], environ: MutableMapping[str, str]) -> str | None:
    """Put the replicas' key in `environ` for the run if it needs one; what happened, in words (by name, never the
    value), or None when the plan runs no `vllm serve`."""
    if not needs_replica_key(plan):
        return None
    if environ.get(REPLICA_KEY_ENV):
        return f"every vLLM server requires the key in {REPLICA_KEY_ENV}, taken from your environment"
    if set(range(plan.nodes)) <= set(nodes):
        environ[REPLICA_KEY_ENV] = secrets.token_urlsafe(REPLICA_KEY_BYTES)
        return f"every vLLM server requires the key in {REPLICA_KEY_ENV}, made for this run"
    here = [p for p in plan.processes if p.node in nodes and REPLICA_KEY_ENV in p.pass_env]
    servers = [p.name for p in here if p.role == Role.VLLM]
    clients = [p.name for p in here if p.role != Role.VLLM]
    effects = ([f"{', '.join(servers)} answer anyone who reaches their ports, /collective_rpc and /pause included"]
               if servers else []) + ([f"{', '.join(clients)} send the vLLM servers no key"] if clients else [])
    return (f"{REPLICA_KEY_ENV} is not set here, and no key is made for part of a plan (every node must hold the "
            f"same one): {'; '.join(effects)}. Export the same {REPLICA_KEY_ENV} on every node (or where grpo runs, "
            f"for a scheduler that passes its environment on)")
