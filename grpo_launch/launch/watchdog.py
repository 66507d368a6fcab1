"""Process groups: the supervisor's record of every group it started, and the watchdog that ends them when the
supervisor dies, however it dies.

Every process the supervisor starts leads a process group of its own (its own session), and what it starts stays in
that group: vLLM's EngineCore, the ranks under accelerate and torchrun. Stopping a run signals whole groups. A
supervisor killed by SIGKILL runs no code, and `PR_SET_PDEATHSIG` would reach only its direct children, so a
watchdog does it: a small process started before any child, in a session of its own (a terminal's Ctrl-C or hang-up
does not reach it), that reads the groups from a pipe only the supervisor writes to. When the pipe closes without
the supervisor having said it is done (it died), the watchdog sends SIGTERM to every group it was told of, then
SIGKILL to each one still alive after the grace period, and exits.

A group counts as gone when none of its processes is left but zombies (a container's first process may never reap
the orphans). Run as a script with the standard library only (`python -I watchdog.py GRACE LOG`): it must not
depend on how grpo-launch was installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

DONE = b"done"                 # the supervisor stopped every group itself: nothing to do
POLL_S = 0.1
KILL_WAIT_S = 10.0             # after SIGKILL, how long a group may take to go (one stuck in the kernel may not)
CLOSE_WAIT_S = 5.0             # how long the supervisor waits for its watchdog to exit after `done`


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already, or not ours any more
        os.killpg(pgid, sig)


def live_groups(pgids: Iterable[int]) -> set[int]:
    """The groups among `pgids` that still hold a process that is not a zombie."""
    wanted = set(pgids)
    if not wanted:
        return set()
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: a group with only zombies left counts as alive
        return {g for g in wanted if _signalable(g)}
    alive = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if fields[0] != b"Z" and int(fields[2]) in wanted:
            alive.add(int(fields[2]))
    return alive


def _signalable(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_groups(pgids: Iterable[int], grace_s: float) -> set[int]:
    """SIGTERM to every group, SIGKILL to those still alive after `grace_s`; the groups that outlived even that."""
    groups = live_groups(pgids)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        for pgid in groups:
            signal_group(pgid, sig)
        deadline = time.monotonic() + wait_s
        while groups and time.monotonic() < deadline:
            time.sleep(POLL_S)
            groups = live_groups(groups)
    return groups


class ProcessGroups:
    """Every process group the supervisor started and has not seen end, each one told to the watchdog."""

    def __init__(self, *, grace_s: float, log: Path) -> None:
        self.pgids: set[int] = set()
        self.watchdog = subprocess.Popen(
            [sys.executable, "-I", __file__, str(grace_s), str(log)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def _tell(self, message: bytes) -> None:
        try:
            self.watchdog.stdin.write(message + b"\n")
            self.watchdog.stdin.flush()
        except (OSError, ValueError):  # the watchdog was killed: the run goes on without it
            pass

    def add(self, pgid: int) -> None:
        self.pgids.add(pgid)
        self._tell(b"+%d" % pgid)

    def alive(self) -> set[int]:
        """The groups still alive; those that ended are forgotten (their ids may be reused by others)."""
        alive = live_groups(self.pgids)
        for pgid in self.pgids - alive:
            self._tell(b"-%d" % pgid)
        self.pgids = alive
        return alive

    def signal(self, sig: int, pgids: Iterable[int] | None = None) -> None:
        for pgid in self.pgids if pgids is None else pgids:
            signal_group(pgid, sig)

    def close(self) -> None:
        """Once every group was stopped: the watchdog is told it is done, and exits."""
        self._tell(DONE)
        try:
            self.watchdog.stdin.close()
        except OSError:
            pass
        try:
            self.watchdog.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()


def watch(grace_s: float, log: Path) -> int:
    """Read the supervisor's groups until it says it is done (0) or its end of the pipe closes: then end them."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    supervisor = os.getppid()
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        line = line.strip()
        if line == DONE:
            return 0
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
    _note(log, f"the supervisor (pid {supervisor}) ended without stopping its processes: process groups "
               f"{sorted(groups)} get SIGTERM, then SIGKILL after {grace_s:g} s")
    left = end_groups(groups, grace_s)
    if left:
        _note(log, f"process groups {sorted(left)} are still there {KILL_WAIT_S:g} s after SIGKILL")
    return 0


def _note(log: Path, message: str) -> None:
    try:
        with open(log, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(watch(float(sys.argv[1]), Path(sys.argv[2])))
