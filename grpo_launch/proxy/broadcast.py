"""State changes every replica must make together: adapter loads and unloads, pause/resume, sleep, cache resets.

A replica that refuses the connection has left routing; one whose answer never comes (the connection dropped after the
call was sent, or no answer in time) did something unknown: it leaves routing too. Either way it is brought to the
fleet's whole state when it answers /health again (see fleet), so the outcome is decided by the replicas that answered.
An adapter load, a pause and a resume are all-or-nothing: a refusal is undone on the replicas that had accepted (the
adapter unloaded, the pause resumed, the resume paused again) and returned. A replica that cannot see the adapter
directory yet (shared storage lags) is asked again until `lora_load_timeout_s`; a mount that never shows the
directory answers 504, never 404: TRL reads a 404 from /v1/load_lora_adapter as "runtime LoRA updating is off".
A broadcast runs to its end whatever its client does: the server runs it as a task of its own, which a client's
hang-up does not cancel.
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
    reply: Reply | None   # None: it left routing (refused, dropped, or no answer in time) and will be re-synced


async def _send(fleet: Fleet, index: int, path_qs: str, body: bytes, headers: dict[str, str]) -> _Answer:
    replica = fleet.replicas[index]
    try:
        return _Answer(index, await fleet.upstream.call(replica.url, "POST", path_qs, body=body, headers=headers))
    except aiohttp.ClientConnectorError as e:
        fleet.mark_dead(index, f"{path_qs.split('?')[0]}: connection refused ({e.os_error or e})")
    except (aiohttp.ClientError, TimeoutError) as e:
        fleet.mark_dead(index, f"{path_qs.split('?')[0]} sent, no answer ({type(e).__name__}): re-synced on return")
    return _Answer(index, None)


def _describe(fleet: Fleet, answers: list[_Answer]) -> str:
    return "; ".join(f"{fleet.replicas[a.replica].url}: {a.reply.status} {a.reply.text.strip()[:300]}"
                     for a in answers if a.reply is not None)


def _no_replica(path: str) -> Outcome:
    return Outcome(error_reply(503, f"no replica in routing answered {path}", "ServiceUnavailable"), "no_replica")


# What undoes an accepted state change when another replica refused it. A resume is undone with the fleet's pause.
UNDO = {"/pause": lambda fleet: "/resume", "/resume": lambda fleet: fleet.paused}


async def broadcast(fleet: Fleet, path: str, path_qs: str, body: bytes, headers: dict[str, str],
                    ok_statuses: Collection[int] = (200,)) -> Outcome:
    """Send to every replica in routing; the first reply when all that answered accept, else the first refusal,
    naming every refusing replica, after undoing a pause or resume on the replicas that accepted it."""
    async with fleet.lock:
        targets = fleet.available()
        answers = [a for a in await asyncio.gather(*(_send(fleet, i, path_qs, body, headers) for i in targets))
                   if a.reply is not None]
        if not answers:
            return _no_replica(path)
        failed = [a for a in answers if a.reply.status not in ok_statuses]
        if failed:
            undo = UNDO[path](fleet) if path in UNDO else None
            if undo is not None:
                accepted = [a.replica for a in answers if a.reply.status in ok_statuses]
                await _undo(fleet, accepted, undo, headers)
            message = f"{path} failed on {len(failed)} of {len(answers)} replicas: {_describe(fleet, failed)}"
            if undo is not None:
                message += f"; undone with {undo.split('?')[0]} where it was accepted"
            return Outcome(error_reply(failed[0].reply.status, message, "BroadcastError"),
                           "rolled_back" if undo is not None else "failed")
        if path == "/pause":
            fleet.paused = path_qs
        elif path == "/resume":
            fleet.paused = None
        elif path in ("/reset_prefix_cache", "/sleep"):  # vLLM drops its prefix cache on both
            fleet.router.clear()
        # Replicas agree; an unload that found the adapter somewhere says so, like vLLM's would.
        return Outcome(next((a.reply for a in answers if a.reply.status == 200), answers[0].reply), "ok")


async def _undo(fleet: Fleet, replicas: list[int], path_qs: str, headers: dict[str, str],
                body: bytes = b"", ok_statuses: Collection[int] = (200,)) -> None:
    """A replica that does not accept the undo is left in an unknown state: out of routing, re-synced on return."""
    answers = await asyncio.gather(*(_send(fleet, i, path_qs, body, headers) for i in replicas))
    for a in answers:
        if a.reply is not None and a.reply.status not in ok_statuses:
            fleet.mark_dead(a.replica, f"undoing with {path_qs.split('?')[0]} answered {a.reply.status}: "
                                       f"re-synced on return")


async def unload_adapter(fleet: Fleet, path_qs: str, body: bytes, headers: dict[str, str]) -> Outcome:
    """Unload everywhere; a replica that does not have the adapter (404) is already where it should be. Only when
    no replica had it does the answer stay vLLM's 404."""
    name = _field(body, "lora_name")
    outcome = await broadcast(fleet, UNLOAD, path_qs, body, headers, ok_statuses=(200, 404))
    if outcome.label == "ok" and name is not None:
        fleet.unloaded(name)
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
        give_up = asyncio.Event()  # one replica refused: the others stop waiting for the mount

        async def load_on(index: int) -> _Answer:
            while True:
                answer = await _send(fleet, index, path_qs, body, headers)
                if answer.reply is None or answer.reply.status == 200:
                    return answer
                if not _not_visible_yet(answer.reply) or loop.time() + retry_s > deadline:
                    give_up.set()
                    return answer
                try:
                    await asyncio.wait_for(give_up.wait(), retry_s)
                    return answer  # another replica failed: this one never loaded it
                except TimeoutError:
                    pass

        answers = [a for a in await asyncio.gather(*(load_on(i) for i in targets)) if a.reply is not None]
        if not answers:
            return _no_replica(LOAD)
        loaded = [a for a in answers if a.reply.status == 200]
        if len(loaded) == len(answers):
            fleet.loaded(name, path)
            return Outcome(loaded[0].reply, "ok")

        # Roll back: unload where it loaded. A replica that left routing meanwhile may have loaded it: the name is
        # retired, so it is unloaded there when it returns (unless the fleet already served that name).
        if name not in fleet.adapters:
            fleet.unloaded(name)
        await _undo(fleet, [a.replica for a in loaded], UNLOAD, headers, json.dumps({"lora_name": name}).encode(),
                    ok_statuses=(200, 404))
        refused = [a for a in answers if a.reply.status != 200 and not _not_visible_yet(a.reply)]
        undone = f"unloaded again from {len(loaded)} replica(s)" if loaded else "loaded on no replica"
        if refused:
            status = refused[0].reply.status
            message = f"adapter {name} refused: {_describe(fleet, refused)}; {undone}"
            return Outcome(error_reply(status, message, "AdapterLoadError"), "rolled_back")
        waiting = [a for a in answers if a.reply.status != 200]
        message = (f"adapter {name} not loadable everywhere within {timeout_s:g} s (is {path} visible on every "
                   f"replica's storage?): {_describe(fleet, waiting)}; {undone}")
        return Outcome(error_reply(504, message, "AdapterLoadTimeout"), "timeout")


def _not_visible_yet(reply: Reply) -> bool:
    """vLLM's LoRAAdapterNotFoundError: 'Loading lora X failed: No adapter found for PATH' (404; 400 in older)."""
    return reply.status in (400, 404) and b"No adapter found" in reply.body


def _field(body: bytes, key: str) -> str | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None
