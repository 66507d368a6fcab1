"""The plan's prepare steps (building the tiny model, ...), run before any process starts: each once per run
directory, each within its bound, a kept result (`prepared`) copied rather than built again, a stop request ending
them. A step that fails, or a turn waited for too long, is the run's failure."""

from __future__ import annotations

import asyncio
import fcntl
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.contracts.plan import PrepareStep
from grpo_launch.contracts.rundir import LOGS_DIR, PREPARE_LOCK
from grpo_launch.launch import prepared
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.result import TAIL_LINES, Failure, exit_code_of
from grpo_launch.launch.spawn import PUMP_DRAIN_S, Spawner

LOCK_POLL_S = 0.2


@dataclass(eq=False)
class PrepareSteps:
    steps: tuple[PrepareStep, ...]
    run_dir: Path
    spawner: Spawner
    display: ConsoleDisplay
    stop_requested: asyncio.Event

    async def run(self) -> Failure | None:
        """Each step once per run directory: nodes sharing it (loopback, shared storage) take turns, and a node
        finding what a step creates skips it. Waiting for the turn is bounded by the steps' own bounds. What
        failed, if anything did; a stop request is no failure."""
        if not self.steps:
            return None
        bound = sum(step.timeout_s for step in self.steps)
        deadline = time.monotonic() + bound
        with (self.run_dir / PREPARE_LOCK).open("w") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.stop_requested.is_set():
                        return None
                    if time.monotonic() > deadline:
                        return Failure("prepare", 1, f"another node held {PREPARE_LOCK} for more than {bound:g} s, "
                                                     f"the prepare steps' bound", self.run_dir / PREPARE_LOCK)
                    await asyncio.sleep(LOCK_POLL_S)
            return await self._each_step()

    async def _each_step(self) -> Failure | None:
        for step in self.steps:
            created = self.run_dir / step.creates
            if created.exists():
                continue
            if step.cache_key:
                try:
                    entry = await asyncio.to_thread(prepared.restore, step.cache_key, created)
                except OSError as e:  # the run directory's disk: what a build would hit as well
                    return Failure(step.name, 1, f"copying the kept {step.name} into the run directory failed: "
                                                 f"{e.strerror or e}", self.run_dir / step.creates)
                if entry is not None:
                    self.display.say(f"prepared {step.name}: kept from an earlier run ({entry})")
                    continue
            self.display.preparing(step.name, list(step.argv))
            if (failure := await self._step(step)) or self.stop_requested.is_set():
                return failure
            if step.cache_key:
                await asyncio.to_thread(prepared.keep, step.cache_key, created)
        return None

    async def _step(self, step: PrepareStep) -> Failure | None:
        """Run one step within its bound; what failed, if it did (a stop request ends it too, and is no failure)."""
        log_path = self.run_dir / LOGS_DIR / f"{step.name}.log"
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        started = await self.spawner.start(step.argv, {}, log_path, tail.append)
        stop = self.spawner.tasks.start(self.stop_requested.wait())
        await asyncio.wait({started.exited, stop}, timeout=step.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not started.exited.done():
            self.spawner.groups.signal(signal.SIGKILL, [started.process.pid])
            await asyncio.wait({started.drained}, timeout=PUMP_DRAIN_S)
            if self.stop_requested.is_set():
                return None
            return Failure(step.name, 1, f"did not finish within {step.timeout_s:g} s", log_path, tuple(tail))
        await asyncio.wait({started.drained}, timeout=PUMP_DRAIN_S)
        if code := started.exited.result():
            return Failure(step.name, exit_code_of(code), f"failed with exit code {code}", log_path, tuple(tail))
        return None
