"""Starting a process for the supervisor: in the environment grpo-launch gives every process, in a session of its
own (so its whole group can be signalled, and is recorded for the watchdog), its exit seen the moment it happens,
and its output drained into its log by a task of the run's (`output`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.launch.display import ConsoleDisplay
from grpo_launch.launch.output import LogFile, drain
from grpo_launch.launch.tasks import Tasks
from grpo_launch.launch.watchdog import ProcessGroups

STRAY_PREFIX = "PET_"            # torchrun's options from the environment; cleared for every process
PUMP_DRAIN_S = 2.0               # after its group is killed, how long a process's last lines may take to arrive


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


@dataclass(frozen=True)
class Started:
    process: asyncio.subprocess.Process
    exited: asyncio.Future[int]  # resolved with the return code when the process exits
    drained: asyncio.Task        # ends when its output does


@dataclass(eq=False)
class Spawner:
    """Starts the processes of one run in `cwd`, each one's group recorded in `groups`, its output drained by a task
    of `tasks` with every value of `secrets` kept out."""

    cwd: Path
    groups: ProcessGroups
    tasks: Tasks
    display: ConsoleDisplay
    secrets: tuple[str, ...]

    async def start(self, argv: tuple[str, ...], env: dict[str, str], log_path: Path,
                    on_line: Callable[[str], None]) -> Started:
        """Start `argv` with `env` over grpo-launch's environment, stdin closed, its output into `log_path` and each
        line to `on_line`."""
        warn = lambda message: self.warn(log_path, message)  # noqa: E731
        log = LogFile(log_path, warn)
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop), *argv, cwd=self.cwd, env=child_environment(env),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        except BaseException:
            log.close()
            raise
        process = asyncio.subprocess.Process(transport, protocol, loop)
        self.groups.add(process.pid)
        drained = self.tasks.start(drain(process.stdout, log, on_line, warn, self.secrets))
        return Started(process, protocol.exited, drained)

    def warn(self, log: Path, message: str) -> None:
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


def signal_leader(pid: int, sig: int) -> None:
    """Signal a process alone, not its group: a server shuts its own children down in order."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
