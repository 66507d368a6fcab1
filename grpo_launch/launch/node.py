"""One node's share of a run directory: what a scheduler's job starts on every node, and `grpo run` on one.

The node's processes of plan.json, with the node addresses the environment gives (GRPO_HOST_K), torchrun's stray
PET_* variables cleared, every port checked free, supervised by the same rules as on one machine. A node whose
processes failed on their own records the first failure's code, time and cause (`contracts.rundir.NodeFailure`),
so a job spanning nodes can pass on the code of the node that failed first (not of a node it stopped).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import NodeFailure, claim_first_failure, clear_node_failures, write_node_failure
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV
from grpo_launch.errors import UserError
from grpo_launch.launch.preflight import check_data_files, check_keys_set, check_ports_free, check_vllm_installed
from grpo_launch.launch.replica_key import provide_replica_key
from grpo_launch.launch.result import RunResult
from grpo_launch.launch.spawn import stray_launcher_variables
from grpo_launch.launch.supervisor import supervise


def check_not_a_worker(environ: dict[str, str]) -> None:
    """grpo-launch is itself the launcher: started as a torch worker (RANK set), every copy would start every
    process of its node. A node's role comes from the plan and --node, never from a torch rank."""
    worker = [k for k in ("RANK", "LOCAL_RANK") if k in environ]
    if worker:
        raise UserError(f"{' and '.join(worker)} set: grpo-launch is running as a torch worker, and each copy "
                        f"would start this node's processes", key=worker[0],
                        hint="run it once per node (not under torchrun, accelerate or `srun --ntasks-per-node` > 1)"
                             "; unset the variable if it is left from another launch")


def prepare_node(plan: Plan, nodes: Collection[int], console: Console) -> Plan:
    """The plan as these nodes run it: addresses filled in, the vLLM servers' key in the environment, refused if
    started as a worker, if vLLM is missing where an engine runs or a port is busy."""
    check_not_a_worker(dict(os.environ))
    check_data_files(plan)
    check_keys_set(plan)
    keyed = provide_replica_key(plan, nodes, os.environ)
    if keyed is not None:
        console.print(f"[{'dim' if os.environ.get(REPLICA_KEY_ENV) else 'yellow'}]{escape(keyed)}[/]")
    resolved = plan.with_addresses(os.environ)
    for node in nodes:
        check_vllm_installed(resolved, node)
        check_ports_free(resolved, node)
    stray = stray_launcher_variables(os.environ)
    if stray:
        console.print(f"[yellow]cleared {', '.join(stray)} for every process: torchrun would read them as options "
                      f"the plan sets itself[/]")
    return resolved


def run_nodes(plan: Plan, run_dir: Path, nodes: Collection[int], *, grace_s: float, console: Console,
              verbose: bool = False) -> RunResult:
    """Supervise `nodes` of the (prepared) plan; a failure is recorded for a job spanning several machines: the
    node claims the job's first failure as it happens, and writes its record (its code, and when it failed) once it
    stopped its processes. An earlier run's records of these nodes are gone first."""
    clear_node_failures(run_dir, nodes)
    node_of = {p.name: p.node for p in plan.processes}

    def claim(failure) -> None:
        claim_first_failure(run_dir, node_of.get(failure.process, min(nodes)))  # a prepare step: the first node's

    result = supervise(plan, run_dir, nodes=nodes, grace_s=grace_s, console=console, verbose=verbose,
                       on_first_failure=claim)
    if result.failures and not result.interrupted:
        first = result.failures[0]
        reason = str(first).removeprefix(f"{first.process} ")
        for node in nodes:
            write_node_failure(run_dir, NodeFailure(node, result.code, first.time_ns, first.process, reason))
    return result
