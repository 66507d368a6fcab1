"""What each scheduler declares: its name (`scheduler.kind`, its group file's name), what it is in one line, and
its settings, the recipe section `scheduler.<key>`.

A scheduler is one module per side: `plan/schedulers/NAME.py` renders its job, `launch/schedulers/NAME.py` submits,
follows and cancels it. Its declaration sits here, in `contracts`, because three rooms read it and the recipe schema
(`compose.schema`, which builds its `scheduler` section from `DECLARED`) may import neither side: the stages run
one way, compose before plan before launch. The settings are the scheduler's alone: the plan carries them typed
(`SchedulerPlan.settings`), and no module but the scheduler's own two reads them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_launch.contracts.knobs import Form, knob

# What Slurm's sbatch and SkyPilot accept in the fields grpo-launch writes for them (`#SBATCH --partition=...` is parsed
# by sbatch, not by a shell: a value must be one token). Slurm: sbatch(1); SkyPilot 0.14: sky/task.py (task names),
# sky/skylet/constants.py (cluster names, clouds), sky/resources.py (accelerators).
SLURM_NAME = Form("a Slurm name (letters, digits, _ . -)", r"[A-Za-z0-9_.-]+")
SLURM_NAMES = Form("Slurm names separated by commas", r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
SLURM_TIME = Form("a Slurm time limit (minutes, minutes:seconds, hours:minutes:seconds, days-hours, "
                  "days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED)",
                  r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE")
SLURM_GRES = Form("Slurm generic resources, name[[:type]:count] separated by commas",
                  r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+){0,2}(,[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+){0,2})*")
SBATCH_OPTION = Form("one sbatch option per item (--name=value)", r"(#SBATCH\s+)?-.+")
SKYPILOT_NAME = Form("a SkyPilot cluster and task name (a letter first, then letters, digits and single or double "
                     "_ . -, ending alphanumeric)", r"[A-Za-z][A-Za-z0-9]*(?:[._-]{1,2}[A-Za-z0-9]+)*")
SKYPILOT_ACCELERATORS = Form("SkyPilot accelerators, NAME[:COUNT]",
                             r"[A-Za-z0-9][A-Za-z0-9_.+-]*(:[A-Za-z0-9_.+-]+){0,2}")
SKYPILOT_CLOUDS = ("aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "kubernetes", "runpod", "vast", "vsphere",
                   "cudo", "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh", "slurm", "hyperbolic",
                   "seeweb", "shadeform", "yotta", "mithril", "verda")


@dataclass(kw_only=True)
class SlurmSettings:
    partition: str | None = knob(None, "#SBATCH --partition (one, or several separated by commas); null: the "
                                       "cluster's default partition.", form=SLURM_NAMES)
    account: str | None = knob(None, "#SBATCH --account to charge.", form=SLURM_NAME)
    qos: str | None = knob(None, "#SBATCH --qos.", form=SLURM_NAME)
    time_limit: str | None = knob(None, "#SBATCH --time, e.g. 2-00:00:00; null: the partition's limit.",
                                  form=SLURM_TIME)
    gpus_per_node: int | None = knob(None, "#SBATCH --gpus-per-node; null: cluster.gpus_per_node on GPUs, none "
                                           "on CPU.", ge=0, le=64)
    gres: str | None = knob(None, "#SBATCH --gres instead of --gpus-per-node, e.g. gpu:h100:8.", form=SLURM_GRES)
    sbatch: list[str] = knob(factory=list, doc="More #SBATCH options, one per item, written as given (sbatch reads "
                                               "them as they are), e.g. --constraint=h100 or --mem=0.",
                             form=SBATCH_OPTION)
    poll_s: float = knob(1.0, "How often `grpo run` reads the job's state from scontrol.", gt=0)


CONTROL_PLANE_TIMEOUT_S = 600.0  # scheduler.control_plane_timeout_s's default (launch.control_plane)
SKY_WORKDIR = "~/sky_workdir"  # where SkyPilot puts the task's workdir (the run directory) on every node
# A run's own cluster: grpo-, the recipe and the run directory's name (readable, cut to fit), then the run's hash.
# SkyPilot takes any length (it fits the name to each cloud's limit itself, keeping a hash of the whole name); this
# keeps `sky status` readable.
SKYPILOT_CLUSTER_LENGTH = 48
SKYPILOT_CLUSTER_PATTERN = "grpo-<recipe>-<run>-<hash>"


@dataclass(kw_only=True)
class SkyPilotSettings:
    cluster_name: str | None = knob(None, f"`sky launch -c NAME`; null: a cluster of the run's own, "
                                          f"{SKYPILOT_CLUSTER_PATTERN} (<hash>: of the run directory's full path). "
                                          "A name you set is yours to keep unique: runs given one name share its "
                                          f"cluster and {SKY_WORKDIR} (one run's checkpoints are the next one's), and "
                                          "`grpo stop` cancels its own job there but leaves the cluster to "
                                          "SkyPilot's autodown.", form=SKYPILOT_NAME)
    cloud: str | None = knob(None, "resources.cloud; null: SkyPilot picks.", choices=SKYPILOT_CLOUDS)
    accelerators: str | None = knob(None, "resources.accelerators; null: <cluster.gpu_type>:<cluster.gpus_per_node> "
                                          "on GPUs, none on CPU.", form=SKYPILOT_ACCELERATORS)
    use_spot: bool = knob(False, "resources.use_spot.")
    disk_size: int | None = knob(None, "resources.disk_size in GB.", ge=1)
    down: bool = knob(True, "Take the cluster down when the run ends: `sky launch --down` (SkyPilot's autodown, once "
                            "no job runs on it), and the run's own cluster is taken down (`sky down`) when `grpo run` "
                            "has followed its job to the end and brought node 0's metrics and logs here (unless "
                            "idle_minutes_to_autostop says to wait), and by `grpo stop`. Its disks go with it: "
                            "checkpoints outlive it only on storage mounted from elsewhere. false: the cluster is "
                            "kept, billing until `sky down` (or stopped after idle_minutes_to_autostop).")
    idle_minutes_to_autostop: int | None = knob(None, "`sky launch --idle-minutes-to-autostop`: minutes without a job "
                                                      "before SkyPilot takes the cluster down (down: true; `grpo run` "
                                                      "leaves it up that long) or stops it (down: false); null: down "
                                                      "at once (SkyPilot's autodown waits 1 minute), a kept cluster "
                                                      "never stopped.", ge=0)


def skypilot_name_part(text: str) -> str:
    """`text` as a part of a SkyPilot cluster name: lowercase letters and digits, single dashes between."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def skypilot_cluster(recipe: str, run_dir: Path) -> str:
    """The run's own SkyPilot cluster (SKYPILOT_CLUSTER_PATTERN): told from every other run's by the run directory's
    hash, however alike their names (a sweep's share their first 20-odd characters)."""
    room = SKYPILOT_CLUSTER_LENGTH - len("grpo-") - 1 - RUN_HASH_LENGTH
    readable = skypilot_name_part(f"{recipe}-{run_dir.resolve().name}")[:room].strip("-")
    return f"grpo-{readable}-{run_hash(run_dir)}"


def skypilot_cluster_pattern(recipe: str) -> str:
    """What `grpo plan` shows for the cluster of a run whose directory is not known yet."""
    return SKYPILOT_CLUSTER_PATTERN.replace("<recipe>", skypilot_name_part(recipe))


@dataclass(kw_only=True)
class HfJobsFlavors:
    trainer: str | None = knob(None, "Flavor of a Job running grpo-launch's node supervisor (the trainer, and the "
                                     "proxy beside it); null: the smallest h200 flavor with the GPUs its node uses "
                                     "(cpu-upgrade on CPU).")
    vllm: str | None = knob(None, "Flavor of a Job serving one vLLM engine; null: the smallest h200 flavor with "
                                  "vllm.tensor_parallel_size GPUs (cpu-upgrade on CPU).")


@dataclass(kw_only=True)
class HfJobsImages:
    trainer: str | None = knob(None, "Image of a Job running the node supervisor; null: vLLM's official image (torch, "
                                     "transformers and vLLM inside), grpo-launch installed at the Job's start "
                                     "(install_wheel).")
    vllm: str | None = knob(None, "Image of a vLLM Job; null: vllm/vllm-openai at the vLLM version the plan's "
                                  "`vllm serve` arguments were checked against.")


DEFAULT_BUCKET_NAME = "grpo-runs"  # the bucket <namespace>/grpo-runs, where scheduler.hf_jobs.bucket is null


@dataclass(kw_only=True)
class HfJobsSettings:
    namespace: str | None = knob(None, "User or organization the Jobs run (and are billed) in; null: the account "
                                       "of your token (`hf auth whoami`).")
    bucket: str | None = knob(None, "Storage Bucket holding the run directories, as namespace/name; null: "
                                    f"<namespace>/{DEFAULT_BUCKET_NAME}. Created when missing.")
    mount_path: str = knob("/grpo", "Absolute path at which every Job mounts the run's folder of the bucket (the "
                                    "run directory): the trainer read-write, the vLLM Jobs read-only, so adapter "
                                    "paths resolve alike.")
    flavor: HfJobsFlavors = knob(factory=HfJobsFlavors, doc="Hardware flavor of each kind of Job.")
    image: HfJobsImages = knob(factory=HfJobsImages, doc="Docker image of each kind of Job.")
    install_wheel: bool = knob(True, "Upload a wheel of this grpo-launch with the run directory and pip-install it "
                                     "when a supervisor Job starts (false: image.trainer has grpo-launch).")
    timeout: str = knob("6h", "Each Job's longest life, as `hf jobs run --timeout` takes it (seconds, or a number "
                              "with s, m, h or d): a Job nobody cancelled stops billing then.")
    secrets: list[str] = knob(factory=lambda: ["HF_TOKEN"],
                              doc="Names of the secrets every Job gets, their values read from your environment at "
                                  "submit (HF_TOKEN also from `hf auth login`); never a value.")
    poll_s: float = knob(5.0, "How often `grpo run` reads each Job's stage and polls a vLLM Job's /health.", gt=0)


@dataclass(frozen=True)
class Declared:
    name: str                       # scheduler.kind
    summary: str                    # who starts the processes, in a few words
    key: str | None = None          # its settings' section under scheduler.
    settings: type | None = None    # the section's dataclass
    doc: str = ""                   # the section's one-line doc
    logs_elsewhere: str | None = None  # where a run's metrics and logs are written when not into its run directory
                                       # here (its launcher's `logs` copies them here)


DECLARED: tuple[Declared, ...] = (
    Declared("local", "`grpo run` itself: every node from one command when all are this machine, else `grpo run "
                      "--node-rank K` on each"),
    Declared("slurm", "a batch job, job.sbatch", "slurm", SlurmSettings, "scheduler=slurm: the batch job's resources."),
    Declared("skypilot", "a SkyPilot task, task.yaml", "skypilot", SkyPilotSettings,
             "scheduler=skypilot: the task's resources.", logs_elsewhere="on node 0, in its copy of the run directory"),
    Declared("hf-jobs", "Hugging Face Jobs, one per machine, sharing a Storage Bucket; hf-jobs.sh", "hf_jobs",
             HfJobsSettings, "scheduler=hf-jobs: the Jobs, their bucket and their flavors.",
             logs_elsewhere="in the run's folder of the Storage Bucket (brought back here when the run ends)"),
)


# scheduler=hf-jobs names a run's Jobs, its network group and its folder of the bucket after the recipe and the run
# directory: lowercase letters, digits and '-', the network group's 46 characters at most (huggingface_hub's run_job).
GROUP_LENGTH = 46
RECIPE_LENGTH = 24


def job_name_part(text: str) -> str:
    """`text` as a part of a Job's name: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]", "-", text.lower())


RUN_HASH_LENGTH = 8


def run_hash(run_dir: Path) -> str:
    """What tells one run directory from every other: hex digits of a hash of its full path (runs of a sweep share
    their names' first 20-odd characters, and names are cut to fit)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:RUN_HASH_LENGTH]


def run_label(run_dir: Path) -> str:
    """The label a run puts on every job it submits (a Slurm job's comment), by which they are found again."""
    return f"grpo-run-{run_hash(run_dir)}"


def run_group(recipe: str, run_dir: Path) -> str:
    """The run's network group, the prefix of its Jobs' names and its folder in the bucket: the recipe and the run
    directory's name, readable, then the run's hash (hf-jobs.sh derives the same with `tr` and sha256sum)."""
    readable = job_name_part(f"{job_name_part(recipe)[:RECIPE_LENGTH]}-{run_dir.name}")
    return f"{readable[:GROUP_LENGTH - RUN_HASH_LENGTH - 1]}-{run_hash(run_dir)}"


def declared(name: str) -> Declared:
    return next(d for d in DECLARED if d.name == name)  # the schema's choices hold exactly these names


SchedulerSettings = SlurmSettings | SkyPilotSettings | HfJobsSettings  # one scheduler's own section, typed


def settings_type(name: str) -> type | None:
    """The type of scheduler `name`'s settings; None for a scheduler without any."""
    return declared(name).settings


def settings_in(scheduler: object, name: str) -> SchedulerSettings | None:
    """Scheduler `name`'s own settings from a composed recipe's `scheduler` section; None for a scheduler without
    settings."""
    d = declared(name)
    return None if d.key is None else getattr(scheduler, d.key)
