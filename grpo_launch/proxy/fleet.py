"""The replicas behind the proxy: which are in routing, and the fleet-wide state a returning replica must catch up on.

A background probe calls each replica's /health. A replica that fails it (or refuses a connection) leaves routing at
once and its prefix ownership is forgotten. When it answers again it is brought up to date first (every adapter the
fleet serves, the pause) and only then readmitted, so an adapter name means the same weights on every replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from grpo_launch.proxy.router import PrefixRouter
from grpo_launch.proxy.upstream import Upstream

log = logging.getLogger("grpo_launch.proxy")


@dataclass
class Replica:
    index: int
    url: str
    healthy: bool = False
    inflight: int = 0
    requests: int = 0
    readmitting: bool = field(default=False, repr=False)

    def to_json(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "inflight": self.inflight, "requests": self.requests}


class Fleet:
    def __init__(self, urls: tuple[str, ...], upstream: Upstream, router: PrefixRouter, *,
                 health_interval_s: float, health_timeout_s: float,
                 on_readmit: Callable[[Replica], Awaitable[None]] | None = None) -> None:
        self.replicas = [Replica(i, url.rstrip("/")) for i, url in enumerate(urls)]
        self.upstream = upstream
        self.on_readmit = on_readmit
        self.router = router
        self.health_interval_s = health_interval_s
        self._probe_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        # What every healthy replica has been told: adapters by name (load order) and the pause query, if paused.
        self.adapters: dict[str, str] = {}
        self.paused: str | None = None
        # Held by every broadcast and readmission: a replica never joins halfway through an adapter load.
        self.lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    @property
    def inflight(self) -> list[int]:
        return [r.inflight for r in self.replicas]

    def available(self, excluding: int | None = None) -> list[int]:
        return [r.index for r in self.replicas if r.healthy and r.index != excluding]

    def all_healthy(self) -> bool:
        return all(r.healthy for r in self.replicas)

    def mark_dead(self, index: int, reason: str) -> None:
        replica = self.replicas[index]
        if replica.healthy:
            replica.healthy = False
            self.router.forget(index)
            log.warning("replica %s left routing: %s", replica.url, reason)

    async def watch(self) -> None:
        """Probe every replica now, then every interval, until cancelled."""
        while True:
            outcomes = await asyncio.gather(*(self._probe(r) for r in self.replicas), return_exceptions=True)
            for replica, outcome in zip(self.replicas, outcomes, strict=True):
                if isinstance(outcome, Exception):  # a bug, but the probe must go on: it is how replicas return
                    log.error("probing %s failed: %r", replica.url, outcome)
            await asyncio.sleep(self.health_interval_s)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _probe(self, replica: Replica) -> None:
        try:
            reply = await self.upstream.call(replica.url, "GET", "/health", timeout=self._probe_timeout)
            problem = None if reply.status == 200 else f"/health answered {reply.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            problem = f"/health failed: {type(e).__name__}"
        if problem:
            self.mark_dead(replica.index, problem)
        elif not replica.healthy and not replica.readmitting:
            replica.readmitting = True
            task = asyncio.create_task(self._readmit(replica))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _readmit(self, replica: Replica) -> None:
        try:
            async with self.lock:
                await self._catch_up(replica)
                replica.healthy = True
            log.info("replica %s is in routing", replica.url)
            if self.on_readmit is not None:
                await self.on_readmit(replica)
        except (aiohttp.ClientError, TimeoutError, ValueError, CatchUpError) as e:
            log.warning("replica %s answers /health but stays out of routing: %s", replica.url, e)
        finally:
            replica.readmitting = False

    async def _catch_up(self, replica: Replica) -> None:
        if self.adapters:
            reply = await self.upstream.call(replica.url, "GET", "/v1/models")
            if reply.status != 200:
                raise CatchUpError(f"/v1/models answered {reply.status}")
            has = {card.get("id") for card in json.loads(reply.body).get("data", [])}
            for name, path in self.adapters.items():
                if name in has:
                    continue
                body = json.dumps({"lora_name": name, "lora_path": path, "load_inplace": False}).encode()
                reply = await self.upstream.call(replica.url, "POST", "/v1/load_lora_adapter", body=body,
                                                 headers=self.upstream.headers({"Content-Type": "application/json"}))
                if reply.status != 200:
                    raise CatchUpError(f"loading adapter {name} answered {reply.status}: {reply.text[:200]}")
        if self.paused is not None:
            reply = await self.upstream.call(replica.url, "POST", self.paused)
            if reply.status != 200:
                raise CatchUpError(f"{self.paused} answered {reply.status}")


class CatchUpError(Exception):
    pass
