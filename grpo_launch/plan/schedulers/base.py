"""The `Scheduler` interface every scheduler module implements (see `plan.schedulers`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from grpo_launch.compose.schema import Config
from grpo_launch.compose.schema import Scheduler as SchedulerSection
from grpo_launch.contracts import hosts
from grpo_launch.contracts.plan import NodeGroup, Plan, SchedulerPlan, VerbatimLine
from grpo_launch.errors import UserError
from grpo_launch.plan.layout import Layout

# What a scheduler starts on every node: grpo-launch's supervisor for that node's processes of plan.json.
NODE_SUPERVISOR = ("python", "-m", "grpo_launch.launch", "--run-dir", ".")


class Scheduler(ABC):
    name: ClassVar[str]                   # scheduler.kind, and the group file's name
    job_file: ClassVar[str | None]        # the file it writes into the run directory
    # Its machines have the GPUs their processes use, no more (a GPU of the uniform grid that none uses is not
    # there, and not idle); False: whole nodes of cluster.gpus_per_node GPUs.
    sized_machines: ClassVar[bool] = False
    # Every machine finds the run directory at the same absolute path (shared storage, a mounted bucket), so a path
    # the trainer writes there resolves on the others.
    shares_run_dir: ClassVar[bool] = False
    # Each machine gets a copy of its own of the run directory: what a node writes there, only that node sees.
    copies_run_dir: ClassVar[bool] = False

    def shape(self, config: Config, packed: Callable[[Config], Layout]) -> tuple[Config, int | None]:
        """The cluster as this scheduler gets its machines, and the trainer nodes' GPUs when each vLLM engine gets a
        machine of its own (`Context.engines_apart`). `packed(config)` is the placement's layout with engines
        sharing nodes, as the recipe's cluster gives it. Default: the recipe's nodes as they are."""
        return config, None

    def check(self, config: Config) -> None:
        """The scheduler's own rules, before anything is planned."""
        if config.cluster.hosts:
            raise UserError(f"cluster.hosts is set, but scheduler={self.name} picks the machines",
                            key="cluster.hosts", hint="drop cluster.hosts: each node's address reaches the "
                                                      "processes from the scheduler")

    def host(self, config: Config, node: int) -> str:
        """Node `node`'s address when cluster.hosts is empty: loopback on one node, else read where the job runs."""
        return hosts.LOOPBACK if config.cluster.nodes == 1 else hosts.reference(node)

    def warnings(self, config: Config, plan: SchedulerPlan) -> list[str]:
        """What the plan view should warn about how the processes reach the machines."""
        return []

    def on_cpu(self, section: SchedulerSection) -> SchedulerSection:
        """The `scheduler` section as a CPU rehearsal of the plan submits it (no GPU request)."""
        return section

    @abstractmethod
    def job(self, config: Config, plan: Plan) -> tuple[SchedulerPlan, dict[str, Any]]:
        """How the plan's processes reach the machines, and the job file(s) that do it (documents by file name); the
        plan has no scheduler yet."""


def setup_lines(config: Config) -> tuple[VerbatimLine, ...]:
    """scheduler.setup: shell by design, run as written on every node before anything else."""
    return tuple(VerbatimLine("scheduler.setup", line) for line in config.scheduler.setup)


def node_groups(plan: Plan, command: str) -> tuple[NodeGroup, NodeGroup | None]:
    """The nodes that train (they end with training) and those that only serve (stopped once training ended)."""
    serving = tuple(n for n in range(plan.nodes) if n not in plan.trainer_nodes)
    trainers = NodeGroup("trainer", plan.trainer_nodes, tuple(p.name for p in plan.processes
                                                              if p.node in plan.trainer_nodes),
                         command, "when training ends; a node that fails stops the others")
    if not serving:
        return trainers, None
    services = NodeGroup("services", serving, tuple(p.name for p in plan.processes if p.node in serving), command,
                         "stopped once the trainer nodes end; a node that fails stops the job")
    return trainers, services


def node_list(nodes: Sequence[int]) -> str:
    """'node 0', 'nodes 0-3', 'nodes 0, 2'."""
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    if list(nodes) == list(range(nodes[0], nodes[-1] + 1)):
        return f"nodes {nodes[0]}-{nodes[-1]}"
    return "nodes " + ", ".join(map(str, nodes))


# The readiness probe of the generated scripts' Python heredocs (they import urllib.request): a server is ready once
# its URL answers 200, each try given 5 s.
ANSWERS_PY = """def answers(url, headers):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5).status == 200
    except Exception:
        return False
"""
