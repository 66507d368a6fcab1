"""State changes every replica must make together: adapter loads and unloads, pause/resume, sleep, cache resets.

A replica that cannot be reached during a broadcast has left routing; it catches up when it returns (see fleet).
An adapter load is all-or-nothing: a replica that cannot see the adapter directory yet (shared storage lags) is
asked again until `lora_load_timeout_s`; any other refusal unloads the adapter from the replicas that did load it
and returns the error. A mount that never shows the directory answers 504, never 404: TRL reads a 404 from
/v1/load_lora_adapter as "runtime LoRA updating is off".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from dataclasses import dataclass

import aiohttp

from grpo_launch.proxy.fleet import Fleet
from grpo_launch.proxy.upstream import Reply, error_reply

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
STATE_PATHS = ("/pause", "/resume", "/reset_prefix_cache", "/sleep", "/wake_up")
BROADCAST_PATHS = (LOAD, UNLOAD, *STATE_PATHS)


@dataclass(frozen=True)
class Outcome:
    reply: Reply          # what the client gets
    label: str            # ok | failed | rolled_back | timeout | no_replica (counted per path)


@dataclass(frozen=True)
class _Answer:
    replica: int
    reply: Reply | None   # None: no answer in time, or gone
    gone: bool = False    # refused or dropped the connection: out of routing until it returns


async def _send(fleet: Fleet, index: int, path_qs: str, body: bytes, headers: dict[str, str]) -> _Answer:
    replica = fleet.replicas[index]
    try:
        return _Answer(index, await fleet.upstream.call(replica.url, "POST", path_qs, body=body, headers=headers))
    except aiohttp.ClientConnectionError as e:
        fleet.mark_dead(index, f"{path_qs.split('?')[0]} failed: {type(e).__name__}")
        return _Answer(index, None, gone=True)
    except TimeoutError:
        return _Answer(index, None)


def _describe(fleet: Fleet, answers: list[_Answer]) -> str:
    parts = []
    for a in answers:
        what = "no answer in time" if a.reply is None else f"{a.reply.status} {a.reply.text.strip()[:300]}"
        parts.append(f"{fleet.replicas[a.replica].url}: {what}")
    return "; ".join(parts)


def _no_replica(path: str) -> Outcome:
    return Outcome(error_reply(503, f"no replica is in routing to receive {path}", "ServiceUnavailable"),
                   "no_replica")


async def broadcast(fleet: Fleet, path: str, path_qs: str, body: bytes, headers: dict[str, str],
                    ok_statuses: Collection[int] = (200,)) -> Outcome:
    """Send to every replica in routing; the first reply when all accept, else the first refusal, naming all."""
    async with fleet.lock:
        targets = fleet.available()
        answers = [a for a in await asyncio.gather(*(_send(fleet, i, path_qs, body, headers) for i in targets))
                   if not a.gone]
        if not answers:
            return _no_replica(path)
        failed = [a for a in answers if a.reply is None or a.reply.status not in ok_statuses]
        if failed:
            first = failed[0].reply
            status = first.status if first is not None else 504
            return Outcome(error_reply(status, f"{path} failed on {len(failed)} of {len(answers)} replicas: "
                                               f"{_describe(fleet, failed)}", "BroadcastError"), "failed")
        if path == "/pause":
            fleet.paused = path_qs
        elif path == "/resume":
            fleet.paused = None
        elif path in ("/reset_prefix_cache", "/sleep"):  # vLLM drops its prefix cache on both
            fleet.router.clear()
        # Replicas agree; an unload that found the adapter somewhere says so, like vLLM's would.
        return Outcome(next((a.reply for a in answers if a.reply.status == 200), answers[0].reply), "ok")


async def unload_adapter(fleet: Fleet, path_qs: str, body: bytes, headers: dict[str, str]) -> Outcome:
    """Unload everywhere; a replica that does not have the adapter (404) is already where it should be. Only when
    no replica had it does the answer stay vLLM's 404."""
    name = _field(body, "lora_name")
    outcome = await broadcast(fleet, UNLOAD, path_qs, body, headers, ok_statuses=(200, 404))
    if outcome.label == "ok" and name is not None:
        fleet.adapters.pop(name, None)
    return outcome


async def load_adapter(fleet: Fleet, path_qs: str, body: bytes, headers: dict[str, str], *,
                       timeout_s: float, retry_s: float) -> Outcome:
    name, path = _field(body, "lora_name"), _field(body, "lora_path")
    if name is None or path is None:
        return Outcome(error_reply(400, "lora_name and lora_path are required", "BadRequestError"), "failed")
    loop = asyncio.get_running_loop()
    async with fleet.lock:
        targets = fleet.available()
        deadline = loop.time() + timeout_s
        give_up = asyncio.Event()  # one replica refused or timed out: the others stop waiting for the mount

        async def load_on(index: int) -> _Answer:
            while True:
                answer = await _send(fleet, index, path_qs, body, headers)
                if answer.gone or (answer.reply is not None and answer.reply.status == 200):
                    return answer
                if answer.reply is None or not _not_visible_yet(answer.reply) or loop.time() + retry_s > deadline:
                    give_up.set()
                    return answer
                try:
                    await asyncio.wait_for(give_up.wait(), retry_s)
                    return answer  # another replica failed: this one never loaded it
                except TimeoutError:
                    pass

        answers = [a for a in await asyncio.gather(*(load_on(i) for i in targets)) if not a.gone]
        if not answers:
            return _no_replica(LOAD)
        loaded = [a for a in answers if a.reply is not None and a.reply.status == 200]
        if len(loaded) == len(answers):
            fleet.adapters[name] = path
            return Outcome(loaded[0].reply, "ok")

        # Roll back: unload where it loaded, and where the answer never came (it may have loaded since).
        undo = [a.replica for a in answers if a.reply is None or a.reply.status == 200]
        unload = json.dumps({"lora_name": name}).encode()
        await asyncio.gather(*(_send(fleet, i, UNLOAD, unload, headers) for i in undo))
        refused = [a for a in answers if a.reply is not None and a.reply.status != 200
                   and not _not_visible_yet(a.reply)]
        undone = f"unloaded again from {len(undo)} replica(s)" if undo else "loaded on no replica"
        if refused:
            status = refused[0].reply.status
            message = f"adapter {name} refused: {_describe(fleet, refused)}; {undone}"
            return Outcome(error_reply(status, message, "AdapterLoadError"), "rolled_back")
        waiting = [a for a in answers if a.reply is None or a.reply.status != 200]
        message = (f"adapter {name} not loadable everywhere within {timeout_s:g} s (is {path} visible on every "
                   f"replica's storage?): {_describe(fleet, waiting)}; {undone}")
        return Outcome(error_reply(504, message, "AdapterLoadTimeout"), "timeout")


def _not_visible_yet(reply: Reply) -> bool:
    """vLLM's LoRAAdapterNotFoundError: 'Loading lora X failed: No adapter found for PATH' (404; 400 in older)."""
    return reply.status in (400, 404) and b"No adapter found" in reply.body


def _field(body: bytes, key: str) -> str | None:
    try:
        value = json.loads(body).get(key)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
