"""The routing proxy's settings that a recipe (`placement.async_lora.proxy.*`) and `grpo proxy`'s flags both take,
declared once, and the proxy's command line.

`compose.schema.Proxy` and `proxy.config.ProxyConfig` extend this section, and the flags of `cli/proxy.py` take
their defaults and help from `ProxyConfig`: one default, one doc line and one bound per setting. `proxy_argv` writes
a setting as the flag `grpo proxy` reads it (`flag`), so the planner never spells a flag by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from grpo_launch.contracts.hosts import LOOPBACK, is_loopback
from grpo_launch.contracts.knobs import knob

DEFAULT_PROXY_PORT = 8080


@dataclass(kw_only=True)
class ProxyKnobs:
    host: str = knob(LOOPBACK, "Address the routing proxy binds; any address but loopback (0.0.0.0, the node's "
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


def flag(name: str) -> str:
    """`grpo proxy`'s flag for a setting (a parameter of cli/proxy.py): block_size -> --block-size."""
    return "--" + name.replace("_", "-")


def proxy_argv(knobs: ProxyKnobs, **more: Any) -> tuple[str, ...]:
    """`grpo proxy` with the shared settings of `knobs` and the flags `more` names by their parameter (a list
    repeats its flag; None leaves it out)."""
    argv = ["grpo", "proxy"]
    values = {f.name: getattr(knobs, f.name) for f in dataclasses.fields(ProxyKnobs)} | more
    for name, value in values.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                argv += [flag(name), str(item)]
    return tuple(argv)
