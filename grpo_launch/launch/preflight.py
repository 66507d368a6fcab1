"""What must hold on this machine before `grpo run` writes or starts anything."""

from __future__ import annotations

import socket

from grpo_launch.contracts.plan import Plan
from grpo_launch.errors import UserError


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
