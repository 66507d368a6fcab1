"""What each scheduler declares: its name (`scheduler.kind`, its group file's name), what it is in one line, and
its settings, the recipe section `scheduler.<key>`.

A scheduler is one module per side: `plan/schedulers/NAME.py` renders its job, `launch/schedulers/NAME.py` submits,
follows and cancels it. Its declaration sits here, in `contracts`, because three rooms read it and the recipe schema
(`compose.schema`, which builds its `scheduler` section from `DECLARED`) may import neither side: the stages run
one way, compose before plan before launch. The settings are the scheduler's alone: no other module reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_launch.contracts.knobs import knob
from grpo_launch.contracts.typed import build


@dataclass(kw_only=True)
class SlurmSettings:
    partition: str | None = knob(None, "#SBATCH --partition; null: the cluster's default partition.")
    account: str | None = knob(None, "#SBATCH --account to charge.")
    qos: str | None = knob(None, "#SBATCH --qos.")
    time_limit: str | None = knob(None, "#SBATCH --time, e.g. 2-00:00:00; null: the partition's limit.")
    gpus_per_node: int | None = knob(None, "#SBATCH --gpus-per-node; null: cluster.gpus_per_node on GPUs, none "
                                           "on CPU.", ge=0)
    gres: str | None = knob(None, "#SBATCH --gres instead of --gpus-per-node, e.g. gpu:h100:8.")
    sbatch: list[str] = knob(factory=list, doc="More #SBATCH options, verbatim, e.g. --constraint=h100 or "
                                               "--mem=0.")
    poll_s: float = knob(1.0, "How often `grpo run` reads the job's state from scontrol.", gt=0)


@dataclass(kw_only=True)
class SkyPilotSettings:
    cluster_name: str | None = knob(None, "`sky launch -c NAME`; null: grpo-<recipe>.")
    cloud: str | None = knob(None, "resources.cloud (aws, gcp, kubernetes, ...); null: SkyPilot picks.")
    accelerators: str | None = knob(None, "resources.accelerators; null: <cluster.gpu_type>:<cluster.gpus_per_node> "
                                          "on GPUs, none on CPU.")
    use_spot: bool = knob(False, "resources.use_spot.")
    disk_size: int | None = knob(None, "resources.disk_size in GB.", ge=1)


@dataclass(frozen=True)
class Declared:
    name: str                       # scheduler.kind
    summary: str                    # who starts the processes, in a few words
    key: str | None = None          # its settings' section under scheduler.
    settings: type | None = None    # the section's dataclass
    doc: str = ""                   # the section's one-line doc


DECLARED: tuple[Declared, ...] = (
    Declared("local", "`grpo run` itself: every node from one command when all are this machine, else `grpo run "
                      "--node-rank K` on each"),
    Declared("slurm", "a batch job, job.sbatch", "slurm", SlurmSettings, "scheduler=slurm: the batch job's resources."),
    Declared("skypilot", "a SkyPilot task, task.yaml", "skypilot", SkyPilotSettings,
             "scheduler=skypilot: the task's resources."),
)


def declared(name: str) -> Declared:
    return next(d for d in DECLARED if d.name == name)  # the schema's choices hold exactly these names


def settings_in(scheduler: Any, name: str) -> Any:
    """Scheduler `name`'s own settings from a `scheduler` section (typed, or a mapping read back from a run
    directory's config.yaml); None for a scheduler without settings."""
    d = declared(name)
    if d.key is None:
        return None
    section = scheduler[d.key] if isinstance(scheduler, Mapping) else getattr(scheduler, d.key)
    return build(d.settings, section) if isinstance(section, Mapping) else section
