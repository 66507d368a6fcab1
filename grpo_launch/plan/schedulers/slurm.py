"""slurm: one batch job, `job.sbatch` in the run directory, submitted from it (storage every node shares).

The job takes whole nodes (`--exclusive`, one task per node). Plan node K is the K-th node of the allocation; its
address is its NodeAddr (names need not resolve), exported as GRPO_HOST_K. grpo-launch's supervisor runs on every
node (`python -m grpo_launch.launch --node K`) and starts that node's processes by the same rules as on one
machine: each node finds K from its own name, which the step's shell expands on that node. The nodes that train
are one `srun` step and those that only serve another, over slices of the allocation, each step with its nodes'
GPUs (`--gpus-per-node`), `--kill-on-bad-exit`, so a node that fails stops its step's other nodes, and `--wait`, so
one whose supervisor never exits is ended `run.exit_timeout_s` after the first of its step ended. The job ends
with the trainer step: ending the batch script makes Slurm send SIGTERM to the serving step, whose supervisors
stop their servers. Its exit code is the first node failure's own code (srun reports the highest of its tasks,
often a peer it stopped), recorded by each node's supervisor.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.compose.schema import Scheduler as SchedulerSection
from grpo_launch.contracts.devices import device_of
from grpo_launch.contracts.plan import NodeGroup, Plan, SchedulerPlan, VerbatimLine
from grpo_launch.contracts.rundir import JOB_LOG, LOGS_DIR, NODE_FAILURES, SLURM_JOB_FILE
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.errors import UserError
from grpo_launch.plan.schedulers.base import NODE_SUPERVISOR, Scheduler, node_groups, node_list, setup_lines

# The exit code of the node that failed first, from the nodes' records (contracts.failures).
FIRST_FAILURE = (*NODE_SUPERVISOR, "--first-failure")

# The step's shell finds its node index from its own node name; single-quoted in the batch script, so it expands on
# each node, not once in the batch shell (where $SLURM_NODEID would be 0 for every node).
STEP_COMMAND = ('i=0; for n in $GRPO_NODE_NAMES; do if [ "$n" = "$SLURMD_NODENAME" ]; then exec '
                + shell_line(NODE_SUPERVISOR) + ' --node "$i"; fi; i=$((i + 1)); done; '
                'echo "grpo: node $SLURMD_NODENAME is not in this job ($GRPO_NODE_NAMES)" >&2; exit 2')

_HEADER = """#!/bin/bash
# grpo-launch: run '{recipe}' (placement {placement}) as one Slurm job on {nodes}. Submit it from the run
# directory, on storage every node shares: `cd RUN_DIR && sbatch {job_file}` (`grpo run` does, and follows it). It
# works in the directory sbatch ran in, $SLURM_SUBMIT_DIR, which `sbatch --chdir` does not change. On every node
# grpo-launch's supervisor starts that node's processes of plan.json, as `grpo run` does on one machine: servers
# first (gated on /health), then the trainer; any failure stops everything.
"""

_BODY = """set -u
cd "${{SLURM_SUBMIT_DIR:-.}}" || exit 1
{setup}export PYTHONUNBUFFERED=1  # else the processes' logs appear only when they exit
mkdir -p {logs}
rm -f {failures}

# Plan node K is the K-th node of the allocation. Its address is its NodeAddr: node names need not resolve, so not
# MASTER_ADDR=$(scontrol show hostnames | head -n1).
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if [ "${{#nodes[@]}}" -ne {nodes} ]; then
  echo "grpo: this job needs {nodes} node(s), got ${{#nodes[@]}}" >&2
  exit 2
fi
for k in "${{!nodes[@]}}"; do
  export "GRPO_HOST_$k=$(scontrol show node "${{nodes[$k]}}" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')"
done
export GRPO_NODE_NAMES="${{nodes[*]}}"
echo "grpo: nodes ${{nodes[*]}}"
# Each node's supervisor finds its index from its own name ($SLURMD_NODENAME expands on that node, so the command is
# single-quoted here).
# shellcheck disable=SC2016
node_supervisor={step_command}
"""

_TAIL = """
# The first node that failed on its own names the exit code: srun reports the highest of its tasks' codes, often a
# node it stopped (143). Ending the script ends the job; Slurm sends SIGTERM to any step still running.
first=$({first_failure})
if [ "$rc" -ne 0 ] && [ -n "$first" ]; then rc=$first; fi
echo "grpo: job ends with exit code $rc"
exit "$rc"
"""


class Slurm(Scheduler):
    name = "slurm"
    job_file = SLURM_JOB_FILE
    shares_run_dir = True  # submitted from the run directory, on storage every node mounts

    def check(self, config: Config) -> None:
        super().check(config)
        s = config.scheduler.slurm
        if s.gres and s.gpus_per_node:
            raise UserError("scheduler.slurm.gres and scheduler.slurm.gpus_per_node both request GPUs",
                            key="scheduler.slurm.gres", hint="set one of them")
        if s.gpus_per_node and device_of(config.cluster.accelerator).gpus \
                and s.gpus_per_node != config.cluster.gpus_per_node:
            raise UserError(f"scheduler.slurm.gpus_per_node={s.gpus_per_node}, but the plan places work on "
                            f"cluster.gpus_per_node={config.cluster.gpus_per_node} GPUs of every node",
                            key="scheduler.slurm.gpus_per_node",
                            hint="leave it unset (null) to request cluster.gpus_per_node, or 0 to request none")

    def on_cpu(self, section: SchedulerSection) -> SchedulerSection:
        return replace(section, slurm=replace(section.slurm, gpus_per_node=None, gres=None))

    def _gpus(self, config: Config) -> list[str]:
        """The GPU request of the job, and of each step (so each step is bound to its nodes' GPUs)."""
        s = config.scheduler.slurm
        if s.gres:
            return [f"--gres={s.gres}"]
        gpus = s.gpus_per_node if s.gpus_per_node is not None else (
            config.cluster.gpus_per_node if device_of(config.cluster.accelerator).gpus else 0)
        return [f"--gpus-per-node={gpus}"] if gpus else []

    def _sbatch_options(self, config: Config, recipe: str) -> list[str]:
        s = config.scheduler.slurm
        options = [f"--job-name=grpo-{recipe}", f"--nodes={config.cluster.nodes}", "--ntasks-per-node=1",
                   "--exclusive", f"--output={LOGS_DIR}/{JOB_LOG}"]
        for flag, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                            ("time", s.time_limit)):
            if value:
                options.append(f"--{flag}={value}")
        options += self._gpus(config)
        options += [line.removeprefix("#SBATCH").strip() for line in s.sbatch]
        return options

    def _step(self, config: Config, group: NodeGroup) -> str:
        nodes = ",".join(f"${{nodes[{n}]}}" for n in group.nodes)
        count = len(group.nodes)
        options = [f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f'--nodelist="{nodes}"',
                   *map(shell_word, self._gpus(config)), "--kill-on-bad-exit=1",
                   f"--wait={math.ceil(config.run.exit_timeout_s)}", f"--job-name={group.name}",
                   f"--output={LOGS_DIR}/step-{group.name}-%t.out"]
        return (f"# {group.name}: {node_list(group.nodes)} ({', '.join(group.processes)}); {group.ends}\n"
                f"srun {' '.join(options)} \\\n     bash -c \"$node_supervisor\" &\n{group.name}=$!\n")

    def job(self, config: Config, plan: Plan) -> tuple[SchedulerPlan, dict[str, Any]]:
        recipe = plan.recipe
        command = shell_line(NODE_SUPERVISOR) + " --node K"
        trainers, services = node_groups(plan, command)
        groups = (trainers,) if services is None else (trainers, services)
        setup = "".join(line + "\n" for line in config.scheduler.setup)
        failures = f"{LOGS_DIR}/{NODE_FAILURES.format(node='*')}"
        nodes = f"{config.cluster.nodes} node" + "s" * (config.cluster.nodes != 1)
        text = _HEADER.format(recipe=recipe, placement=config.placement.kind, nodes=nodes, job_file=self.job_file)
        text += "".join(f"#SBATCH {option}\n" for option in self._sbatch_options(config, recipe))
        text += _BODY.format(setup=setup, logs=LOGS_DIR, failures=failures, nodes=config.cluster.nodes,
                             step_command=shell_word(STEP_COMMAND))
        text += "".join("\n" + self._step(config, g) for g in groups)
        if services is None:
            text += "wait \"$trainer\"; rc=$?\n"
        else:
            text += ("\n# Whichever step ends first ends the job: the trainer step when training is over, the serving "
                     "step only on a failure.\nwhile kill -0 \"$trainer\" 2>/dev/null && kill -0 \"$services\" "
                     "2>/dev/null; do sleep 1; done\n"
                     "if kill -0 \"$trainer\" 2>/dev/null; then\n"
                     "  wait \"$services\"; rc=$?\n  echo \"grpo: a serving node ended (exit code $rc): stopping the "
                     "trainer nodes\"\n  [ \"$rc\" -ne 0 ] || rc=1\n"
                     "else\n  wait \"$trainer\"; rc=$?\nfi\n")
        text += _TAIL.format(first_failure=shell_line(FIRST_FAILURE))
        scheduled = SchedulerPlan(
            kind=self.name, job_file=self.job_file, submit=("sbatch", "--parsable", self.job_file),
            node_rank="each node's supervisor finds K from its node name ($SLURMD_NODENAME in the allocation's "
                      "node list); each launcher's argv carries its node's rank",
            addresses="GRPO_HOST_K: node K's NodeAddr (scontrol show node), exported by job.sbatch",
            groups=groups, verbatim=setup_lines(config) + tuple(VerbatimLine("scheduler.slurm.sbatch", line)
                                                                for line in config.scheduler.slurm.sbatch))
        return scheduled, {self.job_file: text}
