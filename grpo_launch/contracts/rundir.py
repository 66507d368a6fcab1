"""The run directory: every file's name, and for each file grpo-launch reads back its typed record, its one writer
and its one reader. Nothing outside this module reads these files (the architecture test refuses it), so a change
of a file's schema, and the reading of what an older release wrote, has one place.

    plan.json          Plan (contracts.plan), versioned: a plan of an older release is brought up to this one's
    config.yaml        ComposedConfig: the composed recipe, every key
    overrides.yaml     Overrides: what `--resume` composes again
    submitted.json     Submitted: what `grpo run` started, for `grpo stop`
    run-node<K>.lock   RunLock: the one live `grpo run` of node K
    metrics.jsonl      Metrics: TRL's log records and the trainer's measure records, a JSON line each
    logs/trainer-rank<R>.timeline.jsonl   a rank's phase timeline, a line a step
    logs/trainer-rank<R>.failure.json     TrainerFailure: a trainer rank's exception
    logs/node-<K>.failure.json            NodeFailure: a node's first failure, for its job
    <output_dir>/checkpoint-<N>/grpo-checkpoint.json   CheckpointRecord: the checkpoint is whole, resume from it

The other files are written for others to read (deepspeed.json, accelerate.yaml, launch.sh, the job files: documents
of the plan, written by materialize; the processes' logs).

A record whose schema changes carries a `version` (plan.json's is `PLAN_VERSION`; the others have not changed, and
one without a version is version 1), and its reader brings what an older release wrote up to this release's schema:
a run directory written before still reports, compares, stops and resumes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.contracts import measures
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.plan import PLAN_VERSION, READY_TIMEOUT_S, Plan, Role
from grpo_launch.contracts.schedulers import declared
from grpo_launch.contracts.trl_fields import trainer_facts
from grpo_launch.contracts.typed import build
from grpo_launch.errors import UserError, yaml_problem

CONFIG_FILE = "config.yaml"        # the composed config, every key
OVERRIDES_FILE = "overrides.yaml"  # recipe, command-line overrides, recipe directories (what --resume re-composes)
PLAN_FILE = "plan.json"            # the plan: what the supervisor and the trainer entrypoint read
LOGS_DIR = "logs"                  # one log per process
REWARDS_DIR = "rewards"            # reward functions given as files, copied so the run is self-contained
METRICS_FILE = "metrics.jsonl"     # the trainer appends one JSON record per logged step
CURVES_FILE = "reward_curve.png"   # reward, loss, KL and completion length against step
TIMELINE_FILE = "phase_timeline.png"  # what each trainer rank and vLLM engine did over time (grpo report)
EVAL_FILE = "eval_curve.png"       # the held-out reward against step (data.eval)
DEEPSPEED_FILE = "deepspeed.json"  # DeepSpeed's config, when ZeRO is on
ACCELERATE_FILE = "accelerate.yaml"  # accelerate's config file
LAUNCH_FILE = "launch.sh"          # replays every process by hand, without grpo-launch
SLURM_JOB_FILE = "job.sbatch"      # scheduler=slurm: the batch job
SKYPILOT_TASK_FILE = "task.yaml"   # scheduler=skypilot: the SkyPilot task
HF_JOBS_FILE = "hf-jobs.sh"        # scheduler=hf-jobs: the Jobs, submitted by hand with `hf jobs run`
WHEELS_DIR = "dist"                # scheduler=hf-jobs: the wheel of grpo-launch a Job installs at its start
SUBMITTED_FILE = "submitted.json"  # what `grpo run` started (its job IDs, its pid): what `grpo stop` ends
RUN_LOCK = "run-node{node}.lock"   # the `grpo run` that runs node K now (RunLock)
JOB_LOG = "job.log"                # under logs/: the batch script's own output
NODE_FAILURES = "node-{node}.failure.json"  # under logs/: a node's first failure (NodeFailure)
FIRST_FAILURE = "first-failure"    # under logs/: the node that failed first (claimed by creating it)
PREPARE_LOCK = ".prepare.lock"    # nodes sharing a run directory take turns at the prepare steps
WEIGHT_SYNC_DIR = "weight-sync"   # weights the trainer writes for vLLM to reload (CPU runs), rewritten every step
TRAINER_FAILURE = "trainer-rank{rank}.failure.json"  # under logs/: a trainer rank's exception, phase and step
WATCHDOG_LOG = "watchdog.log"      # under logs/: what the watchdog did when the supervisor died without stopping
CHECKPOINTS_DIR = "checkpoints"   # the trainer's output_dir unless trainer.output_dir says otherwise
FINAL_MODEL_DIR = "final"         # under the output_dir: the trained model (or adapter) once training ends
TIMELINE_SEGMENTS = "trainer-rank{rank}.timeline.jsonl"  # under logs/: what a trainer rank did when, a line a step

NOT_A_RUN_DIR_HINT = "give a directory `grpo run` printed (runs/<recipe>/<timestamp>)"


def _restore_hint(name: str) -> str:
    return f"restore {name} as `grpo run` wrote it"


def _atomic_write(path: Path, text: str) -> None:
    """`text` into `path` under a temporary name renamed into place: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


# -- plan.json ---------------------------------------------------------------------------------------------------

def plan_text(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2) + "\n"


def read_plan(run_dir: Path, *, key: str = "RUN_DIR") -> Plan:
    """plan.json of a run directory, typed; one an older release wrote is brought up to this release's schema. A
    `UserError` (naming `key`) when there is none, or it is not one grpo-launch wrote."""
    file = run_dir / PLAN_FILE
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"{run_dir} is not a grpo-launch run directory (no {PLAN_FILE})", key=key,
                        hint=NOT_A_RUN_DIR_HINT) from None
    except (OSError, ValueError) as e:
        raise UserError(f"{file} cannot be read: {e}", key=key, hint=_restore_hint(PLAN_FILE)) from None
    version = data.get("version", 1) if isinstance(data, dict) else None
    if not isinstance(version, int) or version > PLAN_VERSION:
        raise UserError(f"{file} is plan.json version {version}; this grpo-launch reads versions up to "
                        f"{PLAN_VERSION}", key=key, hint="read it with the grpo-launch release that wrote it")
    if version == 1:
        data = _plan_v1_to_v2(data, _scheduler_section(run_dir))
    return Plan.from_json(data)


def same_plan(run_dir: Path, plan: Plan) -> bool:
    """Whether `run_dir` already holds this very plan (another node of the run wrote it)."""
    try:
        return (run_dir / PLAN_FILE).read_text() == plan_text(plan)
    except OSError:
        return False


# The prediction's phases before plan.json version 2 had names of their own.
_V1_PHASES = {"generation": Phase.GENERATE, "weight_sync": Phase.SYNC, "training": Phase.TRAIN, "waiting": Phase.WAIT}


def _plan_v1_to_v2(data: dict[str, Any], scheduler: Mapping[str, Any] | None) -> dict[str, Any]:
    """A version-1 plan.json (releases up to 8b4bc63) as version 2: the trainer's facts resolved from its TRL
    arguments and nodes from its processes, the scheduler's settings from the run's config.yaml, the prediction's
    phases by their one name, and the default readiness bound written out."""
    data = copy.deepcopy(data)
    data["version"] = 2
    data["trainer_facts"] = dataclasses.asdict(trainer_facts(data["trainer_args"], data["trainer_class"]))
    data["trainer_nodes"] = sorted({p["node"] for p in data["processes"] if p["role"] == Role.TRAINER})
    data["marks_checkpoints"] = False
    jobs = (data.get("scheduler") or {}).get("jobs") or []
    for spec in [*data["processes"], *jobs]:
        if spec.get("ready_timeout_s") is None:
            spec["ready_timeout_s"] = READY_TIMEOUT_S
    for phase in (data.get("prediction") or {}).get("phases") or []:
        phase["name"] = _V1_PHASES[phase["name"]]
    if data.get("scheduler"):
        section = declared(data["scheduler"]["kind"]).key
        data["scheduler"]["settings"] = (scheduler or {}).get(section) if section else None
    return data


# -- config.yaml -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComposedConfig:
    """The composed recipe, every key, as the run used it: `compose.schema.Config` as a mapping (the planner's
    schema, which contracts do not import), with the recipe's name and the group options chosen."""

    recipe: str
    choices: Mapping[str, str]
    values: Mapping[str, Any]                  # every section of the config, by key

    def document(self) -> dict[str, Any]:
        """The whole file as one mapping: the recipe, the choices and every section."""
        return {"recipe": self.recipe, "choices": dict(self.choices), **self.values}


def config_text(config: ComposedConfig) -> str:
    import yaml

    return f"# recipe {config.recipe}, as composed by grpo-launch\n" + yaml.safe_dump(config.document(),
                                                                                      sort_keys=False)


def read_config(run_dir: Path, *, key: str = "RUN_DIR") -> ComposedConfig:
    """config.yaml of `run_dir`; a `UserError` naming `key` when it is missing or not the file `grpo run` writes."""
    doc = _yaml_mapping(run_dir / CONFIG_FILE, ("recipe", "choices"), key)
    if not isinstance(doc["choices"], dict):
        raise _not_written(run_dir / CONFIG_FILE, ("recipe", "choices"), key)
    values = {k: v for k, v in doc.items() if k not in ("recipe", "choices")}
    return ComposedConfig(str(doc["recipe"]), doc["choices"], values)


def written_at(run_dir: Path) -> float | None:
    """When the run directory was written (Unix time): its config.yaml's; None where it has none."""
    try:
        return (run_dir / CONFIG_FILE).stat().st_mtime
    except OSError:
        return None


def _scheduler_section(run_dir: Path) -> Mapping[str, Any] | None:
    """config.yaml's `scheduler` section, for a plan written before the plan carried its scheduler's settings."""
    try:
        section = read_config(run_dir).values.get("scheduler")
    except UserError:
        return None
    return section if isinstance(section, Mapping) else None


def _yaml_mapping(path: Path, needed: tuple[str, ...], key: str) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{path.parent} is not a grpo-launch run directory (no {path.name})", key=key,
                        hint=NOT_A_RUN_DIR_HINT) from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise UserError(f"{path} cannot be read: {yaml_problem(e)}", key=key, hint=_restore_hint(path.name)) from None
    if not isinstance(doc, dict) or any(k not in doc for k in needed):
        raise _not_written(path, needed, key)
    return doc


def _not_written(path: Path, needed: tuple[str, ...], key: str) -> UserError:
    return UserError(f"{path} is not the {path.name} `grpo run` writes (a mapping with {', '.join(needed)})",
                     key=key, hint=_restore_hint(path.name))


# -- overrides.yaml ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Overrides:
    """What composed the run: the recipe, the command line's overrides and the recipe directories searched."""

    recipe: str
    overrides: tuple[str, ...]
    recipes_dirs: tuple[str, ...]              # absolute


def overrides_text(record: Overrides) -> str:
    import yaml

    return yaml.safe_dump({"recipe": record.recipe, "overrides": list(record.overrides),
                           "recipes_dirs": list(record.recipes_dirs)}, sort_keys=False)


def read_overrides(run_dir: Path, *, key: str = "RUN_DIR", missing_ok: bool = False) -> Overrides | None:
    """overrides.yaml of `run_dir`; a `UserError` naming `key` when it is not the file `grpo run` writes, or is
    missing (None then, with `missing_ok`)."""
    if missing_ok and not (run_dir / OVERRIDES_FILE).is_file():
        return None
    needed = ("recipe", "overrides", "recipes_dirs")
    doc = _yaml_mapping(run_dir / OVERRIDES_FILE, needed, key)
    if not all(isinstance(doc[k], list) for k in ("overrides", "recipes_dirs")):
        raise _not_written(run_dir / OVERRIDES_FILE, needed, key)
    return Overrides(str(doc["recipe"]), tuple(map(str, doc["overrides"])), tuple(map(str, doc["recipes_dirs"])))


# -- submitted.json ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Submitted:
    """What `grpo run` started, written as soon as it is, so `grpo stop RUN_DIR` finds it from another terminal."""

    scheduler: str                             # contracts.schedulers' name
    ids: tuple[str, ...]                       # its job IDs (local: the pid of `grpo run`; skypilot: the cluster)
    time: float
    host: str | None = None                    # local: the machine `grpo run` runs on
    started: int | None = None                 # local: when its process started (`process_started`): with the pid,
                                               # that one process (a pid is reused once its process has gone)
    nodes: tuple[int, ...] = ()                # local: the nodes it supervises
    namespace: str | None = None               # hf-jobs: where the Jobs run
    bucket: str | None = None                  # hf-jobs: the Storage Bucket holding the run directory
    folder: str | None = None                  # hf-jobs: the run's folder in it


def process_started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat's 22nd field); None when there is no
    such process, or it has ended (a zombie its parent has not reaped yet)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def write_submitted(run_dir: Path, record: Submitted) -> None:
    _atomic_write(run_dir / SUBMITTED_FILE, json.dumps(dataclasses.asdict(record), indent=1) + "\n")


def read_submitted(run_dir: Path) -> Submitted:
    try:
        return build(Submitted, json.loads((run_dir / SUBMITTED_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{run_dir} holds no record of a started run ({SUBMITTED_FILE})", key="RUN_DIR",
                        hint="the run was never started from this run directory (a dry run, or nothing could be "
                             "submitted here)") from None


# -- the run lock: one live `grpo run` per node of a run directory ----------------------------------------------

@dataclass(frozen=True)
class RunLock:
    """Who runs node K of a run directory: the `grpo run` holding `run-node<K>.lock` (its host, pid and when its
    process started, so a pid reused by another process is not taken for it)."""

    node: int
    host: str
    pid: int
    started: int | None
    time: float

    @property
    def holder(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        return f"`grpo run` pid {self.pid} on {self.host}, since {since}"

    def live(self, host: str) -> bool:
        """Whether its holder still runs, as far as this machine (`host`) can tell: one on another machine is taken
        as running."""
        return self.host != host or process_started(self.pid) == self.started


def _lock_path(run_dir: Path, node: int) -> Path:
    return run_dir / RUN_LOCK.format(node=node)


def take_run_lock(run_dir: Path, nodes: Collection[int], pid: int, host: str) -> RunLock | None:
    """Lock `nodes` of `run_dir` for the `grpo run` of `pid` on `host`: None once every lock is its own, else the
    live holder of one (nothing is then held: the locks taken are given back). A lock whose holder has gone (a
    `grpo run` killed) is taken over."""
    mine = RunLock(0, host, pid, process_started(pid), time.time())
    taken: list[int] = []
    for node in nodes:
        lock = dataclasses.replace(mine, node=node)
        path = _lock_path(run_dir, node)
        text = json.dumps(dataclasses.asdict(lock)) + "\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = read_run_lock(run_dir, node)
            if held is not None and held.live(host):
                release_run_lock(run_dir, taken, pid, host)
                return held
            _atomic_write(path, text)  # its holder has gone
            if read_run_lock(run_dir, node) != lock:  # another run took it over at the same moment
                release_run_lock(run_dir, taken, pid, host)
                return read_run_lock(run_dir, node)
        else:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        taken.append(node)
    return None


def read_run_lock(run_dir: Path, node: int) -> RunLock | None:
    try:
        return build(RunLock, json.loads(_lock_path(run_dir, node).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def release_run_lock(run_dir: Path, nodes: Collection[int], pid: int, host: str) -> None:
    """Give back the locks of `nodes` that this `grpo run` still holds."""
    for node in nodes:
        held = read_run_lock(run_dir, node)
        if held is not None and (held.pid, held.host) == (pid, host):
            _lock_path(run_dir, node).unlink(missing_ok=True)


# -- failure records ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeFailure:
    """What a node whose processes failed on their own records for its job: written by the node's supervisor
    (`launch.node`), read by `grpo run` following the job (`launch.follow`) and by the Slurm job's script (`python -m
    grpo_launch.launch --first-failure`), so a job spanning nodes passes on the code of the node that failed first,
    not of a node it stopped."""

    node: int
    code: int                    # the first failure's exit code, shell-style
    time_ns: int                 # when the node recorded it (the first of all nodes' is the job's cause)
    process: str                 # the process that failed first on this node
    reason: str                  # what happened to it, in words


def write_node_failure(run_dir: Path, failure: NodeFailure) -> None:
    path = run_dir / LOGS_DIR / NODE_FAILURES.format(node=failure.node)
    path.write_text(json.dumps(dataclasses.asdict(failure)) + "\n")


def claim_first_failure(run_dir: Path, node: int) -> bool:
    """Node `node` failed (its first failure, now, before it stops anything): whether it is the job's first. The
    first node to create the claim is, by the run directory's own order of events (the nodes' clocks may differ,
    and each node writes its record only once it has stopped its processes)."""
    (run_dir / LOGS_DIR).mkdir(exist_ok=True)
    try:
        fd = os.open(run_dir / LOGS_DIR / FIRST_FAILURE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{node}\n")
    return True


def read_node_failures(run_dir: Path) -> list[NodeFailure]:
    """Every node's record, the first failure first (the node that claimed it, then by time); a record that cannot
    be read (a node killed while writing it) is left out."""
    found = []
    for path in (run_dir / LOGS_DIR).glob(NODE_FAILURES.format(node="*")):
        try:
            found.append(build(NodeFailure, json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    try:
        first = int((run_dir / LOGS_DIR / FIRST_FAILURE).read_text())
    except (OSError, ValueError):
        first = None
    return sorted(found, key=lambda f: (f.node != first, f.time_ns))


def clear_node_failures(run_dir: Path, nodes: Collection[int]) -> None:
    """Forget `nodes`' records, and a claim of the first failure with them: an earlier run's, when these nodes start
    again (a resumed run read them as its own, and a finished run as failed)."""
    logs = run_dir / LOGS_DIR
    try:
        claimed = int((logs / FIRST_FAILURE).read_text())
    except (OSError, ValueError):
        claimed = None
    for node in nodes:
        (logs / NODE_FAILURES.format(node=node)).unlink(missing_ok=True)
    if claimed is None or claimed in nodes:
        (logs / FIRST_FAILURE).unlink(missing_ok=True)


@dataclass(frozen=True)
class TrainerFailure:
    """What a trainer rank said as it failed (`trainer.progress`): where it was, the exception, its traceback."""

    rank: int
    phase: str                   # where the rank was: "training", "loading the dataset", ...
    step: int | None             # the step it was computing, from 1
    time: float
    error: str                   # "ValueError: ..."
    traceback: str

    def path(self, run_dir: Path) -> Path:
        return _trainer_failure_path(run_dir, self.rank)


def _trainer_failure_path(run_dir: Path, rank: int) -> Path:
    return run_dir / LOGS_DIR / TRAINER_FAILURE.format(rank=rank)


def write_trainer_failure(run_dir: Path, failure: TrainerFailure) -> None:
    path = failure.path(run_dir)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(failure), indent=1) + "\n")


def read_trainer_failure(run_dir: Path, rank: int) -> TrainerFailure | None:
    """Rank `rank`'s record; None when it left none (or one that cannot be read)."""
    try:
        return build(TrainerFailure, json.loads(_trainer_failure_path(run_dir, rank).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_trainer_failure(run_dir: Path, rank: int) -> None:
    """Forget rank `rank`'s record (a resumed run's old ones would be read as this run's)."""
    _trainer_failure_path(run_dir, rank).unlink(missing_ok=True)


def failure_records(run_dir: Path) -> tuple[str, ...]:
    """The names of every failure record a run left (a trainer rank's, a node's), sorted."""
    logs = run_dir / LOGS_DIR
    patterns = (TRAINER_FAILURE.format(rank="*"), NODE_FAILURES.format(node="*"))
    return tuple(sorted(p.name for pattern in patterns for p in logs.glob(pattern))) if logs.is_dir() else ()


# -- checkpoints ------------------------------------------------------------------------------------------------

CHECKPOINT = re.compile(r"checkpoint-(\d+)")   # transformers' name for the checkpoint of step N
CHECKPOINT_MARKER = "grpo-checkpoint.json"     # in a checkpoint: every rank's files written, durable and listed
SET_ASIDE_MARKER = "grpo-checkpoint.set-aside.json"  # a checkpoint that could not be loaded, and why
TRAINER_STATE = "trainer_state.json"           # transformers writes it last into each of its checkpoints


@dataclass(frozen=True)
class CheckpointRecord:
    """grpo-launch's marker of a checkpoint: written by trainer rank 0 once every rank's files were written and
    synced to disk (a barrier between), with each file's size, so a checkpoint cut short (a crash, a full disk, a
    rank killed while saving) is known for one and never resumed from."""

    step: int
    files: dict[str, int]                      # path within the checkpoint -> size in bytes
    time: float


def checkpoint_dir(output: Path, step: int) -> Path:
    """The checkpoint of step `step` in a trainer's output directory, by transformers' name."""
    return output / f"checkpoint-{step}"


def checkpoints_of(run_dir: Path, output_dir: str) -> Path:
    """Where a run's checkpoints are: its TRL output_dir, relative to the run directory unless absolute."""
    return run_dir / Path(output_dir).expanduser()


def sync_checkpoint(checkpoint: Path) -> None:
    """Every file under `checkpoint`, and each of its directories, synced to disk (each rank, for what it wrote)."""
    for folder, _, names in os.walk(checkpoint):
        for name in names:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_checkpoint(checkpoint: Path, step: int) -> None:
    """The marker of a checkpoint whose files are all on disk (rank 0, after every rank synced its own and met the
    others at a barrier): written under a temporary name, synced, renamed into place, the directory synced."""
    files = {str(p.relative_to(checkpoint)): p.stat().st_size for p in sorted(checkpoint.rglob("*"))
             if p.is_file() and p.name not in (CHECKPOINT_MARKER, SET_ASIDE_MARKER)}
    tmp = checkpoint / f".{CHECKPOINT_MARKER}.tmp"
    tmp.write_text(json.dumps(dataclasses.asdict(CheckpointRecord(step, files, time.time()))) + "\n")
    _fsync(tmp)
    tmp.replace(checkpoint / CHECKPOINT_MARKER)
    _fsync(checkpoint)


def resumable_checkpoints(output: Path, *, marked: bool = True) -> list[Path]:
    """The checkpoints a run may resume from, newest first: each with its marker, and every file the marker lists
    there at its size. `marked=False`: a run of a release before the marker (`Plan.marks_checkpoints`), whose
    checkpoints are taken as that release took them, with transformers' trainer_state.json."""
    found = sorted(((int(m.group(1)), p) for p in (output.iterdir() if output.is_dir() else ())
                    if p.is_dir() and (m := CHECKPOINT.fullmatch(p.name))), reverse=True)
    if not marked:
        return [p for _, p in found if (p / TRAINER_STATE).is_file() and not (p / SET_ASIDE_MARKER).exists()]
    return [p for step, p in found if _whole(p, step)]


def _whole(checkpoint: Path, step: int) -> bool:
    try:
        record = build(CheckpointRecord, json.loads((checkpoint / CHECKPOINT_MARKER).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        return record.step == step and all((checkpoint / name).stat().st_size == size
                                           for name, size in record.files.items())
    except OSError:
        return False


def set_checkpoint_aside(checkpoint: Path, why: str) -> None:
    """A checkpoint that failed to load is no longer resumed from (the one before it is, next time); its files
    stay, and why it was set aside is written beside them."""
    try:
        (checkpoint / CHECKPOINT_MARKER).replace(checkpoint / SET_ASIDE_MARKER)
    except FileNotFoundError:  # another rank set it aside first
        pass
    with (checkpoint / SET_ASIDE_MARKER).open("a") as f:
        f.write(json.dumps({"why": why, "time": time.time()}) + "\n")


# -- metrics.jsonl and the timelines: JSON lines that grow while the run goes -----------------------------------

class LogTail:
    """The lines appended to a growing file of the run directory since the last read; a line still being written
    waits for the next."""

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        self.path = path
        self.offset = path.stat().st_size if from_end and path.exists() else 0

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                complete = f.read().rpartition(b"\n")[0]
        except FileNotFoundError:
            return []
        if not complete:
            return []
        self.offset += len(complete) + 1
        return complete.decode(errors="replace").splitlines()


def _records(lines: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The records of whole lines, and how many lines were not one (blank ones aside): the one place a line of
    metrics.jsonl or of a timeline is parsed. A record is a JSON object with its step; anything else (a line cut by
    a full disk or a crash, then continued by the next append) is skipped and counted, never raised."""
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            bad += 1
    return records, bad


def _append(path: Path, record: Mapping[str, Any]) -> None:
    """One record as one line, in one write. A last line left unterminated (the disk filled, the node died) is ended
    first, so the record is a line of its own, and the cut one stays one bad line."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)


def append_metrics(run_dir: Path, record: Mapping[str, Any]) -> None:
    """One record onto metrics.jsonl: TRL's log records, and each step's measure record (`contracts.measures`)."""
    _append(run_dir / METRICS_FILE, record)


class MetricsTail(LogTail):
    """The records appended to metrics.jsonl since the last read (the console's training view, the reward curve
    waiting for the closing record)."""

    def __init__(self, run_dir: Path, *, from_end: bool = False) -> None:
        super().__init__(run_dir / METRICS_FILE, from_end=from_end)
        self.bad_lines = 0                     # lines read that were not a record

    def new_records(self) -> list[dict[str, Any]]:
        records, bad = _records(self.lines())
        self.bad_lines += bad
        return records


@dataclass(frozen=True)
class Metrics:
    """metrics.jsonl as it is now, a record per step of each kind (a resumed run logs some steps again: the later
    record wins)."""

    training: list[dict[str, Any]] = field(default_factory=list)  # TRL's step records (and the CPU async loop's)
    measures: list[dict[str, Any]] = field(default_factory=list)  # the trainer's measure records
    evals: list[dict[str, Any]] = field(default_factory=list)     # TRL's evaluation records
    closed: bool = False                                          # the trainer logged its closing record
    bad_lines: int = 0                                            # lines that were not a record, skipped

    @property
    def empty(self) -> bool:
        return not (self.training or self.measures or self.evals or self.closed)


def read_metrics(run_dir: Path) -> Metrics:
    records, bad = _records(LogTail(run_dir / METRICS_FILE).lines())
    return Metrics(training=_latest_per_step([r for r in records if measures.is_training(r)]),
                   measures=_latest_per_step([r for r in records if measures.is_measure(r)]),
                   evals=_latest_per_step([r for r in records if measures.EVAL_REWARD in r]),
                   closed=any(measures.is_closing(r) for r in records), bad_lines=bad)


def _latest_per_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step = {r["step"]: r for r in records}
    return [by_step[s] for s in sorted(by_step)]


def append_timeline(run_dir: Path, rank: int, step: int, segments: list[list]) -> None:
    """What rank `rank` did in step `step`: [phase, start, end] segments (`contracts.measures`)."""
    path = run_dir / LOGS_DIR / TIMELINE_SEGMENTS.format(rank=rank)
    path.parent.mkdir(exist_ok=True)
    _append(path, {"step": step, "segments": segments})


def read_timelines(run_dir: Path) -> dict[int, dict[int, list[list]]]:
    """rank -> step -> what the rank did when ([phase, start, end]), from each rank's timeline."""
    out: dict[int, dict[int, list[list]]] = {}
    prefix, _, suffix = TIMELINE_SEGMENTS.partition("{rank}")
    for path in sorted((run_dir / LOGS_DIR).glob(TIMELINE_SEGMENTS.format(rank="*"))):
        rank = int(path.name.removeprefix(prefix).removesuffix(suffix))
        out[rank] = {r["step"]: r["segments"] for r in _records(LogTail(path).lines())[0] if "segments" in r}
    return out
