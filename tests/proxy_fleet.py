"""A proxy in front of simulated vLLM replicas, all on 127.0.0.1 in the test's own event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from standins.sim_replica import SimReplica

from grpo_launch.proxy.config import ProxyConfig
from grpo_launch.proxy.server import Proxy, running

WAIT_S = 5.0  # any condition a test waits for is met well within this, or the test fails


@dataclasses.dataclass
class Fleet:
    proxy: Proxy
    url: str
    sims: list[SimReplica]
    http: aiohttp.ClientSession

    async def post(self, path: str, body: Any = None, **kwargs) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body, **kwargs) as r:
            return r.status, await _decoded(r)

    async def get(self, path: str, **kwargs) -> tuple[int, Any]:
        async with self.http.get(self.url + path, **kwargs) as r:
            return r.status, await _decoded(r)

    async def complete(self, tokens: list[int], model: str = "sim/base", **extra) -> aiohttp.ClientResponse:
        """A TRL-shaped generation request; returns the response with its body read."""
        body = {"model": model, "prompt": tokens, "max_tokens": 4, "n": 1, "return_token_ids": True, "logprobs": 0,
                **extra}
        async with self.http.post(self.url + "/v1/completions", json=body) as r:
            await r.read()
            return r

    async def until(self, condition, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not await _holds(condition):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)


async def _holds(condition) -> bool:
    result = condition()
    return await result if asyncio.iscoroutine(result) else bool(result)


async def _decoded(r: aiohttp.ClientResponse) -> Any:
    return await r.json() if r.content_type == "application/json" else await r.text()


@asynccontextmanager
async def fleet(replicas: int = 2, *, sim: dict | None = None, headers: dict | None = None, **config):
    """Start `replicas` simulated replicas and the proxy; yields once the proxy's /health is 200."""
    sims = [SimReplica(f"r{i}", **(sim or {})) for i in range(replicas)]
    for s in sims:
        await s.start()
    settings = {"health_interval_s": 0.05, "health_timeout_s": 1.0, "lora_retry_s": 0.05, "connect_timeout_s": 1.0,
                "request_timeout_s": 10.0, **config}
    try:
        async with running(ProxyConfig(replicas=tuple(s.url for s in sims), port=0, **settings)) as proxy, \
                aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=WAIT_S * 2)) as http:
            f = Fleet(proxy.proxy, proxy.url, sims, http)
            await f.until(proxy.proxy.fleet.all_healthy, "every replica in routing")
            yield f
    finally:
        for s in sims:
            await s.stop()


def served_by(response: aiohttp.ClientResponse) -> str:
    return response.headers["x-sim-replica"]
