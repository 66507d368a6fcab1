"""Launch: start the plan's processes in order, watch them all at once, and stop them all together.

The supervisor knows nothing about placements. It reads the processes of the plan (those of its node), runs the
prepare steps (`prepare_steps`), and then reacts to events (`children`), whichever comes first: a process's exit
(every child has a task waiting on it), a readiness URL answering or timing out, a ready process no longer answering
(`probes`), a start delay elapsing, a stop request. A process starts once every process before it has started and
the processes it depends on are ready. The run ends when the trainer ends. A process whose spec allows restarts (a
replica behind the routing proxy) and that dies after it was ready is started again, up to its limit, once what was
left of it is gone; any other process failing, or a service exiting while the trainer runs, stops everything:
SIGTERM to every process group, SIGKILL after a grace period. Ctrl-C, SIGTERM or SIGHUP once stops cleanly (the exit
code names the signal: 130, 143, 129), twice at once; if the supervisor itself is killed, its watchdog ends every
group (`watchdog`). Every wait has a bound the plan states: readiness, liveness (a ready process that stops
answering its URL is treated as dead), the trainer launchers of several nodes exiting together, prepare steps. Every
task it starts is kept (`tasks`) and ended with the run.

The `RunResult` names every failure and passes the first one's exit code on: a launcher's own code, or the failed
worker's that torch.distributed's failure report names (torchrun and accelerate exit 1), with the cause a known line
of its output names (a rendezvous that timed out). Output goes to each process's log and, through the
`ConsoleDisplay` observer, to the console; neither failing stops its draining (`spawn`, `output`). One supervisor
runs the processes of one node, or of several when they are all this machine; torchrun's PET_* variables never
reach a process. No torch here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from grpo_launch.contracts.plan import Plan, ProcessSpec, Role
from grpo_launch.contracts.rundir import LOGS_DIR, WATCHDOG_LOG, clear_trainer_failure
from grpo_launch.contracts.secrets import secret_names, secret_values
from grpo_launch.launch.children import (
    Child,
    Due,
    Exited,
    ExitOverdue,
    NotReady,
    Ready,
    RestartDue,
    State,
    StopRequested,
    Unresponsive,
)
from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.prepare_steps import PrepareSteps
from grpo_launch.launch.probes import fetch_metrics, poll_ready, watch_liveness
from grpo_launch.launch.result import GRACE_S, Failure, RunResult, exit_code_of, first_rank_error, root_cause_code
from grpo_launch.launch.spawn import PUMP_DRAIN_S, Spawner, signal_leader
from grpo_launch.launch.tasks import Tasks
from grpo_launch.launch.watchdog import KILL_WAIT_S, ProcessGroups

PROGRESS_TICK_S = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, `kill`, a closed terminal or ssh session


class Supervisor:
    def __init__(self, plan: Plan, run_dir: Path, *, nodes: Collection[int] = (0,), grace_s: float = GRACE_S,
                 console: Console | None = None, verbose: bool = False,
                 on_first_failure: Callable[[Failure], None] | None = None) -> None:
        self.plan = plan
        self.on_first_failure = on_first_failure
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
        self.spawner: Spawner | None = None   # starts processes into those groups
        self.due: set[str] = set()            # children whose start delay has elapsed
        self.scheduled: set[str] = set()      # children whose start delay is running
        self.polled_remote: set[str] = set()
        self.secrets = secret_values(secret_names(plan), os.environ)  # kept out of every log and the console
        self.exit_deadline = False            # a trainer launcher finished: the others' exit is timed
        self.tasks = Tasks()                  # every task started, ended with the run

    def _watch_groups(self) -> None:
        """The watchdog started, before any process is."""
        self.groups = ProcessGroups(grace_s=self.grace_s, log=self.run_dir / LOGS_DIR / WATCHDOG_LOG)
        self.spawner = Spawner(self.run_dir, self.groups, self.tasks, self.display, self.secrets)

    # -- processes ----------------------------------------------------------------------------------------------
    async def run_prepare(self) -> None:
        failure = await PrepareSteps(self.plan.prepare, self.run_dir, self.spawner, self.display,
                                     self.stop_requested).run()
        if failure:
            self._failed(failure)

    async def _start(self, child: Child) -> None:
        spec = child.spec
        child.generation += 1
        for rank in spec.ranks:  # a resumed run's old failure records would be read as this run's
            clear_trainer_failure(self.run_dir, rank)
        child.diagnosis, child.report, child.ready_since = None, [], None  # an earlier incarnation's, not this one's
        started = await self.spawner.start(spec.argv, spec.env, child.log_path, lambda text: self._line(child, text))
        child.process, child.exited = started.process, started.exited
        child.state = State.STARTING if spec.ready_url else State.READY
        child.pumps.append(started.drained)
        child.tasks = [self.tasks.start(self._watch_exit(child, child.exited, child.generation))]
        if spec.ready_url:
            child.tasks.append(self.tasks.start(poll_ready(self.events, child.name, spec, child.generation)))
            self.display.waiting(child.name, spec.ready_url)
        else:
            child.was_ready = True
        self.display.started(child.name, child.process.pid, spec.gpus)

    def _line(self, child: Child, text: str) -> None:
        child.remember(text)
        self.display.line(child.name, text)

    async def _watch_exit(self, child: Child, exited: asyncio.Future[int], generation: int) -> None:
        await self.events.put(Exited(child, generation, await exited))

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
                    self.tasks.start(poll_ready(self.events, dep, remote, 0))
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
                    self.tasks.start(self._after(child.spec.start_delay_s, Due(child)))
                return
            await self._start(child)

    def _trainers(self) -> list[Child]:
        return [c for c in self.children if c.spec.role == Role.TRAINER]

    def _trainers_done(self) -> bool:
        trainers = self._trainers()
        return bool(trainers) and all(c.state is State.EXITED for c in trainers)

    def _failed(self, failure: Failure) -> None:
        """A failure of its own; the first is told at once, before anything is stopped (`on_first_failure`: a node
        claims the job's first failure)."""
        self.failures.append(failure)
        if len(self.failures) == 1 and self.on_first_failure is not None:
            self.on_first_failure(failure)

    def _fail(self, child: Child, code: int, reason: str) -> None:
        child.state = State.FAILED
        self.display.not_waiting(child.name)
        self._failed(Failure(child.name, code, reason, child.log_path))

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
        self.tasks.start(self._restart_after(child, restart.backoff_s))
        return True

    def _apply(self, event: Exited | Ready | NotReady | Unresponsive | ExitOverdue | Due) -> None:
        """What an event changes in the children's states (a restart, which is awaited, aside)."""
        on = {Exited: self._on_exit, Ready: self._on_ready, NotReady: self._on_not_ready,
              Unresponsive: self._on_unresponsive, ExitOverdue: self._on_exit_overdue, Due: self._on_due}
        on[type(event)](event)

    def _on_due(self, event: Due) -> None:
        self.due.add(event.child.name)

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
            self.tasks.start(self._after(timeout, ExitOverdue(finished.name, timeout)))

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
                self.tasks.start(watch_liveness(self.events, event.name, remote, 0))
        elif event.generation == child.generation and child.state is State.STARTING:
            child.state = State.READY
            child.was_ready = True
            child.ready_since = time.monotonic()
            if child.spec.liveness:
                child.tasks.append(self.tasks.start(watch_liveness(self.events, child.name, child.spec,
                                                                   child.generation)))

    def _on_not_ready(self, event: NotReady) -> None:
        child = self.by_name.get(event.name)
        if child is not None and (event.generation != child.generation or child.state is not State.STARTING):
            return
        reason = f"did not answer {event.url} within {event.timeout_s:g} s"
        if child is None:
            self.display.not_waiting(event.name)
            self._failed(Failure(event.name, 1, reason, self.run_dir / LOGS_DIR / f"{event.name}.log"))
        else:
            self._fail(child, 1, reason)

    def _on_unresponsive(self, event: Unresponsive) -> None:
        reason = (f"stopped answering {event.url}: {event.failures} probes in a row unanswered, {event.seconds:.0f} "
                  f"s without an answer")
        child = self.by_name.get(event.name)
        if child is None:
            self._failed(Failure(event.name, 1, f"(node {self.remote[event.name].node}) {reason}",
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
            self.display.training(self.run_dir, self.plan.trainer_inputs.max_steps,
                                  per=(self.plan.world_size, self.plan.device.slot))
        await self._advance()
        while not (self.failures or self._trainers_done()):
            event = await self.events.get()
            if isinstance(event, StopRequested):
                return False
            if isinstance(event, RestartDue):
                if event.child.state is State.RESTARTING:
                    await self._start(event.child)
            else:
                self._apply(event)
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
        await asyncio.gather(*(asyncio.to_thread(fetch_metrics, c.spec, self.run_dir / LOGS_DIR / f"{c.name}.metrics")
                               for c in self.children if c.state is State.READY and c.spec.metrics_url))

    async def stop_all(self, *, grace_s: float) -> None:
        """SIGTERM each process (its leader first, so a server shuts its engine down in order; the rest of its group
        once the leader has gone), then SIGKILL every group left after the grace period."""
        self.stopping = True
        running = [c for c in self.children if c.running]
        for child in reversed(running):
            signal_leader(child.process.pid, signal.SIGTERM)
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
        self._watch_groups()
        try:
            await self.run_prepare()
        finally:
            self.groups.signal(signal.SIGKILL)
            await self.tasks.cancel_all()
            self.groups.close()

    async def run(self) -> RunResult:
        loop = asyncio.get_running_loop()
        self._watch_groups()
        try:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
            self.tasks.start(self._ticker())
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
                await self.tasks.cancel_all()  # probes, timers, the ticker, output a process's survivor still writes
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


def supervise(plan: Plan, run_dir: Path, *, nodes: Collection[int] = (0,), grace_s: float = GRACE_S,
              console: Console | None = None, verbose: bool = False,
              on_first_failure: Callable[[Failure], None] | None = None) -> RunResult:
    """Run the processes of `nodes` (several only when they are all this machine) until the trainers end."""
    return asyncio.run(Supervisor(plan, run_dir, nodes=nodes, grace_s=grace_s, console=console, verbose=verbose,
                                  on_first_failure=on_first_failure).run())
