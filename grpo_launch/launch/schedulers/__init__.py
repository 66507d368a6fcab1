"""Launchers: the launch side of the schedulers. Each is one module declaring one `Launcher` (`base.py`); `LAUNCHERS`
lists them by the names `contracts.schedulers` declares, as `plan.schedulers.SCHEDULERS` lists their planning side.

A launcher starts a written run directory through its scheduler and follows it (`run`: a scheduler that runs the job
elsewhere submits it, follows every process's log and the job's state through the console display, and cancels it
on Ctrl-C), says where its nodes find the run directory (`reach`) and what to do where the scheduler is not
installed (`missing`), ends a run from another terminal (`stop`, `grpo stop RUN_DIR`) and says where a run's logs
are (`logs`). The CLI asks it; nothing outside this package compares a scheduler's name.
"""

from __future__ import annotations

from grpo_launch.launch.schedulers.base import Launcher
from grpo_launch.launch.schedulers.hf_jobs import HfJobs
from grpo_launch.launch.schedulers.local import Local
from grpo_launch.launch.schedulers.skypilot import SkyPilot
from grpo_launch.launch.schedulers.slurm import Slurm

LAUNCHERS: dict[str, Launcher] = {s.name: s for s in (Local(), Slurm(), SkyPilot(), HfJobs())}
