"""Launch: start the plan's processes in order, watch them, and stop them all together.

The supervisor knows nothing about placements. It reads the processes of plan.json (those of its node), runs the
prepare steps, starts each process in its own process group once the processes it depends on answer their
readiness URL, streams every line to the process's log and to the console with a coloured prefix, and shows a
live status while servers load. The run ends when the trainer ends; any process failing (or a service exiting
while the trainer runs) stops everything: SIGTERM to every process group, SIGKILL after a grace period. Ctrl-C
once stops cleanly, twice at once. Exit codes are passed on. No torch here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from grpo_launch.errors import UserError
from grpo_launch.rundir import LOGS_DIR, METRICS_FILE

COLORS = ("green", "magenta", "cyan", "yellow", "blue", "bright_red", "bright_green", "bright_magenta")
TAIL_LINES = 25
DEFAULT_READY_TIMEOUT_S = 600.0  # for a readiness URL whose process names no timeout
EXIT_INTERRUPTED = 130


@dataclass
class Child:
    spec: dict[str, Any]
    color: str
    log: Any = None
    process: asyncio.subprocess.Process | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class RunFailed(Exception):
    def __init__(self, message: str, code: int, child: Child | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.child = child


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: a process killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def check_ports_free(plan: dict[str, Any], node: int) -> None:
    """Every port this node's processes open must be free before anything starts."""
    for claim in plan["ports"]:
        if claim["node"] != node:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As servers do: connections of an earlier run lingering in TIME_WAIT do not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", claim["port"]))
            except OSError:
                raise UserError(f"port {claim['port']} ({claim['owner']}) is already in use on this machine",
                                key=claim["key"], hint=f"stop what holds it, or set {claim['key']} to another "
                                                       f"port") from None


def child_environment(spec: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    # Commands like `accelerate`, `torchrun`, `python` and `vllm` resolve in grpo-launch's own environment.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(spec["env"])
    return env


def _url_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except Exception:
        return False


class Supervisor:
    def __init__(self, plan: dict[str, Any], run_dir: Path, *, node: int = 0, grace_s: float = 15.0,
                 console: Console | None = None) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.node = node
        self.grace_s = grace_s
        self.console = console or Console(highlight=False)
        self.children = [Child(spec, COLORS[i % len(COLORS)]) for i, spec in
                         enumerate(p for p in plan["processes"] if p["node"] == node)]
        self.remote = {p["name"]: p for p in plan["processes"] if p["node"] != node}  # waited for by URL only
        self.interrupts = 0
        self.stop_requested = asyncio.Event()

    # -- output -------------------------------------------------------------------------------------------------
    def say(self, message: str, style: str = "bold") -> None:
        self.console.print(Text(f"[grpo] {message}", style=style))

    async def _pump(self, child: Child) -> None:
        assert child.process is not None and child.process.stdout is not None
        width = max(len(c.name) for c in self.children)
        while True:
            line = await child.process.stdout.readline()
            if not line:
                break
            text = line.decode(errors="replace").rstrip("\n")
            child.log.write(text + "\n")
            child.log.flush()
            child.tail.append(text)
            prefix = Text(f"{child.name:>{width}} │ ", style=child.color)
            self.console.print(prefix + Text(text.split("\r")[-1]), soft_wrap=True)

    # -- processes ----------------------------------------------------------------------------------------------
    async def run_prepare(self) -> None:
        for step in self.plan["prepare"]:
            if (self.run_dir / step["creates"]).exists():
                continue
            self.say(f"preparing {step['name']}: {' '.join(step['argv'])}")
            with self.console.status(f"{step['name']} ..."):
                proc = await asyncio.create_subprocess_exec(
                    *step["argv"], cwd=self.run_dir, env=child_environment({"env": {}}),
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
                output, _ = await proc.communicate()
            log = self.run_dir / LOGS_DIR / f"{step['name']}.log"
            log.write_bytes(output)
            if proc.returncode:
                tail = "\n".join(output.decode(errors="replace").splitlines()[-TAIL_LINES:])
                raise RunFailed(f"{step['name']} failed with exit code {proc.returncode} (log: {log})\n{tail}",
                                exit_code_of(proc.returncode))

    async def _start(self, child: Child) -> None:
        spec = child.spec
        child.log = (self.run_dir / LOGS_DIR / f"{child.name}.log").open("a")
        child.process = await asyncio.create_subprocess_exec(
            *spec["argv"], cwd=self.run_dir, env=child_environment(spec), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        child.pump = asyncio.create_task(self._pump(child))
        gpus = ",".join(map(str, spec["gpus"])) or "-"
        self.say(f"started {child.name} (pid {child.process.pid}, GPUs {gpus})", style=child.color)

    async def _wait_ready(self, spec: dict[str, Any], child: Child | None) -> None:
        """Poll `spec`'s readiness URL until it answers 200; fail if `child` (when it runs here) exits first."""
        name, url = spec["name"], spec["ready_url"]
        timeout = spec["ready_timeout_s"] or DEFAULT_READY_TIMEOUT_S
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        with self.console.status(f"waiting for {name} at {url}") as status:
            while not await asyncio.to_thread(_url_ok, url):
                if child is not None and not child.running:
                    await self._drain(child)
                    raise RunFailed(f"{name} exited with code {child.process.returncode} before it was ready",
                                    exit_code_of(child.process.returncode) or 1, child)
                if time.monotonic() > deadline:
                    raise RunFailed(f"{name} did not answer {url} within {timeout:g} s", 1, child)
                if self.stop_requested.is_set():
                    raise RunFailed("interrupted", EXIT_INTERRUPTED)
                status.update(f"waiting for {name} at {url} ({time.monotonic() - started:.0f} s)")
                await asyncio.sleep(1.0)
        self.say(f"{name} is ready ({time.monotonic() - started:.1f} s)")

    async def _drain(self, child: Child) -> None:
        """Let the last lines of an exited process reach its log (a leftover grandchild may hold the pipe)."""
        if child.pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(child.pump), timeout=5)
            except TimeoutError:
                pass

    async def _sleep_or_stop(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop_requested.wait(), timeout=seconds)
        except TimeoutError:
            return
        raise RunFailed("interrupted", EXIT_INTERRUPTED)

    async def start_all(self) -> None:
        by_name = {c.name: c for c in self.children}
        for child in self.children:
            for dep in child.spec["depends_on"]:
                if dep in by_name:
                    await self._ensure_ready(by_name[dep])
                elif self.remote[dep].get("ready_url"):
                    await self._wait_ready(self.remote[dep], None)
            if child.spec["start_delay_s"]:
                await self._sleep_or_stop(child.spec["start_delay_s"])
            if self.stop_requested.is_set():
                raise RunFailed("interrupted", EXIT_INTERRUPTED)
            await self._start(child)

    async def _ensure_ready(self, child: Child) -> None:
        if child.ready.is_set() or not child.spec.get("ready_url"):
            return
        await self._wait_ready(child.spec, child)
        child.ready.set()

    async def watch(self) -> int:
        """Wait until the trainers end (success) or anything fails, showing training progress meanwhile."""
        trainers = [c for c in self.children if c.spec["role"] == "trainer"]
        finished: set[str] = set()
        progress = TrainingProgress(self.run_dir / METRICS_FILE, self.plan["trainer_args"].get("max_steps", -1))
        with progress.display(self.console) if trainers else contextlib.nullcontext():
            while True:
                for child in self.children:
                    if child.running or child.name in finished:
                        continue
                    await self._drain(child)
                    code = child.process.returncode
                    if child in trainers and code == 0:
                        finished.add(child.name)
                        continue
                    what = "exited" if child in trainers else "stopped while the trainer runs"
                    raise RunFailed(f"{child.name} {what} with code {code}", exit_code_of(code) or 1, child)
                if trainers and all(c.name in finished for c in trainers):
                    return 0
                if self.stop_requested.is_set():
                    raise RunFailed("interrupted", EXIT_INTERRUPTED)
                progress.update()
                await asyncio.sleep(0.05)  # react to an exit within 50 ms

    async def stop_all(self, *, grace_s: float) -> None:
        """SIGTERM every process group, then SIGKILL what is left after the grace period."""
        groups = [c.process.pid for c in self.children if c.process is not None]
        for pid in reversed(groups):
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_group_alive(pid) for pid in groups):
            if self.interrupts >= 2:
                break
            await asyncio.sleep(0.1)
        for pid in groups:
            _signal_group(pid, signal.SIGKILL)
        for child in self.children:
            if child.process is not None:
                await child.process.wait()
                await self._drain(child)
            if child.log is not None:
                child.log.close()

    # -- the whole run ------------------------------------------------------------------------------------------
    def _on_signal(self) -> None:
        self.interrupts += 1
        self.stop_requested.set()
        if self.interrupts == 1:
            self.say("stopping (Ctrl-C again to kill at once)", style="bold yellow")
        else:
            self.say("killing every process now", style="bold red")
            for child in self.children:
                if child.process is not None:
                    _signal_group(child.process.pid, signal.SIGKILL)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            await self.run_prepare()
            await self.start_all()
            return await self.watch()
        except RunFailed as failure:
            self._report(failure)
            return failure.code
        finally:
            await self.stop_all(grace_s=0 if self.interrupts >= 2 else self.grace_s)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _report(self, failure: RunFailed) -> None:
        if failure.code == EXIT_INTERRUPTED:
            self.say("interrupted: stopping every process", style="bold yellow")
            return
        self.say(f"failed: {failure}", style="bold red")
        child = failure.child
        if child is not None:
            log = self.run_dir / LOGS_DIR / f"{child.name}.log"
            self.say(f"last lines of {log}:", style="red")
            for line in child.tail:
                self.console.print(Text(f"    {line}"), soft_wrap=True)


class TrainingProgress:
    """A progress bar fed by the trainer's metrics.jsonl: steps done of max_steps, and the latest reward."""

    def __init__(self, metrics: Path, total_steps: int) -> None:
        self.metrics = metrics
        self.total = total_steps if total_steps and total_steps > 0 else None
        self.offset = 0
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    @contextlib.contextmanager
    def display(self, console: Console):
        self.bar = Progress(SpinnerColumn(), TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("steps"), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                            console=console, transient=True)
        self.task = self.bar.add_task("training", total=self.total, info="")
        with self.bar:
            yield self

    def update(self) -> None:
        if self.bar is None or not self.metrics.exists():
            return
        with self.metrics.open("rb") as f:
            f.seek(self.offset)
            complete = f.read().rpartition(b"\n")[0]  # a line still being written waits for the next update
        if not complete:
            return
        self.offset += len(complete) + 1
        for line in complete.decode().splitlines():
            record = json.loads(line)
            info = f"reward {record['reward']:.3f}" if "reward" in record else ""
            self.bar.update(self.task, completed=record["step"], **({"info": info} if info else {}))


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def supervise(plan: dict[str, Any], run_dir: Path, *, node: int = 0, grace_s: float = 15.0,
              console: Console | None = None) -> int:
    return asyncio.run(Supervisor(plan, run_dir, node=node, grace_s=grace_s, console=console).run())
