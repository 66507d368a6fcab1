"""skypilot: a SkyPilot task, `task.yaml` in the run directory, launched with `sky launch` from it.

The run directory is the task's workdir: SkyPilot copies it to every node. Each node runs the same `run:` script,
which exports GRPO_HOST_K from line K of SKYPILOT_NODE_IPS (node 0 first) and starts grpo-launch's supervisor for
node SKYPILOT_NODE_RANK. SkyPilot ends the job when every node's run ends, and fails it (stopping the others) as
soon as one fails.

Each run gets a cluster of its own, named after its run directory (`contracts.schedulers.skypilot_cluster`): the plan
does not know the run directory, so it names the cluster by its pattern, and the launcher, which does, puts the
run's name in its place in the submit command. A cluster the recipe names (`scheduler.skypilot.cluster_name`) is
used as named. How the cluster ends (`--down`, `--idle-minutes-to-autostop`) is in the submit command.
"""

from __future__ import annotations

from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.devices import device_of
from grpo_launch.contracts.plan import NodeGroup, Plan, SchedulerPlan
from grpo_launch.contracts.rundir import SKYPILOT_TASK_FILE
from grpo_launch.contracts.schedulers import (
    SKYPILOT_ACCELERATORS,
    SkyPilotSettings,
    skypilot_cluster_pattern,
    skypilot_name_part,
)
from grpo_launch.contracts.shell import shell_line
from grpo_launch.errors import UserError
from grpo_launch.plan.schedulers.base import NODE_SUPERVISOR, Scheduler, setup_lines

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
    """The cluster as the plan knows it: the recipe's name for it, or the pattern of the run's own."""
    return config.scheduler.skypilot.cluster_name or skypilot_cluster_pattern(recipe)


def task_name(config: Config, recipe: str) -> str:
    """The task's (the job's) name in `sky queue`: the cluster's the recipe names, or grpo-<recipe> (both SkyPilot
    names: the one checked as the recipe is composed, the other made of letters, digits and dashes)."""
    return config.scheduler.skypilot.cluster_name or f"grpo-{skypilot_name_part(recipe)}"


def teardown(s: SkyPilotSettings) -> tuple[str, ...]:
    """`sky launch`'s options for how the cluster ends once no job runs on it."""
    options: tuple[str, ...] = ("--down",) if s.down else ()
    if s.idle_minutes_to_autostop is not None:
        options += ("--idle-minutes-to-autostop", str(s.idle_minutes_to_autostop))
    return options


def accelerators(config: Config) -> str | None:
    """resources.accelerators: as set, else the cluster's GPUs (none on a CPU)."""
    c = config.cluster
    given = config.scheduler.skypilot.accelerators
    return given or (f"{c.gpu_type}:{c.gpus_per_node}" if device_of(c.accelerator).gpus else None)


class SkyPilot(Scheduler):
    name = "skypilot"
    job_file = SKYPILOT_TASK_FILE
    copies_run_dir = True  # the task's workdir, synced to every node

    def check(self, config: Config) -> None:
        """What SkyPilot is given from elsewhere in the recipe takes its forms too."""
        super().check(config)
        if (wanted := accelerators(config)) and not SKYPILOT_ACCELERATORS.fits(wanted):
            raise UserError(f"resources.accelerators {wanted!r} (cluster.gpu_type:cluster.gpus_per_node) is not "
                            f"{SKYPILOT_ACCELERATORS.what}", key="cluster.gpu_type",
                            hint="set scheduler.skypilot.accelerators to SkyPilot's name for the GPU, e.g. H100:8")

    def job(self, config: Config, plan: Plan) -> tuple[SchedulerPlan, dict[str, Any]]:
        s, recipe = config.scheduler.skypilot, plan.recipe
        nodes = config.cluster.nodes
        resources: dict[str, Any] = {}
        for key, value in (("cloud", s.cloud), ("accelerators", accelerators(config)), ("disk_size", s.disk_size)):
            if value is not None:
                resources[key] = value
        if s.use_spot:
            resources["use_spot"] = True
        task: dict[str, Any] = {"name": task_name(config, recipe), "num_nodes": nodes, "workdir": "."}
        if resources:
            task["resources"] = resources
        if config.scheduler.setup:
            task["setup"] = "\n".join(config.scheduler.setup) + "\n"
        task["run"] = RUN.format(nodes=nodes, supervisor=shell_line(NODE_SUPERVISOR))
        command = shell_line(NODE_SUPERVISOR) + " --node $SKYPILOT_NODE_RANK"
        by_node = {n: tuple(p.name for p in plan.processes if p.node == n) for n in range(nodes)}
        groups = tuple(NodeGroup(f"node {n}", (n,), by_node[n], command,
                                 "trainer nodes: when training ends; nodes that only serve: when the job is "
                                 "cancelled or fails") for n in range(nodes))
        cluster = cluster_name(config, recipe)
        scheduled = SchedulerPlan(
            kind=self.name, job_file=self.job_file,
            submit=("sky", "launch", "--yes", "--cluster", cluster, *teardown(s), self.job_file), cluster=cluster,
            node_rank="SKYPILOT_NODE_RANK", addresses="GRPO_HOST_K: line K of SKYPILOT_NODE_IPS, exported by the "
                                                      "task's run script", groups=groups,
            verbatim=setup_lines(config))
        return scheduled, {self.job_file: task}
