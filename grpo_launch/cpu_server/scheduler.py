"""One generation batch at a time, in a worker thread (so /health answers while the model decodes), paused and
resumed the ways vLLM's dev-mode /pause and /resume do it:

- `abort`: requests already accepted end now, with finish_reason "abort"; new ones get 503 until /resume.
- `wait`: requests already accepted run to the end before /pause returns; new ones get 503 until /resume.
- `keep`: the running request freezes between decode steps and new ones queue; all carry on at /resume.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from http import HTTPStatus

from grpo_launch.cpu_server.api_error import ApiError
from grpo_launch.cpu_server.engine import Engine, GenerationJob
from grpo_launch.cpu_server.generation import SequenceOutput


class PauseMode(StrEnum):
    ABORT = "abort"
    WAIT = "wait"
    KEEP = "keep"


class Scheduler:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-server-generate")
        self._turn = asyncio.Lock()  # FIFO: requests run in arrival order
        self._paused: PauseMode | None = None
        self._unfrozen = threading.Event()  # cleared by keep: the generation thread waits on it between steps
        self._admitting = asyncio.Event()  # cleared by keep: queued requests wait on it before they start
        self._abort_epoch = 0  # bumped by abort: requests accepted before the bump end as aborted
        self._pending = 0
        self._drained = asyncio.Event()  # set when no accepted request is left
        for event in (self._unfrozen, self._admitting, self._drained):
            event.set()

    @property
    def paused(self) -> bool:
        return self._paused is not None

    async def run(self, job: GenerationJob) -> list[list[SequenceOutput]]:
        if self._paused in (PauseMode.ABORT, PauseMode.WAIT):
            raise ApiError(HTTPStatus.SERVICE_UNAVAILABLE,
                           f"The server is paused (mode={self._paused}); retry after /resume.")
        epoch = self._abort_epoch
        self._pending += 1
        self._drained.clear()
        try:
            async with self._turn:
                await self._admitting.wait()
                if self._abort_epoch > epoch:
                    return [[SequenceOutput.aborted() for _ in range(job.n)] for _ in job.prompts]
                checkpoint = functools.partial(self._checkpoint, epoch)
                return await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._engine.generate, job, checkpoint)
        finally:
            self._pending -= 1
            if not self._pending:
                self._drained.set()

    def _checkpoint(self, epoch: int) -> bool:
        """Between decode steps, in the generation thread: wait out a keep-pause; report an abort."""
        self._unfrozen.wait()
        return self._abort_epoch > epoch

    async def pause(self, mode: PauseMode) -> None:
        self._paused = mode
        if mode is PauseMode.KEEP:
            self._unfrozen.clear()
            self._admitting.clear()
            return
        if mode is PauseMode.ABORT:
            self._abort_epoch += 1
        # Frozen or queued work must move on, to its end (wait) or to its next step, where it stops (abort).
        self._unfrozen.set()
        self._admitting.set()
        await self._drained.wait()

    def resume(self) -> None:
        self._paused = None
        self._unfrozen.set()
        self._admitting.set()

    def close(self) -> None:
        """At shutdown: end whatever runs or waits, so the generation thread can be joined."""
        self._abort_epoch += 1
        self._unfrozen.set()
        self._admitting.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
