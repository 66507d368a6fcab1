"""The plan's data: plain, frozen, JSON-renderable. `plan.build_plan` makes it; the run directory holds it as
plan.json; the supervisor and the trainer entrypoint read it back with `load_plan`, typed, never as raw dicts.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_launch.contracts import hosts
from grpo_launch.contracts.inputs import Data, Lora
from grpo_launch.contracts.memory import MemoryEstimate
from grpo_launch.contracts.rundir import ACCELERATE_FILE, PLAN_FILE
from grpo_launch.contracts.typed import build

ROLES = ("trainer", "vllm", "proxy")
# What the trainer entrypoint runs (TrainerInputs.trainer): TRL's GRPOTrainer, or AsyncGRPOTrainer.
TRAINERS = ("grpo", "async-grpo")
# How trained weights reach vLLM (TrainerInputs.weight_sync): TRL's own way (NCCL to a server, a direct load into a
# colocated engine, adapters through files), or, where that cannot work (a CPU), the weights written to the run
# directory's WEIGHT_SYNC_DIR and reloaded by the engine.
WEIGHT_SYNCS = ("trl", "reload")


@dataclass(frozen=True)
class Restart:
    """How often the supervisor brings a process back after it dies (async-lora replicas behind the proxy)."""

    max_restarts: int
    backoff_s: float = 1.0


@dataclass(frozen=True)
class Diagnosis:
    """What a line of a failed process's output means: the first match names the failure's cause."""

    pattern: str                               # a regular expression searched in each output line
    reason: str                                # the cause, in words, with how to fix it


@dataclass(frozen=True)
class ProcessSpec:
    """One process the supervisor starts: a launcher on one node (trainer), a vLLM server, or the proxy."""

    name: str
    role: str                                  # one of ROLES
    node: int
    gpus: tuple[int, ...]                      # local GPU indices; CUDA_VISIBLE_DEVICES lists them
    argv: tuple[str, ...]                      # run with the run directory as working directory
    env: dict[str, str]                        # literal values (never secrets)
    pass_env: tuple[str, ...] = ()             # names whose values are taken from the caller's environment
    port: int | None = None
    ready_url: str | None = None               # dependents start once this answers 200
    ready_timeout_s: float | None = None
    depends_on: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()                # trainer: the global ranks this launcher starts
    start_delay_s: float = 0.0                 # wait this long after the previous process of its role started
    restart: Restart | None = None             # None: its death stops the run
    diagnoses: tuple[Diagnosis, ...] = ()      # known failure messages and their causes
    metrics_url: str | None = None             # Prometheus text, kept in logs/<name>.metrics when the run stops


@dataclass(frozen=True)
class PrepareStep:
    """A command run once, before any process, in the run directory; skipped when `creates` already exists. With
    a `cache_key`, what it creates depends on nothing else: it is kept between runs (launch.prepared)."""

    name: str
    argv: tuple[str, ...]
    creates: str
    cache_key: str | None = None


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
class VllmSettings:
    """How generation runs, resolved: what the plan view shows and the memory estimate sizes."""

    enabled: bool
    engine: str                                # what generates, in words
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None      # engines (colocated TP groups, servers or replicas)
    sleep_level: int = 0
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None           # null: the model's context length
    max_num_seqs: int | None = None            # sequences one engine schedules at once
    max_num_batched_tokens: int | None = None  # tokens one engine forwards at once
    block_size: int | None = None              # KV-cache block, in tokens (the proxy hashes prompts in these)
    lora: LoraSlots | None = None
    url: str | None = None                     # server: the one server the trainer talks to
    group_port: int | None = None              # server: the NCCL weight-sync rendezvous
    proxy_url: str | None = None               # async-lora: the routing proxy the trainer talks to
    adapter_dir: str | None = None             # async-lora: where adapter versions are written
    max_staleness: int | None = None
    tree_attention: str | None = None          # async-lora on GPUs: the kernel of TRL's tree attention


@dataclass(frozen=True)
class Reward:
    fn: str                                    # as the recipe names it
    target: str                                # 'module:function' or 'file.py:function' the trainer imports
    weight: float


@dataclass(frozen=True)
class TrainerInputs:
    """What the trainer entrypoint builds besides TRL's arguments; it reads these, never the recipe."""

    trainer: str                               # one of TRAINERS
    model: str                                 # hub id, local directory, or the run's built-in model directory
    data: Data
    rewards: tuple[Reward, ...]
    lora: Lora | None                          # None: train every weight
    attn_implementation: str | None
    chat_prompts: bool = False                 # turn plain prompts into chat messages (TRL's async worker needs it)
    weight_sync: str = "trl"                   # one of WEIGHT_SYNCS


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
class SchedulerPlan:
    """How the processes reach the machines: the scheduler, its job file, how each node learns its index and the
    addresses, and which nodes run what."""

    kind: str                                  # local, slurm, skypilot
    job_file: str | None                       # the run-directory file the scheduler runs
    submit: tuple[str, ...]                    # the command that submits it, run in the run directory
    node_rank: str                             # how each node learns its index, in words
    addresses: str                             # how the nodes' addresses reach the processes, in words
    groups: tuple[NodeGroup, ...]
    # The command, run in the run directory, that brings the nodes' metrics.jsonl and logs into it (`grpo report
    # --fetch`); empty where they are written there already (this machine, or the shared storage of a Slurm job).
    fetch: tuple[str, ...] = ()


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
    batch: dict[str, Any]                      # TRL's derived batch sizes, checked at plan time
    scheduler: SchedulerPlan | None = None     # who starts the processes on the machines
    warnings: tuple[str, ...] = field(default=())
    memory: MemoryEstimate | None = None       # per GPU and phase, and per node's host memory

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for spec in data["processes"]:
            spec["cuda_visible_devices"] = spec["env"].get("CUDA_VISIBLE_DEVICES")
        data["memory"] = self.memory.to_json() if self.memory else None
        return json.loads(json.dumps(data))  # tuples become lists, as they read back

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return build(cls, data)

    def with_addresses(self, env: Mapping[str, str]) -> Plan:
        """This plan with every node address the job's environment gives (`${GRPO_HOST_K}`, see `contracts.hosts`)
        filled in; a plan without such references comes back unchanged."""
        data = self.to_json()
        if not hosts.variables_in(data):
            return self
        return dataclasses.replace(Plan.from_json(hosts.resolve(data, env)), memory=self.memory)  # JSON rounds it

    def process(self, name: str) -> ProcessSpec:
        return next(p for p in self.processes if p.name == name)

    @property
    def parallelism(self) -> str:
        """How the trainer ranks share the model: ZeRO-N (DeepSpeed), FSDP2, DDP, or one process."""
        if self.zero_stage:
            return f"ZeRO-{self.zero_stage}"
        distributed = self.files[ACCELERATE_FILE]["distributed_type"]
        return {"FSDP": "FSDP2", "MULTI_GPU": "DDP"}.get(distributed, "1 process")


def load_plan(path: str | Path) -> Plan:
    """plan.json of a run directory (or the file itself), typed."""
    path = Path(path)
    return Plan.from_json(json.loads((path / PLAN_FILE if path.is_dir() else path).read_text()))
