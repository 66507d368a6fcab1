"""Run the proxy in the foreground until SIGINT or SIGTERM (what `grpo proxy` does)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from grpo_launch.proxy.config import ProxyConfig
from grpo_launch.proxy.server import running

log = logging.getLogger("grpo_launch.proxy")


def run(config: ProxyConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s grpo-proxy %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    asyncio.run(_serve(config))


async def _serve(config: ProxyConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running(config) as proxy:
        log.info("listening on %s: %d replica(s) %s, block %d tokens, imbalance %d%s", proxy.url,
                 len(config.replicas), ", ".join(config.replicas), config.block_size, config.imbalance,
                 ", client API key required" if config.client_api_key else "")
        await stop.wait()
        # The last word on the run's traffic (errors returned to clients, retries), kept in the proxy's log.
        log.info("stopping; stats %s", json.dumps(proxy.proxy.snapshot(), separators=(",", ":")))
