"""Schedulers: how the plan's processes reach the machines. Each is one module declaring one `Scheduler`;
`SCHEDULERS` lists them.

A scheduler decides the nodes' addresses when `cluster.hosts` is empty, renders the job file the scheduler runs
(a document in `Plan.files`, so `grpo plan --dry-run` shows it) and says how each node learns its index and the
addresses, and which nodes run what (`SchedulerPlan`). Its launcher (`launch.schedulers`) submits the job and
follows it. The placements do not change: they describe processes and nodes; the scheduler decides how they reach
the machines.

Adding a scheduler: its declaration and settings in `contracts.schedulers`, a module here with a `Scheduler`
subclass and an entry in `SCHEDULERS`, its launcher in `launch/schedulers/`, and its group file
(recipes/scheduler/NAME.yaml).
"""

from __future__ import annotations

from grpo_launch.compose.schema import Config
from grpo_launch.plan.schedulers.base import Scheduler
from grpo_launch.plan.schedulers.hf_jobs import HfJobs
from grpo_launch.plan.schedulers.local import Local
from grpo_launch.plan.schedulers.skypilot import SkyPilot
from grpo_launch.plan.schedulers.slurm import Slurm

SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (Local(), Slurm(), SkyPilot(), HfJobs())}


def scheduler_of(config: Config) -> Scheduler:
    return SCHEDULERS[config.scheduler.kind]  # the schema's choices are the declared names, each planned here
