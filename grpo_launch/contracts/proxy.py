"""The routing proxy's settings that a recipe (`proxy.*`) and `grpo proxy`'s flags both take, declared once.

`compose.schema.Proxy` and `proxy.config.ProxyConfig` extend this section, and the flags of `cli/proxy.py` take
their defaults and help from `ProxyConfig`: one default, one doc line and one bound per setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_launch.contracts.knobs import knob


@dataclass(kw_only=True)
class ProxyKnobs:
    host: str = knob("127.0.0.1", "Address the routing proxy binds; 0.0.0.0 exposes it (set an API key).")
    imbalance: int = knob(8, "Overload margin: a replica whose outstanding tokens exceed the least-loaded replica's by "
                             "more than this many requests' worth (and are over twice as many) gets no new group and "
                             "no prefix affinity; a group's own requests always follow it.", ge=0)
    max_tracked_blocks: int = knob(500_000, "Prefix blocks remembered (LRU).", ge=1)
    lora_load_timeout_s: float = knob(300.0, "How long an adapter load waits for every replica to see the adapter "
                                             "directory (shared storage lag).", gt=0)
