"""The plan's data: plain, frozen, JSON-renderable. `plan.build_plan` makes it; the run directory holds it as
plan.json (`contracts.rundir`, which also reads the plans older releases wrote); the supervisor, the trainer
entrypoint, the report and the schedulers' launchers read it back typed, never as raw dicts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

from grpo_launch.contracts import hosts
from grpo_launch.contracts.devices import Device, WeightSync, device_of
from grpo_launch.contracts.inputs import Data, Lora
from grpo_launch.contracts.memory import MemoryEstimate
from grpo_launch.contracts.performance import StepPrediction
from grpo_launch.contracts.schedulers import CONTROL_PLANE_TIMEOUT_S, SchedulerSettings, settings_type
from grpo_launch.contracts.trl_fields import TrainerFacts
from grpo_launch.contracts.typed import ChosenBy, build

# plan.json's schema; an older one is read by contracts.rundir, which brings it up to this one. 2: the trainer's
# facts and nodes, the scheduler's settings, one phase vocabulary, every readiness bound stated.
PLAN_VERSION = 2

READY_TIMEOUT_S = 600.0  # how long a process with a readiness URL may take to answer it, unless its spec says


class Role(StrEnum):
    """What a process is to the supervisor and the schedulers."""

    TRAINER = "trainer"        # a launcher (accelerate or torchrun) of one node's trainer ranks
    VLLM = "vllm"              # a vLLM server or replica
    PROXY = "proxy"            # the routing proxy


class Trainer(StrEnum):
    """What the trainer entrypoint runs (TrainerInputs.trainer)."""

    GRPO = "grpo"              # TRL's GRPOTrainer
    ASYNC_GRPO = "async-grpo"  # TRL's AsyncGRPOTrainer (CUDA only)
    ASYNC_LOOP = "async-loop"  # TRL's async pieces (rollout worker, client, adapter saving) in one process: a CPU

    @property
    def config_class(self) -> str:
        """The TRL config class its arguments fill (trl_fields)."""
        return "GRPOConfig" if self is Trainer.GRPO else "AsyncGRPOConfig"


class Sharding(StrEnum):
    """How the trainer ranks share the model."""

    ZERO = "zero"              # DeepSpeed ZeRO, at Plan.zero_stage
    FSDP2 = "fsdp2"
    DDP = "ddp"                # every rank holds the whole model
    NONE = "none"              # one process


@dataclass(frozen=True)
class Restart:
    """How often the supervisor brings a process back after it dies (async-lora replicas behind the proxy)."""

    max_restarts: int
    backoff_s: float = 1.0
    reset_after_s: float | None = None         # ready this long before it dies: its restarts are counted anew


@dataclass(frozen=True)
class Liveness:
    """How the supervisor watches a process once it is ready: its readiness URL probed every `interval_s`, each
    probe given `timeout_s` to answer (any HTTP status is an answer); `failures` probes in a row unanswered and it is
    treated as dead (restarted if its `restart` allows, else the run stops naming it)."""

    interval_s: float
    timeout_s: float
    failures: int

    @property
    def bound_s(self) -> float:
        """The longest a process may stop answering (wedged, or gone on another node) before it is noticed."""
        return self.failures * (self.interval_s + self.timeout_s)


@dataclass(frozen=True)
class Diagnosis:
    """What a line of a failed process's output means: the first match names the failure's cause."""

    pattern: str                               # a regular expression searched in each output line
    reason: str                                # the cause, in words, with how to fix it


@dataclass(frozen=True)
class ProcessSpec:
    """One process the supervisor starts: a launcher on one node (trainer), a vLLM server, or the proxy."""

    name: str
    role: Role
    node: int
    gpus: tuple[int, ...]                      # local GPU indices; CUDA_VISIBLE_DEVICES lists them
    argv: tuple[str, ...]                      # run with the run directory as working directory
    env: dict[str, str]                        # literal values (never secrets)
    pass_env: tuple[str, ...] = ()             # names whose values are taken from the caller's environment
    port: int | None = None
    ready_url: str | None = None               # dependents start once this answers 200
    ready_timeout_s: float = READY_TIMEOUT_S   # the run fails when ready_url has not answered 200 by then
    depends_on: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()                # trainer: the global ranks this launcher starts
    start_delay_s: float = 0.0                 # wait this long after the previous process of its role started
    restart: Restart | None = None             # None: its death stops the run
    diagnoses: tuple[Diagnosis, ...] = ()      # known failure messages and their causes
    metrics_url: str | None = None             # Prometheus text, kept in logs/<name>.metrics when the run stops
    probe_key_env: str | None = None           # readiness and metrics requests send this variable's value as a
                                               # Bearer key (a proxy that requires a client key)
    liveness: Liveness | None = None           # once ready: probed, and dead after failing probes in a row
    exit_timeout_s: float | None = None        # trainer launchers of several nodes: once one finished, the others
                                               # exit within this, or the run fails naming them


@dataclass(frozen=True)
class PrepareStep:
    """A command run once, before any process, in the run directory; skipped when `creates` already exists. With
    a `cache_key`, what it creates depends on nothing else: it is kept between runs (launch.prepared)."""

    name: str
    argv: tuple[str, ...]
    creates: str
    cache_key: str | None = None
    timeout_s: float = 600.0                   # a step that runs longer fails the run


@dataclass(frozen=True)
class Engine:
    """A vLLM engine: a colocated TP group inside trainer ranks, a server, or one async replica."""

    index: int
    node: int
    gpus: tuple[int, ...]
    ranks: tuple[int, ...] = ()                # colocate: the trainer ranks hosting it
    process: str | None = None                 # server/async: the ProcessSpec serving it
    url: str | None = None


@dataclass(frozen=True)
class LoraSlots:
    """Runtime LoRA on the vLLM engines: how many adapters each holds at once and their largest rank."""

    max_loras: int
    max_lora_rank: int


@dataclass(frozen=True)
class Colocated:
    """colocate: the engines inside the trainer ranks."""

    sleep_level: int                           # 2: weights and KV cache freed while the trainer steps
    enforce_eager: bool = False                # no CUDA graphs, no torch.compile: TRL's LLM() call passes none, so the
                                               # trainer adds it (trainer.main.colocated_engine_args)


@dataclass(frozen=True)
class ServerEndpoint:
    """server: the one server the trainer talks to."""

    url: str
    group_port: int | None                     # the NCCL weight-sync rendezvous; None without NCCL (a CPU)


@dataclass(frozen=True)
class Replicas:
    """async-lora: the replicas behind the routing proxy, and the adapters they serve."""

    lora: LoraSlots
    proxy_url: str                             # what the trainer talks to
    adapter_dir: str                           # where adapter versions are written
    max_staleness: int
    tree_attention: str | None                 # the kernel of TRL's tree attention; None where it does not run


@dataclass(frozen=True)
class VllmSettings:
    """How generation runs, resolved: what the plan view shows and the memory estimate sizes. The engine settings
    every placement has, and one placement's own (`colocated`, `server`, `replicas`)."""

    enabled: bool
    engine: str                                # what generates, in words
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None      # engines (colocated TP groups, servers or replicas)
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None           # null: the model's context length
    max_num_seqs: int | None = None            # sequences one engine schedules at once
    max_num_batched_tokens: int | None = None  # tokens one engine forwards at once
    block_size: int | None = None              # KV-cache block, in tokens (the proxy hashes prompts in these)
    colocated: Colocated | None = None
    server: ServerEndpoint | None = None
    replicas: Replicas | None = None

    @property
    def sleep_level(self) -> int:
        return self.colocated.sleep_level if self.colocated else 0

    def items(self) -> list[tuple[str, Any]]:
        """Every resolved setting by name (one placement's own flattened in, LoRA slots too), unset ones left out."""
        flat = {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("enabled", "engine", "colocated", "server", "replicas")}
        for part in (self.colocated, self.server, self.replicas):
            if part is not None:
                flat |= {k: v for k, v in dataclasses.asdict(part).items() if k != "lora"}
        if self.replicas is not None:
            flat |= dataclasses.asdict(self.replicas.lora)
        return [(k, v) for k, v in flat.items() if v is not None]


@dataclass(frozen=True)
class Reward:
    fn: str                                    # as the recipe names it
    target: str                                # 'module:function' or 'file.py:function' the trainer imports
    weight: float


@dataclass(frozen=True)
class TrainerInputs:
    """What the trainer entrypoint builds besides TRL's arguments; it reads these, never the recipe."""

    trainer: Trainer
    model: str                                 # hub id, local directory, or the run's built-in model directory
    data: Data
    rewards: tuple[Reward, ...]
    lora: Lora | None                          # None: train every weight
    attn_implementation: str | None
    max_steps: int                             # TRL's: -1 trains for num_train_epochs instead
    seed: int
    chat_prompts: bool = False                 # turn plain prompts into chat messages (TRL's async worker needs it)
    weight_sync: WeightSync = WeightSync.TRL
    server_key_env: str | None = None          # the variable holding the key vllm_server_base_url requires (the
                                               # proxy's client key, or the vLLM server's own: REPLICA_KEY_ENV),
                                               # sent by TRL's clients as HTTP Basic auth


@dataclass(frozen=True)
class PortClaim:
    node: int
    port: int
    owner: str                                 # what listens there, in words
    key: str                                   # the recipe key that sets it


@dataclass(frozen=True)
class NodeGroup:
    """Nodes a scheduler starts alike (one Slurm step; every SkyPilot node; one `grpo run`)."""

    name: str
    nodes: tuple[int, ...]
    processes: tuple[str, ...]                 # the plan's processes on these nodes, in start order
    command: str                               # what starts them on each node, as the job file says it
    ends: str                                  # when the group ends, in words


@dataclass(frozen=True)
class VerbatimLine:
    """A line of a job file written as the recipe gives it, not quoted: shell commands by design (scheduler.setup) or
    options the scheduler reads as they are (scheduler.slurm.sbatch)."""

    key: str                                   # the recipe key it comes from
    text: str


@dataclass(frozen=True)
class JobSpec:
    """One machine a scheduler submits on its own (a Hugging Face Job): what it runs, on what, and how the other
    machines reach it. What only the submission knows (the namespace, the bucket's folder of the run, the network
    group, the secrets' values) is added then."""

    name: str                                  # unique in the run; its network alias
    node: int
    processes: tuple[str, ...]                 # the plan's processes it runs
    supervisor: bool                           # grpo-launch's node supervisor; else its one process's argv, directly
    image: str
    command: tuple[str, ...]
    env: dict[str, str]                        # literal values (never secrets)
    secrets: tuple[str, ...]                   # names; their values are read where it is submitted
    flavor: str
    gpus: int                                  # the GPUs its node's processes use
    price_per_hour: float                      # the flavor's, in USD
    read_only: bool                            # how it mounts the run directory
    expose: tuple[int, ...]                    # ports reachable from outside (with a token)
    address: str                               # how the other Jobs reach it
    health: str | None = None                  # polled on its exposed port before the Jobs after it start
    ready_timeout_s: float = READY_TIMEOUT_S   # the run fails when health has not answered 200 by then
    max_restarts: int = 0                      # submitted again if it ends while the trainer runs, this many times



@dataclass(frozen=True)
class SchedulerPlan:
    """How the processes reach the machines: the scheduler, its job file, how each node learns its index and the
    addresses, and which nodes run what."""

    kind: str                                  # contracts.schedulers' name
    job_file: str | None                       # the run-directory file the scheduler runs
    submit: tuple[str, ...]                    # the command that submits it, run in the run directory
    node_rank: str                             # how each node learns its index, in words
    addresses: str                             # how the nodes' addresses reach the processes, in words
    groups: tuple[NodeGroup, ...]
    cluster: str | None = None                 # skypilot: the recipe's cluster, or the pattern of the run's own
    verbatim: tuple[VerbatimLine, ...] = ()    # what the job file runs or passes on as written
    jobs: tuple[JobSpec, ...] = ()             # machines submitted one by one, in submit order (hf-jobs)
    storage: str | None = None                 # where the machines find the run directory, in words
    price_per_hour: float | None = None        # every machine together, in USD
    # the scheduler's own section of the recipe (`scheduler.<key>`), for its launcher; None: it has none
    settings: Annotated[SchedulerSettings | None, ChosenBy("kind", settings_type)] = None
    control_plane_timeout_s: float = CONTROL_PLANE_TIMEOUT_S  # scheduler.control_plane_timeout_s


@dataclass(frozen=True)
class GenerationRounds:
    """GRPOTrainer's generation rounds: one round generates for steps_per_generation micro-steps."""

    generation_batch_size: int
    steps_per_generation: int
    prompts_per_generation: int
    completions_per_optimizer_step: int


@dataclass(frozen=True)
class Rollouts:
    """AsyncGRPOTrainer's stream of rollouts: rows packed to a token budget, generated ahead within a staleness."""

    token_budget: int | None                   # None: the server's max_model_len; <= 0: fixed-size rows
    max_staleness: int
    max_inflight_tasks: int                    # < 0: TRL's automatic value


@dataclass(frozen=True)
class Batch:
    """TRL's batch sizes at the plan's world size, checked at plan time; one of `rounds` and `rollouts`, by the
    trainer."""

    num_generations: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    trainer_ranks: int
    rounds: GenerationRounds | None = None     # GRPOTrainer
    rollouts: Rollouts | None = None           # AsyncGRPOTrainer

    def items(self) -> list[tuple[str, Any]]:
        """Every size by TRL's name, the trainer's own last."""
        flat = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("rounds", "rollouts")}
        for part in (self.rounds, self.rollouts):
            if part is not None:
                flat |= dataclasses.asdict(part)
        return list(flat.items())


@dataclass(frozen=True)
class Plan:
    recipe: str
    placement: str
    accelerator: str
    nodes: int
    gpus_per_node: int
    gpu_type: str
    gpu_memory_gib: float
    hosts: tuple[str, ...]
    launcher: str
    world_size: int                            # trainer ranks
    vllm: VllmSettings
    zero_stage: int
    engines: tuple[Engine, ...]
    processes: tuple[ProcessSpec, ...]
    gpu_map: tuple[tuple[str, ...], ...]       # [node][gpu] -> what runs there
    ports: tuple[PortClaim, ...]               # every port the run opens
    files: dict[str, Any]                      # file name -> JSON/YAML document, or text for scripts
    prepare: tuple[PrepareStep, ...]           # run before any process
    trainer_class: str                         # TRL config class the trainer builds
    trainer_args: dict[str, Any]
    trainer_inputs: TrainerInputs
    trainer_facts: TrainerFacts                # what TRL's arguments decide, for whoever reads the plan afterwards
    batch: Batch
    sharding: Sharding
    trainer_nodes: tuple[int, ...]             # the nodes that run trainer ranks, in machine-rank order
    scheduler: SchedulerPlan | None = None     # who starts the processes on the machines
    warnings: tuple[str, ...] = field(default=())
    memory: MemoryEstimate | None = None       # per GPU and phase, and per node's host memory
    prediction: StepPrediction | None = None   # one optimizer step's time by phase, and the run's GPU-hours
    # the trainer marks each checkpoint once it is whole (contracts.rundir.CheckpointRecord); False: a plan of an
    # older release, whose checkpoints are taken with transformers' trainer_state.json
    marks_checkpoints: bool = True

    def to_json(self) -> dict[str, Any]:
        data = {"version": PLAN_VERSION, **dataclasses.asdict(self)}
        for spec in data["processes"]:
            spec["cuda_visible_devices"] = spec["env"].get("CUDA_VISIBLE_DEVICES")
        data["memory"] = self.memory.to_json() if self.memory else None
        data["prediction"] = self.prediction.to_json() if self.prediction else None
        return json.loads(json.dumps(data))  # tuples become lists, as they read back

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """A plan of this release's schema (`contracts.rundir.read_plan` brings older ones up to it)."""
        if data.get("version") != PLAN_VERSION:
            raise ValueError(f"plan.json version {data.get('version')}, not {PLAN_VERSION}")
        return build(cls, data)

    def with_addresses(self, env: Mapping[str, str]) -> Plan:
        """This plan with every node address the job's environment gives (`${GRPO_HOST_K}`, see `contracts.hosts`)
        filled in; a plan without such references comes back unchanged."""
        data = self.to_json()
        if not hosts.variables_in(data):
            return self
        return dataclasses.replace(Plan.from_json(hosts.resolve(data, env)), memory=self.memory,
                                   prediction=self.prediction)  # JSON rounds them

    def process(self, name: str) -> ProcessSpec:
        return next(p for p in self.processes if p.name == name)

    @property
    def device(self) -> Device:
        return device_of(self.accelerator)

    @property
    def parallelism(self) -> str:
        """How the trainer ranks share the model, in words: ZeRO-N (DeepSpeed), FSDP2, DDP, or one process."""
        return {Sharding.ZERO: f"ZeRO-{self.zero_stage}", Sharding.FSDP2: "FSDP2", Sharding.DDP: "DDP",
                Sharding.NONE: "1 process"}[self.sharding]

