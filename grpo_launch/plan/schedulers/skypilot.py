"""skypilot: a SkyPilot task, `task.yaml` in the run directory, launched with `sky launch` from it.

The run directory is the task's workdir: SkyPilot copies it to every node. Each node runs the same `run:` script,
which exports GRPO_HOST_K from line K of SKYPILOT_NODE_IPS (node 0 first) and starts grpo-launch's supervisor for
node SKYPILOT_NODE_RANK. SkyPilot ends the job when every node's run ends, and fails it (stopping the others) as
soon as one fails.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import NodeGroup, ProcessSpec, SchedulerPlan
from grpo_launch.contracts.rundir import SKYPILOT_TASK_FILE
from grpo_launch.plan.schedulers.base import NODE_SUPERVISOR, Scheduler

SKY_WORKDIR = "~/sky_workdir"  # where SkyPilot puts the task's workdir on every node

RUN = """set -u
# Node K's address is line K of SKYPILOT_NODE_IPS (node 0 first); this node's index is SKYPILOT_NODE_RANK.
k=0
while read -r ip; do
  [ -n "$ip" ] || continue
  export "GRPO_HOST_$k=$ip"
  k=$((k + 1))
done <<< "$SKYPILOT_NODE_IPS"
if [ "$k" -ne {nodes} ]; then
  echo "grpo: this task needs {nodes} node(s), SKYPILOT_NODE_IPS lists $k" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
exec {supervisor} --node "$SKYPILOT_NODE_RANK"
"""


def cluster_name(config: Config, recipe: str) -> str:
    return config.scheduler.skypilot.cluster_name or f"grpo-{recipe}".replace(".", "-")


def fetch_command(cluster: str) -> tuple[str, ...]:
    """metrics.jsonl and the logs from node 0's copy of the run directory (the task's workdir, ~/sky_workdir), over
    the SSH host SkyPilot names after the cluster (`sky status` writes its ssh config); checkpoints stay there.
    Trainer rank 0, which writes the metrics, runs on node 0; the other nodes' logs stay on them."""
    return ("rsync", "-a", "--include=metrics.jsonl", "--include=logs/***", "--exclude=*",
            f"{cluster}:{SKY_WORKDIR}/", "./")


class SkyPilot(Scheduler):
    name = "skypilot"
    job_file = SKYPILOT_TASK_FILE

    def job(self, config: Config, recipe: str, processes: Sequence[ProcessSpec]) -> tuple[SchedulerPlan,
                                                                                         dict[str, Any]]:
        s = config.scheduler.skypilot
        nodes = config.cluster.nodes
        resources: dict[str, Any] = {}
        accelerators = s.accelerators or (f"{config.cluster.gpu_type}:{config.cluster.gpus_per_node}"
                                          if config.cluster.accelerator == "cuda" else None)
        for key, value in (("cloud", s.cloud), ("accelerators", accelerators), ("disk_size", s.disk_size)):
            if value is not None:
                resources[key] = value
        if s.use_spot:
            resources["use_spot"] = True
        task: dict[str, Any] = {"name": cluster_name(config, recipe), "num_nodes": nodes, "workdir": "."}
        if resources:
            task["resources"] = resources
        if config.scheduler.setup:
            task["setup"] = "\n".join(config.scheduler.setup) + "\n"
        task["run"] = RUN.format(nodes=nodes, supervisor=shlex.join(NODE_SUPERVISOR))
        command = shlex.join(NODE_SUPERVISOR) + " --node $SKYPILOT_NODE_RANK"
        by_node = {n: tuple(p.name for p in processes if p.node == n) for n in range(nodes)}
        groups = tuple(NodeGroup(f"node {n}", (n,), by_node[n], command,
                                 "trainer nodes: when training ends; nodes that only serve: when the job is "
                                 "cancelled or fails") for n in range(nodes))
        plan = SchedulerPlan(
            kind=self.name, job_file=self.job_file,
            submit=("sky", "launch", "--yes", "--cluster", cluster_name(config, recipe), self.job_file),
            node_rank="SKYPILOT_NODE_RANK", addresses="GRPO_HOST_K: line K of SKYPILOT_NODE_IPS, exported by the "
                                                      "task's run script", groups=groups,
            fetch=fetch_command(cluster_name(config, recipe)))
        return plan, {self.job_file: task}
