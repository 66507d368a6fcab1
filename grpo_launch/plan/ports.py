"""Port allocation: the one place ports are handed out, so no two processes of a plan share a port on a machine,
also when several nodes are one machine (loopback nodes)."""

from __future__ import annotations

from grpo_launch.contracts.plan import PortClaim
from grpo_launch.errors import UserError


class PortBook:
    def __init__(self, hosts: tuple[str, ...]) -> None:
        self._hosts = hosts                                # node -> its machine's address
        self._taken: dict[tuple[str, int], tuple[int, str, str]] = {}  # (host, port) -> (node, owner, key)

    def claims(self) -> tuple[PortClaim, ...]:
        """Every port of the plan: node, port, owner and the recipe key that sets it (for `grpo run`'s check)."""
        return tuple(sorted((PortClaim(node=n, port=p, owner=owner, key=key)
                             for (_, p), (n, owner, key) in self._taken.items()), key=lambda c: (c.node, c.port)))

    def _take(self, node: int, port: int, owner: str, key: str) -> int:
        self._taken[(self._hosts[node], port)] = (node, owner, key)
        return port

    def claim(self, node: int, port: int, owner: str, key: str) -> int:
        """Take exactly `port` (a port the user chose) or fail naming both owners."""
        taken = self._taken.get((self._hosts[node], port))
        if taken is not None:
            other_node, other, _ = taken
            where = f"node {node}" if other_node == node else f"nodes {other_node} and {node} (both " \
                                                              f"{self._hosts[node]})"
            raise UserError(f"port {port} on {where} is wanted by both {other} and {owner}", key=key,
                            hint=f"choose another value for {key}")
        return self._take(node, port, owner, key)

    def next_free(self, node: int, start: int, owner: str, key: str) -> int:
        """Take the first free port at or above `start` on the node's machine."""
        port = start
        while (self._hosts[node], port) in self._taken:
            port += 1
        if port > 65535:
            raise UserError(f"no free port at or above {start} on node {node} for {owner}", key=key)
        return self._take(node, port, owner, key)
