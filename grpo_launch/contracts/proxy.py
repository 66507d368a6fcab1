"""The routing proxy's settings that a recipe (`proxy.*`) and `grpo proxy`'s flags both take, declared once.

`compose.schema.Proxy` and `proxy.config.ProxyConfig` extend this section, and the flags of `cli/proxy.py` take
their defaults and help from `ProxyConfig`: one default, one doc line and one bound per setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_launch.contracts.hosts import is_loopback
from grpo_launch.contracts.knobs import knob


@dataclass(kw_only=True)
class ProxyKnobs:
    host: str = knob("127.0.0.1", "Address the routing proxy binds; any address but loopback (0.0.0.0, the node's "
                                  "own) needs a client key.")
    imbalance: int = knob(8, "Overload margin: a replica whose outstanding tokens exceed the least-loaded replica's by "
                             "more than this many requests' worth (and are over twice as many) gets no new group and "
                             "no prefix affinity; a group's own requests always follow it.", ge=0)
    max_tracked_blocks: int = knob(500_000, "Prefix blocks remembered (LRU).", ge=1)
    lora_load_timeout_s: float = knob(300.0, "How long an adapter load waits for every replica to see the adapter "
                                             "directory (shared storage lag).", gt=0)


def unguarded_exposure(host: str, *, keyed: bool) -> str | None:
    """Why a proxy that listens on `host` may not start without a client key, or None when it may: beyond loopback,
    anyone who reaches the port could generate, load adapters and pause the replicas."""
    if keyed or is_loopback(host):
        return None
    return (f"the proxy would listen on {host} without a client key: anyone who reaches it could generate, load "
            f"and unload adapters, and pause the replicas")
