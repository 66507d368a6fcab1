"""The run directory: every file's name, and for each file grpo-launch reads back its typed record, its one writer
and its one reader. Nothing outside this module reads these files (the architecture test refuses it), so a change
of a file's schema, and the reading of what an older release wrote, has one place.

    plan.json          Plan (contracts.plan), versioned: a plan of an older release is brought up to this one's
    config.yaml        ComposedConfig: the composed recipe, every key
    overrides.yaml     Overrides: what `--resume` composes again
    submitted.json     Submitted: what `grpo run` started, for `grpo stop`
    metrics.jsonl      Metrics: TRL's log records and the trainer's measure records, a JSON line each
    logs/trainer-rank<R>.timeline.jsonl   a rank's phase timeline, a line a step
    logs/trainer-rank<R>.failure.json     TrainerFailure: a trainer rank's exception
    logs/node-<K>.failure.json            NodeFailure: a node's first failure, for its job

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
from collections.abc import Mapping
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
JOB_LOG = "job.log"                # under logs/: the batch script's own output
NODE_FAILURES = "node-{node}.failure.json"  # under logs/: a node's first failure (NodeFailure)
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
    nodes: tuple[int, ...] = ()                # local: the nodes it supervises
    namespace: str | None = None               # hf-jobs: where the Jobs run
    bucket: str | None = None                  # hf-jobs: the Storage Bucket holding the run directory
    folder: str | None = None                  # hf-jobs: the run's folder in it


def write_submitted(run_dir: Path, record: Submitted) -> None:
    _atomic_write(run_dir / SUBMITTED_FILE, json.dumps(dataclasses.asdict(record), indent=1) + "\n")


def read_submitted(run_dir: Path) -> Submitted:
    try:
        return build(Submitted, json.loads((run_dir / SUBMITTED_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{run_dir} holds no record of a started run ({SUBMITTED_FILE})", key="RUN_DIR",
                        hint="the run was never started from this run directory (a dry run, or nothing could be "
                             "submitted here)") from None


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


def read_node_failures(run_dir: Path) -> list[NodeFailure]:
    """Every node's record, the first failure first; a record that cannot be read (a node killed while writing it)
    is left out."""
    found = []
    for path in (run_dir / LOGS_DIR).glob(NODE_FAILURES.format(node="*")):
        try:
            found.append(build(NodeFailure, json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda f: f.time_ns)


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


def _records(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON records of whole lines (blank ones skipped): the one place a line of metrics.jsonl or of a timeline
    is parsed."""
    return [json.loads(line) for line in lines if line.strip()]


def _append(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def append_metrics(run_dir: Path, record: Mapping[str, Any]) -> None:
    """One record onto metrics.jsonl: TRL's log records, and each step's measure record (`contracts.measures`)."""
    _append(run_dir / METRICS_FILE, record)


class MetricsTail(LogTail):
    """The records appended to metrics.jsonl since the last read (the console's training view, the reward curve
    waiting for the closing record)."""

    def __init__(self, run_dir: Path, *, from_end: bool = False) -> None:
        super().__init__(run_dir / METRICS_FILE, from_end=from_end)

    def new_records(self) -> list[dict[str, Any]]:
        return _records(self.lines())


@dataclass(frozen=True)
class Metrics:
    """metrics.jsonl as it is now, a record per step of each kind (a resumed run logs some steps again: the later
    record wins)."""

    training: list[dict[str, Any]] = field(default_factory=list)  # TRL's step records (and the CPU async loop's)
    measures: list[dict[str, Any]] = field(default_factory=list)  # the trainer's measure records
    evals: list[dict[str, Any]] = field(default_factory=list)     # TRL's evaluation records
    closed: bool = False                                          # the trainer logged its closing record

    @property
    def empty(self) -> bool:
        return not (self.training or self.measures or self.evals or self.closed)


def read_metrics(run_dir: Path) -> Metrics:
    records = _records(LogTail(run_dir / METRICS_FILE).lines())
    return Metrics(training=_latest_per_step([r for r in records if measures.is_training(r)]),
                   measures=_latest_per_step([r for r in records if measures.is_measure(r)]),
                   evals=_latest_per_step([r for r in records if measures.EVAL_REWARD in r]),
                   closed=any(measures.is_closing(r) for r in records))


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
        out[rank] = {r["step"]: r["segments"] for r in _records(LogTail(path).lines())}
    return out
