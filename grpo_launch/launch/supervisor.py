"""Launch: start the plan's processes in order, watch them all at once, and stop them all together.

The supervisor knows nothing about placements. It reads the processes of the plan (those of its node), runs the
prepare steps, and then reacts to events, whichever comes first: a process's exit (every child has a task waiting
on it), a readiness URL answering or timing out, a ready process no longer answering, a start delay elapsing, a
stop request. A process starts once every process before it has started and the processes it depends on are ready.
The run ends when the trainer ends. A process whose spec allows restarts (a replica behind the routing proxy) and
that dies after it was ready is started again, up to its limit, once what was left of it is gone; any other process
failing, or a service exiting while the trainer runs, stops everything: SIGTERM to every process group, SIGKILL
after a grace period. Ctrl-C, SIGTERM or SIGHUP once stops cleanly (the exit code names the signal: 130, 143, 129),
twice at once; if the supervisor itself is killed, its watchdog ends every group (`watchdog`). Every wait has a
bound the plan states: readiness, liveness (a ready process that stops answering its URL is treated as dead), the
trainer launchers of several nodes exiting together, prepare steps.

The `RunResult` names every failure and passes the first one's exit code on: a launcher's own code, or the failed
worker's that torch.distributed's failure report names (torchrun and accelerate exit 1), with the cause a known line
of its output names (a rendezvous that timed out). Output goes to each process's log and, through the
`ConsoleDisplay` observer, to the console; neither failing stops its draining (`output`). One supervisor runs the
processes of one node, or of several when they are all this machine; torchrun's PET_* variables never reach a
process. No torch here.
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
from collections.abc import Collection, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from grpo_launch.contracts.plan import Plan, PrepareStep, ProcessSpec, Role
from grpo_launch.contracts.rundir import LOGS_DIR, METRICS_FILE, PREPARE_LOCK, TRAINER_FAILURE, WATCHDOG_LOG
from grpo_launch.contracts.secrets import secret_names, secret_values
from grpo_launch.launch import prepared
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.output import LogFile, drain
from grpo_launch.launch.result import (
    FAILURE_REPORT,
    GRACE_S,
    TAIL_LINES,
    Failure,
    RunResult,
    exit_code_of,
    first_rank_error,
    root_cause_code,
)
from grpo_launch.launch.watchdog import KILL_WAIT_S, ProcessGroups

DEFAULT_READY_TIMEOUT_S = 600.0  # for a readiness URL whose process names no timeout
READY_POLL_S = 0.5
READY_PROBE_S = 3.0              # how long one readiness probe may take
PROGRESS_TICK_S = 0.5
PUMP_DRAIN_S = 2.0               # after its group is killed, how long a process's last lines may take to arrive
LOCK_POLL_S = 0.2
STRAY_PREFIX = "PET_"            # torchrun's options from the environment; cleared for every process
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, `kill`, a closed terminal or ssh session
PROBE_AGENT = "grpo-launch"      # the User-Agent of the supervisor's probes


class State(enum.Enum):
    PENDING = "pending"          # not started yet
    STARTING = "starting"        # running, its readiness URL not answering yet
    READY = "ready"              # running and ready (or running with no readiness URL)
    RESTARTING = "restarting"    # died after it was ready; started again after its back-off
    EXITED = "exited"            # ended on its own with code 0 (a trainer that finished)
    FAILED = "failed"            # ended on its own otherwise, never became ready, or stopped answering
    STOPPED = "stopped"          # ended because the supervisor stopped it


@dataclass
class Child:
    spec: ProcessSpec
    log_path: Path
    state: State = State.PENDING
    process: asyncio.subprocess.Process | None = None
    exited: asyncio.Future[int] | None = None  # resolved with the return code when the process exits
    generation: int = 0          # incarnations started; events of an earlier one are stale
    restarts: int = 0            # every restart, for the result
    recent_restarts: int = 0     # those its restart limit counts: since it was last ready long enough
    was_ready: bool = False
    ready_since: float | None = None  # when this incarnation became ready
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    diagnosis: str | None = None  # the cause its output names (the first of its spec's diagnoses to match)
    report: list[str] = field(default_factory=list)  # torch.distributed's failure report, from its first line
    tasks: list[asyncio.Task] = field(default_factory=list)  # its exit watcher, readiness and liveness probes
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
class Unresponsive:              # a ready process failed its liveness probes
    name: str
    generation: int
    url: str
    failures: int
    seconds: float               # since it last answered


@dataclass(frozen=True)
class Due:                       # a start delay has elapsed
    child: Child


@dataclass(frozen=True)
class RestartDue:                # a restart's back-off has elapsed and what was left of the process is gone
    child: Child


@dataclass(frozen=True)
class ExitOverdue:               # a trainer launcher finished this long ago and others still run
    finished: str
    timeout_s: float


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


def _bearer(key_env: str | None) -> dict[str, str]:
    """The Authorization header a spec's probes send: the key its variable holds (a keyed proxy answers nothing
    without it), read from the environment by name."""
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
        self.signal: int | None = None        # the first stop signal received
        self.stop_requested = asyncio.Event()
        self.stopping = False
        self.groups: ProcessGroups | None = None  # every process group started, and the watchdog told of them
        self.due: set[str] = set()            # children whose start delay has elapsed
        self.scheduled: set[str] = set()      # children whose start delay is running
        self.polled_remote: set[str] = set()
        self.secrets = secret_values(secret_names(plan), os.environ)  # kept out of every log and the console
        self.exit_deadline = False            # a trainer launcher finished: the others' exit is timed
        self.background: set[asyncio.Task] = set()  # timers and remote probes, cancelled when the run stops

    def _background(self, coroutine: Coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _warn(self, log: Path, message: str) -> None:
        """Trouble with a process's output, not with the process: said on the console, or in its log when the
        console is what failed. Never raises: the output must keep draining."""
        try:
            self.display.say(message, style="bold yellow")
        except Exception:  # noqa: BLE001
            try:
                with log.open("a") as f:
                    f.write(f"[grpo] {message}\n")
            except OSError:
                pass

    # -- processes ----------------------------------------------------------------------------------------------
    async def run_prepare(self) -> None:
        """Each step once per run directory: nodes sharing it (loopback, shared storage) take turns, and a node
        finding what a step creates skips it. Waiting for the turn is bounded by the steps' own bounds."""
        if not self.plan.prepare:
            return
        bound = sum(step.timeout_s for step in self.plan.prepare)
        deadline = time.monotonic() + bound
        with (self.run_dir / PREPARE_LOCK).open("w") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.presses:
                        return
                    if time.monotonic() > deadline:
                        self.failures.append(Failure("prepare", 1, f"another node held {PREPARE_LOCK} for more than "
                                                                   f"{bound:g} s, the prepare steps' bound",
                                                     self.run_dir / PREPARE_LOCK))
                        return
                    await asyncio.sleep(LOCK_POLL_S)
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
            if not await self._prepare(step) or self.presses:
                return
            if step.cache_key:
                await asyncio.to_thread(prepared.keep, step.cache_key, created)

    async def _prepare(self, step: PrepareStep) -> bool:
        """Run one step within its bound; whether it succeeded (a stop request ends it too)."""
        log_path = self.run_dir / LOGS_DIR / f"{step.name}.log"
        log = LogFile(log_path, lambda message: self._warn(log_path, message))
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        process, exited = await _spawn(step.argv, self.run_dir, child_environment({}))
        self.groups.add(process.pid)
        drained = asyncio.create_task(drain(process.stdout, log, tail.append,
                                            lambda message: self._warn(log_path, message), self.secrets))
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({exited, stop}, timeout=step.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not exited.done():
            self.groups.signal(signal.SIGKILL, [process.pid])
            await asyncio.wait({drained}, timeout=PUMP_DRAIN_S)
            if not self.presses:
                self.failures.append(Failure(step.name, 1, f"did not finish within {step.timeout_s:g} s", log_path,
                                             tuple(tail)))
            return False
        await asyncio.wait({drained}, timeout=PUMP_DRAIN_S)
        if exited.result():
            self.failures.append(Failure(step.name, exit_code_of(exited.result()),
                                         f"failed with exit code {exited.result()}", log_path, tuple(tail)))
            return False
        return True

    async def _start(self, child: Child) -> None:
        spec = child.spec
        child.generation += 1
        for rank in spec.ranks:  # a resumed run's old failure records would be read as this run's
            (self.run_dir / LOGS_DIR / TRAINER_FAILURE.format(rank=rank)).unlink(missing_ok=True)
        child.diagnosis, child.report, child.ready_since = None, [], None  # an earlier incarnation's, not this one's
        warn = lambda message: self._warn(child.log_path, message)  # noqa: E731
        log = LogFile(child.log_path, warn)
        try:
            child.process, exited = await _spawn(spec.argv, self.run_dir, child_environment(spec.env))
        except BaseException:
            log.close()
            raise
        self.groups.add(child.process.pid)
        child.exited = exited
        child.state = State.STARTING if spec.ready_url else State.READY
        pump = asyncio.create_task(drain(child.process.stdout, log, lambda text: self._line(child, text), warn,
                                         self.secrets))
        child.pumps.append(pump)
        child.tasks = [asyncio.create_task(self._watch_exit(child, exited, child.generation))]
        if spec.ready_url:
            child.tasks.append(asyncio.create_task(self._poll_ready(child.name, spec, child.generation)))
            self.display.waiting(child.name, spec.ready_url)
        else:
            child.was_ready = True
        self.display.started(child.name, child.process.pid, spec.gpus)

    def _line(self, child: Child, text: str) -> None:
        child.tail.append(text)
        self._read(child, text)
        self.display.line(child.name, text)

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
        while await probe(spec.ready_url, READY_PROBE_S, spec.probe_key_env) != 200:
            if time.monotonic() - started > timeout:
                await self.events.put(NotReady(name, generation, spec.ready_url, timeout))
                return
            await asyncio.sleep(READY_POLL_S)
        await self.events.put(Ready(name, generation, time.monotonic() - started))

    async def _watch_liveness(self, name: str, spec: ProcessSpec, generation: int) -> None:
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
        await self.events.put(Unresponsive(name, generation, spec.ready_url, failures,
                                           time.monotonic() - answered))

    async def _after(self, seconds: float, event: Any) -> None:
        await asyncio.sleep(seconds)
        await self.events.put(event)

    async def _restart_after(self, child: Child, backoff_s: float) -> None:
        """The dead incarnation's group is killed (vLLM's EngineCore outlives its API server) and gone before the
        next incarnation starts, after the back-off."""
        pgid = child.process.pid
        self.groups.signal(signal.SIGKILL, [pgid])
        await asyncio.sleep(backoff_s)
        deadline = time.monotonic() + KILL_WAIT_S
        while (stuck := pgid in self.groups.alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.events.put(RestartDue(child))
        if stuck:
            self.display.say(f"{child.name}: processes of its previous incarnation (group {pgid}) are still there "
                             f"{KILL_WAIT_S:g} s after SIGKILL; starting it again anyway", style="bold red")

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
                    self._background(self._poll_ready(dep, remote, 0))
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
                    self._background(self._after(child.spec.start_delay_s, Due(child)))
                return
            await self._start(child)

    def _trainers(self) -> list[Child]:
        return [c for c in self.children if c.spec.role == Role.TRAINER]

    def _trainers_done(self) -> bool:
        trainers = self._trainers()
        return bool(trainers) and all(c.state is State.EXITED for c in trainers)

    def _fail(self, child: Child, code: int, reason: str) -> None:
        child.state = State.FAILED
        self.display.not_waiting(child.name)
        self.failures.append(Failure(child.name, code, reason, child.log_path))

    def _restarted(self, child: Child, why: str) -> bool:
        """Start a process again if its spec allows it (it died after it was ready, within its limit)."""
        restart = child.spec.restart
        if restart is None or not child.was_ready:
            return False
        if restart.reset_after_s is not None and child.ready_since is not None and \
                time.monotonic() - child.ready_since >= restart.reset_after_s:
            child.recent_restarts = 0  # healthy long enough: its earlier deaths no longer count
        if child.recent_restarts >= restart.max_restarts:
            return False
        child.restarts += 1
        child.recent_restarts += 1
        child.state = State.RESTARTING
        for task in child.tasks:  # its probes would probe the next incarnation as if it were this one
            task.cancel()
        self.display.restarting(child.name, why, child.recent_restarts, restart.max_restarts)
        self._background(self._restart_after(child, restart.backoff_s))
        return True

    def _on_exit(self, event: Exited) -> None:
        child = event.child
        if event.generation != child.generation or self.stopping or not child.running:
            return
        code = exit_code_of(event.returncode)
        if child.spec.role == Role.TRAINER and code == 0:
            child.state = State.EXITED
            self._time_the_other_exits(child)
            return
        if self._restarted(child, f"exited with code {code}"):
            return
        code = root_cause_code(child.report) or code
        if child.state is State.STARTING:
            reason = f"exited with code {event.returncode} before it was ready"
        elif child.spec.role == Role.TRAINER:
            reason = f"exited with code {code}"
        else:
            reason = f"stopped while the trainer runs with code {code}"
        self._fail(child, code or 1, f"{reason}: {child.diagnosis}" if child.diagnosis else reason)

    def _time_the_other_exits(self, finished: Child) -> None:
        """Trainer launchers of several nodes end together: once one finished, the others get its bound."""
        timeout = finished.spec.exit_timeout_s
        if timeout is not None and not self.exit_deadline and not self._trainers_done():
            self.exit_deadline = True
            self._background(self._after(timeout, ExitOverdue(finished.name, timeout)))

    def _on_exit_overdue(self, event: ExitOverdue) -> None:
        for child in self._trainers():
            if child.running:
                self._fail(child, 1, f"did not exit within {event.timeout_s:g} s after {event.finished} finished")

    def _on_ready(self, event: Ready) -> None:
        self.display.ready(event.name, event.seconds)
        child = self.by_name.get(event.name)
        if child is None:
            self.remote_ready.add(event.name)
            remote = self.remote[event.name]
            if remote.liveness and remote.restart is None:  # one that may restart is its own node's to bring back
                self._background(self._watch_liveness(event.name, remote, 0))
        elif event.generation == child.generation and child.state is State.STARTING:
            child.state = State.READY
            child.was_ready = True
            child.ready_since = time.monotonic()
            if child.spec.liveness:
                child.tasks.append(asyncio.create_task(self._watch_liveness(child.name, child.spec,
                                                                            child.generation)))

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

    def _on_unresponsive(self, event: Unresponsive) -> None:
        reason = (f"stopped answering {event.url}: {event.failures} probes in a row unanswered, {event.seconds:.0f} "
                  f"s without an answer")
        child = self.by_name.get(event.name)
        if child is None:
            self.failures.append(Failure(event.name, 1, f"(node {self.remote[event.name].node}) {reason}",
                                         self.run_dir / LOGS_DIR / f"{event.name}.log"))
            return
        if event.generation != child.generation or child.state is not State.READY:
            return
        self.groups.signal(signal.SIGKILL, [child.process.pid])  # wedged: it cannot shut down in order
        if not self._restarted(child, reason):
            self._fail(child, 1, reason)

    async def _control(self) -> bool:
        """Run until the trainers finish (True), something fails or a stop is requested (False)."""
        if self.presses:  # stopped while preparing
            return False
        if any(c.spec.role == Role.TRAINER for c in self.children):
            self.display.training(self.run_dir / METRICS_FILE, self.plan.trainer_inputs.max_steps,
                                  per=(self.plan.world_size, self.plan.device.slot))
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
            elif isinstance(event, Unresponsive):
                self._on_unresponsive(event)
            elif isinstance(event, ExitOverdue):
                self._on_exit_overdue(event)
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
                request = urllib.request.Request(child.spec.metrics_url, headers=_bearer(child.spec.probe_key_env))
                with urllib.request.urlopen(request, timeout=3) as response:
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
        while time.monotonic() < deadline and self.presses < 2 and self.groups.alive():
            for child in running:
                if child.exited.done() and child.process.pid not in orphaned:
                    orphaned.add(child.process.pid)
                    self.groups.signal(signal.SIGTERM, [child.process.pid])
            await asyncio.sleep(0.1)
        self.groups.signal(signal.SIGKILL)
        exits = [c.exited for c in self.children if c.exited is not None and not c.exited.done()]
        if exits:
            await asyncio.wait(exits, timeout=KILL_WAIT_S)
        for child in self.children:
            if child.exited is not None and not child.exited.done():
                self.display.say(f"{child.name} (pid {child.process.pid}) is still there {KILL_WAIT_S:g} s after "
                                 f"SIGKILL", style="bold red")
            if child.running:
                child.state = State.STOPPED
        pumps = [p for c in self.children for p in c.pumps]
        if pumps:
            await asyncio.wait(pumps, timeout=PUMP_DRAIN_S)
        for task in [t for c in self.children for t in c.tasks] + list(self.background):
            task.cancel()

    def _on_signal(self, signum: int) -> None:
        """A stop request is queued before anything is shown: a console that fails must not swallow it."""
        self.presses += 1
        self.signal = self.signal or signum
        self.stop_requested.set()
        self.events.put_nowait(StopRequested(self.presses))
        if self.presses >= 2:
            self.groups.signal(signal.SIGKILL)
        self.display.stopping(self.presses, signal.Signals(signum).name)

    # -- the whole run ------------------------------------------------------------------------------------------
    async def prepare_only(self) -> None:
        """The prepare steps alone, for a scheduler whose processes start elsewhere from the prepared run
        directory; their processes watched as a run's are, none left behind."""
        self.groups = ProcessGroups(grace_s=self.grace_s, log=self.run_dir / LOGS_DIR / WATCHDOG_LOG)
        try:
            await self.run_prepare()
        finally:
            self.groups.signal(signal.SIGKILL)
            self.groups.close()

    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        self.groups = ProcessGroups(grace_s=self.grace_s, log=self.run_dir / LOGS_DIR / WATCHDOG_LOG)
        try:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
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
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
        finally:
            self.groups.close()
        failures = tuple(self._described(f) for f in self.failures)
        code = exit_code_of(-self.signal) if interrupted else (failures[0].code if failures else 0)
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


def _signal_leader(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(plan: Plan, run_dir: Path, *, nodes: Collection[int] = (0,), grace_s: float = GRACE_S,
              console: Console | None = None, verbose: bool = False) -> RunResult:
    """Run the processes of `nodes` (several only when they are all this machine) until the trainers end."""
    return asyncio.run(Supervisor(plan, run_dir, nodes=nodes, grace_s=grace_s, console=console,
                                  verbose=verbose).run())
