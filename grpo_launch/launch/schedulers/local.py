"""scheduler=local: `grpo run` supervises the plan's processes itself, every node of it when all are this machine,
else node K on each machine (`grpo run --node-rank K`). `grpo stop RUN_DIR` sends it SIGTERM, as Ctrl-C would."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import Submitted, process_started, read_submitted, write_submitted
from grpo_launch.errors import UserError
from grpo_launch.launch.node import prepare_node, run_nodes
from grpo_launch.launch.result import RunResult
from grpo_launch.launch.schedulers.base import Launcher, Options

STOP_WAIT_S = 120.0  # how long `grpo stop` waits for the run to end (its own grace period: --grace, GRACE_S)


def _still_running(record: Submitted) -> bool:
    """Whether the `grpo run` the record names still runs: its pid, started when it was (a pid is reused once its
    process is gone, by whatever comes next; a record of a release before the start time: its command line)."""
    pid = int(record.ids[0])
    if record.started is not None:
        return process_started(pid) == record.started
    try:
        return b"grpo" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Local(Launcher[None]):
    name = "local"
    reach = "this machine's own directory (other machines of the plan: the same run.dir on shared storage)"
    node_rank = True

    def prepare(self, plan: Plan, options: Options, console: Console) -> Plan:
        return prepare_node(plan, options.nodes, console)  # addresses, ports, environment: before anything is written

    def keeps_metrics(self, plan: Plan, options: Options) -> bool:
        # the node of trainer rank 0 logs the metrics; other nodes sharing run.dir leave the curve be
        return any(0 in p.ranks for p in plan.processes if p.node in options.nodes)

    def run(self, plan: Plan, run_dir: Path, console: Console, options: Options) -> RunResult:
        if options.join and plan.nodes > 1:
            console.print(f"[yellow]node {options.nodes[0]} of {plan.nodes}: start the others (`grpo run --node-rank "
                          f"K`, the same run.dir) within run.rendezvous_timeout_s[/]")
        write_submitted(run_dir, Submitted(self.name, (str(os.getpid()),), time.time(), host=socket.gethostname(),
                                           started=process_started(os.getpid()), nodes=tuple(options.nodes)))
        return run_nodes(plan, run_dir, options.nodes, grace_s=options.grace_s, console=console,
                         verbose=options.verbose)

    def running(self, plan: Plan, run_dir: Path) -> str | None:
        """A `grpo run` of this machine that recorded itself and still runs (one of a release before the run lock,
        which holds none)."""
        try:
            record = read_submitted(run_dir)
        except UserError:
            return None
        if record.host != socket.gethostname() or int(record.ids[0]) == os.getpid() or not _still_running(record):
            return None
        return f"`grpo run` pid {record.ids[0]} on {record.host}"

    def stop(self, plan: Plan, run_dir: Path, console: Console) -> int:
        record = read_submitted(run_dir)
        if record.host != socket.gethostname():
            raise UserError(f"{run_dir} was started on {record.host}, not here", key="RUN_DIR",
                            hint=f"run `grpo stop {run_dir}` on {record.host}")
        pid = int(record.ids[0])
        if not _still_running(record):
            console.print(f"[bold]nothing to stop[/]: the run of {escape(str(run_dir))} (pid {pid}) has ended")
            return 0
        os.kill(pid, signal.SIGTERM)  # its supervisor stops every process, as on Ctrl-C
        console.print(f"[bold]stopping[/] the run of {escape(str(run_dir))} (pid {pid}): SIGTERM sent")
        deadline = time.monotonic() + STOP_WAIT_S
        while _still_running(record) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _still_running(record):
            console.print(f"[yellow]pid {pid} still runs after {STOP_WAIT_S:g} s[/]: kill -KILL {pid}")
            return 1
        console.print("[bold]stopped[/]")
        return 0
