"""The plan's data: plain, frozen, JSON-renderable; built by `plan.build_plan`, read by every later stage."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_launch.memory.report import MemoryEstimate

ROLES = ("trainer", "vllm", "proxy")


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


@dataclass(frozen=True)
class PrepareStep:
    """A command run once, before any process, in the run directory; skipped when `creates` already exists."""

    name: str
    argv: tuple[str, ...]
    creates: str


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
    vllm: dict[str, Any]
    zero_stage: int
    engines: tuple[Engine, ...]
    processes: tuple[ProcessSpec, ...]
    gpu_map: tuple[tuple[str, ...], ...]       # [node][gpu] -> what runs there
    ports: tuple[dict[str, Any], ...]          # every port the run opens: node, port, owner, recipe key
    files: dict[str, Any]                      # file name -> JSON/YAML document, or text for scripts
    prepare: tuple[PrepareStep, ...]           # run before any process
    trainer_class: str                         # TRL config class the trainer builds
    trainer_args: dict[str, Any]
    trainer_inputs: dict[str, Any]             # model, data, rewards, LoRA: what the trainer entrypoint builds
    batch: dict[str, Any]                      # TRL's derived batch sizes, checked at plan time
    warnings: tuple[str, ...] = field(default=())
    memory: MemoryEstimate | None = None       # per GPU and phase, and per node's host memory (grpo_launch.memory)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["processes"] = [
            {**p, "gpus": list(p["gpus"]), "argv": list(p["argv"]), "pass_env": list(p["pass_env"]),
             "depends_on": list(p["depends_on"]), "ranks": list(p["ranks"]),
             "cuda_visible_devices": _cuda_visible(p)} for p in data["processes"]]
        data["prepare"] = [{**s, "argv": list(s["argv"])} for s in data["prepare"]]
        data["engines"] = [{**e, "gpus": list(e["gpus"]), "ranks": list(e["ranks"])} for e in data["engines"]]
        data["gpu_map"] = [list(row) for row in data["gpu_map"]]
        data["hosts"] = list(data["hosts"])
        data["ports"] = list(data["ports"])
        data["warnings"] = list(data["warnings"])
        data["memory"] = self.memory.to_json() if self.memory else None
        return data

    def process(self, name: str) -> ProcessSpec:
        return next(p for p in self.processes if p.name == name)


def _cuda_visible(process: dict) -> str | None:
    return process["env"].get("CUDA_VISIBLE_DEVICES")
