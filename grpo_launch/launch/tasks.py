"""Every asyncio task of one supervisor, kept until it is done and ended together when the run ends.

asyncio keeps only a weak reference to a running task, so a task nobody holds may vanish mid-way; and a task left
running when the run ends would act on processes that are gone. So no task is started but through `Tasks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine

CANCELLED_WAIT_S = 1.0           # a cancelled task ends at its next await; the bound only keeps a bug from hanging


class Tasks:
    def __init__(self) -> None:
        self.running: set[asyncio.Task] = set()

    def start(self, coroutine: Coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return task

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for them to end."""
        left = list(self.running)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=CANCELLED_WAIT_S)
