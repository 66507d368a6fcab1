"""Asking a scheduler's control plane (Slurm's controller, the Hub's Jobs API) through its transient errors.

A run lasts hours; over hours a control plane times out, answers 5xx or 429, or drops a connection. Such an answer
(`Transient`) is asked again, with backoff (or after the wait a 429 names); the run's job is taken for ended only
when the control plane says so. One that answers nothing for `scheduler.control_plane_timeout_s` is `Unreachable`:
the run is then left as it is (its job may still run), said so, and never cancelled for it. What is retried is said
when it starts, every SAY_EVERY_S while it lasts, and when the control plane answers again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
SAY_EVERY_S = 60.0
STOP_CHECK_S = 0.2

T = TypeVar("T")


class Transient(Exception):
    """An answer of a control plane that may pass: ask again (`retry_after_s`: how long it asked to wait)."""

    def __init__(self, what: str, retry_after_s: float | None = None) -> None:
        super().__init__(what)
        self.retry_after_s = retry_after_s


class Unreachable(Exception):
    """The control plane answered nothing (but transient errors) for the whole bound."""


class Patience:
    """One control plane's silence: since when it has lasted, against the bound."""

    def __init__(self, what: str, bound_s: float, say: Callable[[str], None]) -> None:
        self.what = what                  # "Slurm's controller", "the Hub"
        self.bound_s = bound_s
        self.say = say
        self.since: float | None = None   # the first unanswered call of this silence
        self.tries = 0
        self.said = 0.0

    def failed(self, error: Transient) -> float:
        """How long to wait before asking again; `Unreachable` once the silence has outlasted the bound."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.tries = now, 0
        self.tries += 1
        silent = now - self.since
        if silent >= self.bound_s:
            raise Unreachable(f"{self.what} has answered nothing for {silent:.0f} s (the last: {error})")
        wait = error.retry_after_s if error.retry_after_s is not None else \
            min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (self.tries - 1))
        wait = max(0.0, min(wait, self.bound_s - silent))
        if self.tries == 1 or now - self.said >= SAY_EVERY_S:
            self.said = now
            self.say(f"{self.what}: {error}; asking again in {wait:.0f} s ({silent:.0f} of "
                     f"{self.bound_s:.0f} s without an answer)")
        return wait

    def answered(self) -> None:
        if self.since is not None:
            self.say(f"{self.what} answers again, after {time.monotonic() - self.since:.0f} s")
            self.since = None

    def call(self, ask: Callable[[], T], *, stop: Callable[[], str | None] | None = None) -> T:
        """`ask()` until it answers (or raises anything but `Transient`): for calls that must get through (a
        cancel, a stop). `stop()`, asked every STOP_CHECK_S while waiting, may end the waiting with why
        (`Unreachable`): a user who pressed Ctrl-C again."""
        while True:
            try:
                answer = ask()
            except Transient as e:
                deadline = time.monotonic() + self.failed(e)
                while (left := deadline - time.monotonic()) > 0:
                    if stop is not None and (why := stop()):
                        raise Unreachable(f"{self.what} was still being asked ({e}) {why}") from None
                    time.sleep(min(STOP_CHECK_S, left) if stop is not None else left)
                continue
            self.answered()
            return answer
