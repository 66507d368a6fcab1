"""Port allocation: the one place ports are handed out, so no two processes of a plan share a port on a host."""

from __future__ import annotations

from grpo_launch.contracts.plan import PortClaim
from grpo_launch.errors import UserError


class PortBook:
    def __init__(self) -> None:
        self._taken: dict[tuple[int, int], str] = {}
        self._keys: dict[tuple[int, int], str] = {}

    def claims(self) -> tuple[PortClaim, ...]:
        """Every port of the plan: node, port, owner and the recipe key that sets it (for `grpo run`'s check)."""
        return tuple(PortClaim(node=n, port=p, owner=owner, key=self._keys[(n, p)])
                     for (n, p), owner in sorted(self._taken.items()))

    def claim(self, node: int, port: int, owner: str, key: str) -> int:
        """Take exactly `port` (a port the user chose) or fail naming both owners."""
        other = self._taken.get((node, port))
        if other is not None:
            raise UserError(f"port {port} on node {node} is wanted by both {other} and {owner}", key=key,
                            hint=f"choose another value for {key}")
        self._taken[(node, port)] = owner
        self._keys[(node, port)] = key
        return port

    def next_free(self, node: int, start: int, owner: str, key: str) -> int:
        """Take the first free port at or above `start`."""
        port = start
        while (node, port) in self._taken:
            port += 1
        if port > 65535:
            raise UserError(f"no free port at or above {start} on node {node} for {owner}", key=key)
        self._taken[(node, port)] = owner
        self._keys[(node, port)] = key
        return port
