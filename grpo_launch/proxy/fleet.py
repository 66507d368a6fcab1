"""The replicas behind the proxy: which are in routing, and the fleet-wide state a returning replica must catch up on.

A background probe calls each replica's /health. A replica that fails it, refuses a connection, or leaves a state
change unanswered (its connection dropped after the call was sent, or no answer in time: what it did is unknown)
leaves routing at once and its prefix ownership is forgotten. When it answers /health again it is brought to the
fleet's whole state first (the adapters the fleet serves loaded, those it unloaded unloaded, paused exactly when the
fleet is) and only then readmitted, so an adapter name means the same weights on every replica and no replica holds
requests the fleet has resumed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from grpo_launch.proxy.router import PrefixRouter
from grpo_launch.proxy.upstream import Upstream

log = logging.getLogger("grpo_launch.proxy")

T = TypeVar("T")
RETIRED_NAMES = 4096  # adapter names unloaded through the proxy that a returning replica is checked for


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
        # What every replica in routing has been told: adapters by name (load order) and the pause query, if paused;
        # and the adapter names unloaded (or rolled back) since, which a returning replica must not keep serving.
        self.adapters: dict[str, str] = {}
        self.retired: OrderedDict[str, None] = OrderedDict()
        self.paused: str | None = None
        # Held by every broadcast and readmission: a replica never joins halfway through an adapter load.
        self.lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    def available(self, excluding: int | None = None) -> list[int]:
        return [r.index for r in self.replicas if r.healthy and r.index != excluding]

    def all_healthy(self) -> bool:
        return all(r.healthy for r in self.replicas)

    def mark_dead(self, index: int, reason: str) -> None:
        """Out of routing until its /health answers and it has caught up with the fleet's state."""
        replica = self.replicas[index]
        if replica.healthy:
            replica.healthy = False
            self.router.forget(index)
            log.warning("replica %s left routing: %s", replica.url, reason)

    def loaded(self, name: str, path: str) -> None:
        self.adapters[name] = path
        self.retired.pop(name, None)

    def unloaded(self, name: str) -> None:
        self.adapters.pop(name, None)
        self.retired[name] = None
        self.retired.move_to_end(name)
        while len(self.retired) > RETIRED_NAMES:
            self.retired.popitem(last=False)

    async def watch(self) -> None:
        """Probe every replica now, then every interval, until cancelled."""
        while True:
            outcomes = await asyncio.gather(*(self._probe(r) for r in self.replicas), return_exceptions=True)
            for replica, outcome in zip(self.replicas, outcomes, strict=True):
                if isinstance(outcome, Exception):  # a bug, but the probe must go on: it is how replicas return
                    log.error("probing %s failed: %r", replica.url, outcome)
            await asyncio.sleep(self.health_interval_s)

    def probe_now(self, index: int) -> None:
        """A call to this replica went unanswered (a cut connection, a dropped request): ask its /health at once
        rather than at the next interval, so that a dead replica leaves routing before more requests reach it. One
        already out of routing waits for the regular probe, which readmits it."""
        if self.replicas[index].healthy:
            self.start(self._probe(self.replicas[index]))

    def start(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task held until it ends (asyncio keeps only a weak reference), and cancelled by `stop`."""
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
            self.start(self._readmit(replica))

    async def _readmit(self, replica: Replica) -> None:
        try:
            async with self.lock:
                await self._catch_up(replica)
                self.router.rejoined(replica.index, self.available())
                replica.healthy = True
            log.info("replica %s is in routing", replica.url)
            if self.on_readmit is not None:
                await self.on_readmit(replica)
        except (aiohttp.ClientError, TimeoutError, CatchUpError) as e:
            log.warning("replica %s answers /health but stays out of routing: %s", replica.url, e)
        finally:
            replica.readmitting = False

    async def _catch_up(self, replica: Replica) -> None:
        if self.adapters or self.retired:
            reply = await self.upstream.call(replica.url, "GET", "/v1/models")
            if reply.status != 200:
                raise CatchUpError(f"/v1/models answered {reply.status}")
            has = {card.get("id") for card in _object(reply.body).get("data", []) if isinstance(card, dict)}
            for name, path in self.adapters.items():
                if name not in has:
                    await self._tell(replica, "/v1/load_lora_adapter",
                                     {"lora_name": name, "lora_path": path, "load_inplace": False})
            for name in has & self.retired.keys():
                await self._tell(replica, "/v1/unload_lora_adapter", {"lora_name": name}, also_ok=(404,))
        await self._match_pause(replica)

    async def _match_pause(self, replica: Replica) -> None:
        """Paused with the fleet's query while the fleet is paused; otherwise resumed if vLLM says it is paused (a
        replica without dev mode answers /is_paused 404: it has no /pause either)."""
        if self.paused is not None:
            await self._tell(replica, self.paused)
            return
        reply = await self.upstream.call(replica.url, "GET", "/is_paused")
        if reply.status == 404:
            return
        if reply.status != 200:
            raise CatchUpError(f"/is_paused answered {reply.status}")
        if _object(reply.body).get("is_paused") is True:
            await self._tell(replica, "/resume")

    async def _tell(self, replica: Replica, path_qs: str, body: dict | None = None,
                    also_ok: tuple[int, ...] = ()) -> None:
        reply = await self.upstream.call(replica.url, "POST", path_qs, body=json.dumps(body).encode() if body else b"",
                                         headers=self.upstream.headers({"Content-Type": "application/json"}))
        if reply.status != 200 and reply.status not in also_ok:
            raise CatchUpError(f"{path_qs} {body or ''} answered {reply.status}: {reply.text[:200]}")


class CatchUpError(Exception):
    pass


def _object(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except ValueError as e:
        raise CatchUpError(f"answered something that is not JSON: {body[:200]!r}") from e
    if not isinstance(value, dict):
        raise CatchUpError(f"answered {body[:200]!r}, not a JSON object")
    return value
