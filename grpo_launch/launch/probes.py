"""What the supervisor asks a process over HTTP: whether it is ready (within its bound), whether a ready one still
answers (its spec's `liveness`), and its final counters. Readiness and liveness come back as events on the
supervisor's queue."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from grpo_launch.contracts.plan import ProcessSpec
from grpo_launch.launch.children import NotReady, Ready, Unresponsive

READY_POLL_S = 0.5
READY_PROBE_S = 3.0              # how long one readiness probe may take
METRICS_FETCH_S = 3.0            # how long a process may take to give its final counters
PROBE_AGENT = "grpo-launch"      # the User-Agent of the supervisor's probes


def _bearer(key_env: str | None) -> dict[str, str]:
    """The Authorization header a spec's probes send: the key its variable holds (a keyed proxy answers nothing
    without it, a vLLM server nothing but /health), read from the environment by name; none where it is unset."""
    key = os.environ.get(key_env, "") if key_env else ""
    return {"Authorization": f"Bearer {key}"} if key else {}


async def probe(url: str, timeout_s: float, key_env: str | None = None) -> int | None:
    """The HTTP status `url` answers GET with within `timeout_s`; None when it does not answer. On the event loop,
    so a probe of a wedged server is cancelled with the run, not left in a thread."""
    parts = urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    headers = "".join(f"{k}: {v}\r\n" for k, v in _bearer(key_env).items())
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), ssl=parts.scheme == "https")
            writer.write(f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUser-Agent: {PROBE_AGENT}\r\n{headers}"
                         f"Connection: close\r\n\r\n".encode())
            await writer.drain()
            status = await reader.readline()
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
    code = status.split(b" ", 2)[1:2]
    return int(code[0]) if code and code[0].isdigit() else None


async def poll_ready(events: asyncio.Queue, name: str, spec: ProcessSpec, generation: int) -> None:
    """Probe `spec`'s readiness URL until it answers 200 (Ready) or its timeout passes (NotReady)."""
    timeout = spec.ready_timeout_s
    started = time.monotonic()
    while await probe(spec.ready_url, READY_PROBE_S, spec.probe_key_env) != 200:
        if time.monotonic() - started > timeout:
            await events.put(NotReady(name, generation, spec.ready_url, timeout))
            return
        await asyncio.sleep(READY_POLL_S)
    await events.put(Ready(name, generation, time.monotonic() - started))


async def watch_liveness(events: asyncio.Queue, name: str, spec: ProcessSpec, generation: int) -> None:
    """Probe a ready process until `failures` probes in a row go unanswered: then it counts as dead. Any answer
    is life: the proxy answers 503 while a replica behind it restarts (vLLM exits when its engine dies)."""
    live = spec.liveness
    answered, failures = time.monotonic(), 0
    while failures < live.failures:
        await asyncio.sleep(live.interval_s)
        if await probe(spec.ready_url, live.timeout_s, spec.probe_key_env) is not None:
            answered, failures = time.monotonic(), 0
        else:
            failures += 1
    await events.put(Unresponsive(name, generation, spec.ready_url, failures, time.monotonic() - answered))


def fetch_metrics(spec: ProcessSpec, target: Path) -> None:
    """A process's counters (its metrics URL, Prometheus text) into `target`; blocking, for a thread."""
    try:
        request = urllib.request.Request(spec.metrics_url, headers=_bearer(spec.probe_key_env))
        with urllib.request.urlopen(request, timeout=METRICS_FETCH_S) as response:
            target.write_bytes(response.read())
    except OSError:
        pass  # a process that cannot answer any more leaves no counters
