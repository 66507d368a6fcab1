"""Launch: start the plan's processes in order, watch them all at once, and stop them all together.

The supervisor knows nothing about placements. It reads the processes of the plan (those of its node), runs the
prepare steps, and then reacts to events, whichever comes first: a process's exit (every child has a task waiting
on it), a readiness URL answering or timing out, a start delay elapsing, a stop request (Ctrl-C, SIGTERM). A
process starts once every process before it has started and the processes it depends on are ready. The run ends
when the trainer ends. A process whose spec allows restarts (a replica behind the routing proxy) and that dies
after it was ready is started again, up to its limit; any other process failing, or a service exiting while the
trainer runs, stops everything: SIGTERM to every process group, SIGKILL after a grace period. Ctrl-C once stops
cleanly, twice at once. The `RunResult` names every failure and passes the first one's exit code on: a launcher's
own code, or the failed worker's that torch.distributed's failure report names (torchrun and accelerate exit 1),
with the cause a known line of its output names (a rendezvous that timed out). Output goes to each process's log
and, through the `ConsoleDisplay` observer, to the console. One supervisor runs the processes of one node, or of
several when they are all this machine; torchrun's PET_* variables never reach a process. No torch here.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import os
import re
import signal
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from grpo_launch.contracts.plan import Plan, ProcessSpec, Role
from grpo_launch.contracts.rundir import LOGS_DIR, METRICS_FILE, PREPARE_LOCK, TRAINER_FAILURE
from grpo_launch.contracts.secrets import redact, secret_names, secret_values
from grpo_launch.launch import prepared
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.result import (
    EXIT_INTERRUPTED,
    FAILURE_REPORT,
    GRACE_S,
    TAIL_LINES,
    Failure,
    RunResult,
    exit_code_of,
    first_rank_error,
    root_cause_code,
)

DEFAULT_READY_TIMEOUT_S = 600.0  # for a readiness URL whose process names no timeout
READY_POLL_S = 0.5
PROGRESS_TICK_S = 0.5
PUMP_DRAIN_S = 2.0               # after its group is killed, how long a process's last lines may take to arrive
STRAY_PREFIX = "PET_"            # torchrun's options from the environment; cleared for every process


class State(enum.Enum):
    PENDING = "pending"          # not started yet
    STARTING = "starting"        # running, its readiness URL not answering yet
    READY = "ready"              # running and ready (or running with no readiness URL)
    RESTARTING = "restarting"    # died after it was ready; started again after its back-off
    EXITED = "exited"            # ended on its own with code 0 (a trainer that finished)
    FAILED = "failed"            # ended on its own otherwise, or never became ready
    STOPPED = "stopped"          # ended because the supervisor stopped it


@dataclass
class Child:
    spec: ProcessSpec
    log_path: Path
    state: State = State.PENDING
    process: asyncio.subprocess.Process | None = None
    exited: asyncio.Future[int] | None = None  # resolved with the return code when the process exits
    generation: int = 0          # incarnations started; events of an earlier one are stale
    restarts: int = 0
    was_ready: bool = False
    ready_since: float = 0.0
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    diagnosis: str | None = None  # the cause its output names (the first of its spec's diagnoses to match)
    report: list[str] = field(default_factory=list)  # torch.distributed's failure report, from its first line
    tasks: list[asyncio.Task] = field(default_factory=list)  # its pump, exit watcher and readiness poller
    pumps: list[asyncio.Task] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.state in (State.STARTING, State.READY)


# Events, one queue of them: the control loop acts on whichever comes first.
@dataclass(frozen=True)
class Exited:
    child: Child
    generation: int
    returncode: int


@dataclass(frozen=True)
class Ready:
    name: str                    # a local child, or a remote process waited for by URL
    generation: int
    seconds: float


@dataclass(frozen=True)
class NotReady:
    name: str
    generation: int
    url: str
    timeout_s: float


@dataclass(frozen=True)
class Due:                       # a start delay has elapsed
    child: Child


@dataclass(frozen=True)
class RestartDue:                # a restart's back-off has elapsed
    child: Child


@dataclass(frozen=True)
class StopRequested:
    presses: int


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol for a subprocess, plus a future resolved the moment the process exits. `Process.wait()`
    returns only once every pipe is closed, which a grandchild holding stdout can delay forever."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2 ** 16, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.transport = transport

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(self.transport.get_returncode())


async def _spawn(argv: tuple[str, ...], cwd: Path, env: dict[str, str]
                 ) -> tuple[asyncio.subprocess.Process, asyncio.Future[int]]:
    """Start a process in its own session (so its whole group can be signalled), output piped, stdin closed."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitProtocol(loop), *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


def stray_launcher_variables(environ: Mapping[str, str]) -> list[str]:
    """torchrun reads every option it is not given from PET_<OPTION> (Kubeflow's trainer sets them): PET_NNODES=2
    silently makes a lone torchrun wait for a second node. The plan gives every option on the command line."""
    return sorted(k for k in environ if k.startswith(STRAY_PREFIX))


def child_environment(env: dict[str, str]) -> dict[str, str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith(STRAY_PREFIX)}
    # Commands like `accelerate`, `torchrun`, `python` and `vllm` resolve in grpo-launch's own environment.
    merged["PATH"] = os.path.dirname(sys.executable) + os.pathsep + merged.get("PATH", "")
    merged["PYTHONUNBUFFERED"] = "1"
    merged.update(env)
    return merged


def _probe(url: str, key_env: str | None) -> urllib.request.Request:
    """A GET of a process's URL, with the Bearer key its spec names (a keyed proxy answers nothing without)."""
    key = os.environ.get(key_env, "") if key_env else ""
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})


def _url_ok(url: str, key_env: str | None) -> bool:
    try:
        with urllib.request.urlopen(_probe(url, key_env), timeout=3) as response:
            return response.status == 200
    except Exception:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_leader(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Supervisor:
    def __init__(self, plan: Plan, run_dir: Path, *, nodes: Collection[int] = (0,), grace_s: float = GRACE_S,
                 console: Console | None = None, verbose: bool = False) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.nodes = set(nodes)
        self.grace_s = grace_s
        local = [p for p in plan.processes if p.node in self.nodes]
        self.children = [Child(spec, run_dir / LOGS_DIR / f"{spec.name}.log") for spec in local]
        self.by_name = {c.name: c for c in self.children}
        self.remote = {p.name: p for p in plan.processes if p.node not in self.nodes}  # waited for by URL only
        self.remote_ready: set[str] = set()
        self.display = ConsoleDisplay(console or Console(highlight=False), [p.name for p in local], verbose=verbose)
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.failures: list[Failure] = []
        self.presses = 0
        self.stopping = False
        self.groups: list[int] = []           # every process group started, for the final sweep
        self.due: set[str] = set()            # children whose start delay has elapsed
        self.scheduled: set[str] = set()      # children whose start delay is running
        self.polled_remote: set[str] = set()
        self.secrets = secret_values(secret_names(plan), os.environ)  # kept out of every log and the console

    # -- processes ----------------------------------------------------------------------------------------------
    async def run_prepare(self) -> None:
        """Each step once per run directory: nodes sharing it (loopback, shared storage) take turns, and a node
        finding what a step creates skips it."""
        with (self.run_dir / PREPARE_LOCK).open("w") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            await self._prepare_steps()

    async def _prepare_steps(self) -> None:
        for step in self.plan.prepare:
            created = self.run_dir / step.creates
            if created.exists():
                continue
            if step.cache_key and (entry := await asyncio.to_thread(prepared.restore, step.cache_key, created)):
                self.display.say(f"prepared {step.name}: kept from an earlier run ({entry})")
                continue
            self.display.preparing(step.name, list(step.argv))
            proc = await asyncio.create_subprocess_exec(
                *step.argv, cwd=self.run_dir, env=child_environment({}), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
            self.groups.append(proc.pid)
            output, _ = await proc.communicate()
            log = self.run_dir / LOGS_DIR / f"{step.name}.log"
            log.write_bytes(output)
            if proc.returncode:
                tail = tuple(output.decode(errors="replace").splitlines()[-TAIL_LINES:])
                self.failures.append(Failure(step.name, exit_code_of(proc.returncode),
                                             f"failed with exit code {proc.returncode}", log, tail))
                return
            if step.cache_key:
                await asyncio.to_thread(prepared.keep, step.cache_key, created)

    async def _start(self, child: Child) -> None:
        spec = child.spec
        child.generation += 1
        for rank in spec.ranks:  # a resumed run's old failure records would be read as this run's
            (self.run_dir / LOGS_DIR / TRAINER_FAILURE.format(rank=rank)).unlink(missing_ok=True)
        child.diagnosis, child.report = None, []  # what an earlier incarnation said does not explain this one
        log = child.log_path.open("a")
        child.process, exited = await _spawn(spec.argv, self.run_dir, child_environment(spec.env))
        child.exited = exited
        self.groups.append(child.process.pid)
        child.state = State.STARTING if spec.ready_url else State.READY
        pump = asyncio.create_task(self._pump(child, child.process, log))
        child.pumps.append(pump)
        child.tasks = [pump, asyncio.create_task(self._watch_exit(child, exited, child.generation))]
        if spec.ready_url:
            child.tasks.append(asyncio.create_task(self._poll_ready(child.name, spec, child.generation)))
            self.display.waiting(child.name, spec.ready_url)
        else:
            child.was_ready = True
        self.display.started(child.name, child.process.pid, spec.gpus)

    async def _pump(self, child: Child, process: asyncio.subprocess.Process, log) -> None:
        assert process.stdout is not None
        try:
            while line := await process.stdout.readline():
                text = redact(line.decode(errors="replace").rstrip("\n"), self.secrets)
                log.write(text + "\n")
                log.flush()
                child.tail.append(text)
                self._read(child, text)
                self.display.line(child.name, text)
        finally:
            log.close()

    def _read(self, child: Child, text: str) -> None:
        """Remember what a line says about a failure: a known cause, or torch.distributed's failure report."""
        if child.diagnosis is None:
            for d in child.spec.diagnoses:
                if re.search(d.pattern, text):
                    child.diagnosis = f"{d.reason} (it said: {text.strip()})"
                    break
        if child.report or FAILURE_REPORT in text:
            child.report.append(text)

    async def _watch_exit(self, child: Child, exited: asyncio.Future[int], generation: int) -> None:
        await self.events.put(Exited(child, generation, await exited))

    async def _poll_ready(self, name: str, spec: ProcessSpec, generation: int) -> None:
        timeout = spec.ready_timeout_s or DEFAULT_READY_TIMEOUT_S
        started = time.monotonic()
        while not await asyncio.to_thread(_url_ok, spec.ready_url, spec.probe_key_env):
            if time.monotonic() - started > timeout:
                await self.events.put(NotReady(name, generation, spec.ready_url, timeout))
                return
            await asyncio.sleep(READY_POLL_S)
        await self.events.put(Ready(name, generation, time.monotonic() - started))

    async def _after(self, seconds: float, event: Any) -> None:
        await asyncio.sleep(seconds)
        await self.events.put(event)

    # -- the control loop ---------------------------------------------------------------------------------------
    def _dependencies_ready(self, spec: ProcessSpec) -> bool:
        ready = True
        for dep in spec.depends_on:
            if dep in self.by_name:
                ready &= self.by_name[dep].state is State.READY
            elif dep not in self.remote_ready:
                ready = False
                remote = self.remote[dep]
                if not remote.ready_url:
                    self.remote_ready.add(dep)
                    ready = True
                elif dep not in self.polled_remote:
                    self.polled_remote.add(dep)
                    self.display.waiting(dep, remote.ready_url)
                    asyncio.create_task(self._poll_ready(dep, remote, 0))
        return ready

    async def _advance(self) -> None:
        """Start every process whose turn has come: all before it started, its dependencies ready."""
        for child in self.children:
            if child.state is not State.PENDING:
                continue
            if not self._dependencies_ready(child.spec):
                return
            if child.spec.start_delay_s and child.name not in self.due:
                if child.name not in self.scheduled:
                    self.scheduled.add(child.name)
                    asyncio.create_task(self._after(child.spec.start_delay_s, Due(child)))
                return
            await self._start(child)

    def _trainers_done(self) -> bool:
        trainers = [c for c in self.children if c.spec.role == Role.TRAINER]
        return bool(trainers) and all(c.state is State.EXITED for c in trainers)

    def _fail(self, child: Child, code: int, reason: str) -> None:
        child.state = State.FAILED
        self.display.not_waiting(child.name)
        self.failures.append(Failure(child.name, code, reason, child.log_path))

    def _on_exit(self, event: Exited) -> None:
        child = event.child
        if event.generation != child.generation or self.stopping:
            return
        code = exit_code_of(event.returncode)
        if child.spec.role == Role.TRAINER and code == 0:
            child.state = State.EXITED
            return
        restart = child.spec.restart
        if restart and child.was_ready and child.restarts < restart.max_restarts:
            child.restarts += 1
            child.state = State.RESTARTING
            self.display.restarting(child.name, code, child.restarts, restart.max_restarts)
            asyncio.create_task(self._after(restart.backoff_s, RestartDue(child)))
            return
        code = root_cause_code(child.report) or code
        if child.state is State.STARTING:
            reason = f"exited with code {event.returncode} before it was ready"
        elif child.spec.role == Role.TRAINER:
            reason = f"exited with code {code}"
        else:
            reason = f"stopped while the trainer runs with code {code}"
        self._fail(child, code or 1, f"{reason}: {child.diagnosis}" if child.diagnosis else reason)

    def _on_ready(self, event: Ready) -> None:
        self.display.ready(event.name, event.seconds)
        child = self.by_name.get(event.name)
        if child is None:
            self.remote_ready.add(event.name)
        elif event.generation == child.generation and child.state is State.STARTING:
            child.state = State.READY
            child.was_ready = True

    def _on_not_ready(self, event: NotReady) -> None:
        child = self.by_name.get(event.name)
        if child is not None and (event.generation != child.generation or child.state is not State.STARTING):
            return
        reason = f"did not answer {event.url} within {event.timeout_s:g} s"
        if child is None:
            self.display.not_waiting(event.name)
            self.failures.append(Failure(event.name, 1, reason, self.run_dir / LOGS_DIR / f"{event.name}.log"))
        else:
            self._fail(child, 1, reason)

    async def _control(self) -> bool:
        """Run until the trainers finish (True), something fails or a stop is requested (False)."""
        if self.presses:  # stopped while preparing
            return False
        if any(c.spec.role == Role.TRAINER for c in self.children):
            self.display.training(self.run_dir / METRICS_FILE, self.plan.trainer_inputs.max_steps)
        await self._advance()
        while not (self.failures or self._trainers_done()):
            event = await self.events.get()
            if isinstance(event, StopRequested):
                return False
            if isinstance(event, Exited):
                self._on_exit(event)
            elif isinstance(event, RestartDue) and event.child.state is State.RESTARTING:
                await self._start(event.child)
            elif isinstance(event, Ready):
                self._on_ready(event)
            elif isinstance(event, NotReady):
                self._on_not_ready(event)
            elif isinstance(event, Due):
                self.due.add(event.child.name)
            await self._advance()
        return not self.failures

    async def _ticker(self) -> None:
        while True:
            self.display.tick()
            await asyncio.sleep(PROGRESS_TICK_S)

    # -- stopping -----------------------------------------------------------------------------------------------
    async def keep_metrics(self) -> None:
        """Each running process's final counters (its metrics URL, Prometheus text) into logs/<name>.metrics:
        the engines' own numbers (requests, prefix-cache hits, LoRA adapters) outlive the run."""
        def fetch(child: Child) -> None:
            try:
                with urllib.request.urlopen(_probe(child.spec.metrics_url, child.spec.probe_key_env),
                                            timeout=3) as response:
                    (self.run_dir / LOGS_DIR / f"{child.name}.metrics").write_bytes(response.read())
            except OSError:
                pass  # a process that cannot answer any more leaves no counters

        await asyncio.gather(*(asyncio.to_thread(fetch, c) for c in self.children
                               if c.state is State.READY and c.spec.metrics_url))

    async def stop_all(self, *, grace_s: float) -> None:
        """SIGTERM each process (its leader first, so a server shuts its engine down in order; the rest of its group
        once the leader has gone), then SIGKILL every group left after the grace period."""
        self.stopping = True
        running = [c for c in self.children if c.running]
        for child in reversed(running):
            _signal_leader(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        orphaned: set[int] = set()
        while time.monotonic() < deadline and self.presses < 2 and any(_group_alive(g) for g in self.groups):
            for child in running:
                if child.exited.done() and child.process.pid not in orphaned:
                    orphaned.add(child.process.pid)
                    _signal_group(child.process.pid, signal.SIGTERM)
            await asyncio.sleep(0.1)
        for pgid in self.groups:
            _signal_group(pgid, signal.SIGKILL)
        for child in self.children:
            if child.exited is not None:
                await child.exited
            if child.running:
                child.state = State.STOPPED
        pumps = [p for c in self.children for p in c.pumps]
        if pumps:
            await asyncio.wait(pumps, timeout=PUMP_DRAIN_S)
        for child in self.children:
            for task in child.tasks:
                task.cancel()

    def _on_signal(self) -> None:
        self.presses += 1
        self.display.stopping(self.presses)
        if self.presses >= 2:
            for pgid in self.groups:
                _signal_group(pgid, signal.SIGKILL)
        self.events.put_nowait(StopRequested(self.presses))

    # -- the whole run ------------------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        ticker = asyncio.create_task(self._ticker())
        interrupted = False
        try:
            with self.display:
                await self.run_prepare()
                if not self.failures:
                    interrupted = not await self._control() and not self.failures
                await self.keep_metrics()
                await self.stop_all(grace_s=0 if self.presses >= 2 else self.grace_s)
        finally:
            if not self.stopping:  # a bug of ours raised: no process outlives the supervisor
                await self.stop_all(grace_s=self.grace_s)
            ticker.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        failures = tuple(self._described(f) for f in self.failures)
        code = EXIT_INTERRUPTED if interrupted else (failures[0].code if failures else 0)
        result = RunResult(code=code, failures=failures, interrupted=interrupted,
                           restarts={c.name: c.restarts for c in self.children if c.restarts})
        self.display.finished(result)
        return result

    def _described(self, failure: Failure) -> Failure:
        """The failure with its process's last lines, and for a trainer what its first failing rank recorded."""
        child = self.by_name.get(failure.process)
        ranks = child.spec.ranks if child is not None and child.spec.role == Role.TRAINER else ()
        return replace(failure, tail=failure.tail or self._tail(failure.process),
                                   rank_error=first_rank_error(self.run_dir, ranks) if ranks else None)

    def _tail(self, name: str) -> tuple[str, ...]:
        child = self.by_name.get(name)
        return tuple(child.tail) if child is not None else ()


def supervise(plan: Plan, run_dir: Path, *, nodes: Collection[int] = (0,), grace_s: float = GRACE_S,
              console: Console | None = None, verbose: bool = False) -> RunResult:
    """Run the processes of `nodes` (several only when they are all this machine) until the trainers end."""
    return asyncio.run(Supervisor(plan, run_dir, nodes=nodes, grace_s=grace_s, console=console,
                                  verbose=verbose).run())

