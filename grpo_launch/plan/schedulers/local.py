"""local: `grpo run` starts the processes itself. Every node from one command when every node is this machine
(loopback: the nodes' launchers rendezvous over 127.0.0.1), otherwise `grpo run --node-rank K` on each machine."""

from __future__ import annotations

from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import hosts
from grpo_launch.contracts.devices import device_of
from grpo_launch.contracts.hosts import LOOPBACK, is_loopback
from grpo_launch.contracts.plan import NodeGroup, Plan, SchedulerPlan
from grpo_launch.errors import UserError
from grpo_launch.plan.schedulers.base import Scheduler


class Local(Scheduler):
    name = "local"
    job_file = None

    def check(self, config: Config) -> None:
        c = config.cluster
        seen: dict[str, int] = {}
        for node, host in enumerate(c.hosts):
            if host in seen and not device_of(c.accelerator).loopback_nodes:
                raise UserError(f"cluster.hosts gives nodes {seen[host]} and {node} the same machine {host}: on "
                                f"GPUs they would share its GPUs 0-{c.gpus_per_node - 1}", key="cluster.hosts",
                                hint="give each node its own machine; several nodes on one machine work on CPU "
                                     "(cluster.accelerator=cpu)")
            seen.setdefault(host, node)

    def host(self, config: Config, node: int) -> str:
        """Several CPU nodes without hosts run on this machine; several GPU nodes need their addresses."""
        if config.cluster.nodes == 1 or device_of(config.cluster.accelerator).loopback_nodes:
            return LOOPBACK
        return hosts.reference(node)

    def job(self, config: Config, plan: Plan) -> tuple[SchedulerPlan, dict[str, Any]]:
        nodes, processes = config.cluster.nodes, plan.processes
        addresses = [config.cluster.hosts[n] if config.cluster.hosts else self.host(config, n) for n in range(nodes)]
        names = {n: tuple(p.name for p in processes if p.node == n) for n in range(nodes)}
        if all(is_loopback(a) for a in addresses):
            groups = (NodeGroup("this machine", tuple(range(nodes)), tuple(p.name for p in processes), "grpo run",
                                "when training ends; any process failing stops every node's processes"),)
            rank = "one supervisor for every node; each launcher's argv carries its node's rank" if nodes > 1 \
                else "one node"
            where = "every node is this machine (loopback)"
        else:
            groups = tuple(NodeGroup(f"node {n}", (n,), names[n], f"grpo run --node-rank {n}",
                                     "trainer nodes: when training ends; nodes that only serve: when stopped")
                           for n in range(nodes))
            rank = "--node-rank K on each machine (the same run.dir on shared storage)"
            where = ("cluster.hosts" if config.cluster.hosts else
                     "GRPO_HOST_K in the environment of every node (set them, or set cluster.hosts)")
        return SchedulerPlan(kind=self.name, job_file=None, submit=(), node_rank=rank, addresses=where,
                             groups=groups), {}
