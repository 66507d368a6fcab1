"""The typed recipe schema: every key with its type, default, bounds and one-line doc.

These dataclasses are the structured config of the primary config (`compose.recipes.PRIMARY_DIR`): Hydra composes
recipes into them, so OmegaConf rejects unknown keys, converts and checks types and finds missing values, naming the
key.
`check_bounds` then checks every knob's bounds and choices in one pass over the typed `Config`. `trainer.*` is the
one open section: its names are TRL's and are checked against `trl_fields`. docs/recipe-reference.md is generated
from these classes (`python -m grpo_launch.compose.reference`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from grpo_launch.contracts.devices import DEVICES
from grpo_launch.contracts.inputs import Data, Lora
from grpo_launch.contracts.knobs import ENV_NAME, default_of, knob, violation
from grpo_launch.contracts.proxy import DEFAULT_PROXY_PORT, ProxyKnobs
from grpo_launch.contracts.schedulers import CONTROL_PLANE_TIMEOUT_S, DECLARED
from grpo_launch.contracts.vllm import DEFAULT_BLOCK_SIZE, REPLICA_KEY_ENV
from grpo_launch.errors import UserError, collect, did_you_mean


@dataclass(kw_only=True)
class TinyModel:
    hidden_size: int = knob(64, "Hidden size of the built-in tiny Qwen2-shaped model (a test model: at most 4096).",
                            ge=8, le=4096)
    num_layers: int = knob(2, "Decoder layers of the tiny model (at most 64).", ge=1, le=64)
    num_heads: int = knob(2, "Attention heads of the tiny model (divides hidden_size); vLLM's CPU attention serves "
                             "head sizes (hidden_size / num_heads) of 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 "
                             "and 512 only.", ge=1, le=64)
    num_kv_heads: int = knob(1, "Key/value heads of the tiny model (divides num_heads).", ge=1, le=64)
    max_position_embeddings: int = knob(128, "Longest sequence the tiny model accepts.", ge=16, le=131072)


@dataclass(kw_only=True)
class Model:
    name_or_path: str = knob(doc="Hub id (Qwen/Qwen2.5-Math-7B), a local directory, or 'builtin:tiny' "
                                 "(a tiny random model and character tokenizer made offline).")
    revision: str | None = knob(None, "Hub revision (branch, tag or commit); null: the default branch.")
    dtype: str = knob("bfloat16", "Weights dtype for training and vLLM.",
                      choices=("bfloat16", "float16", "float32", "auto"))
    attn_implementation: str | None = knob(None, "transformers attention implementation (sdpa, eager, "
                                                 "flash_attention_2, ...); null: transformers' choice.")
    trust_remote_code: bool = knob(False, "Allow model code from the hub repository.")
    tiny: TinyModel = knob(factory=TinyModel, doc="Shape of the built-in tiny model (name_or_path=builtin:tiny).")


@dataclass(kw_only=True)
class Reward:
    fn: str = knob(doc="Built-in reward name, 'package.module:function', or 'path/to/file.py:function'.")
    weight: float = knob(1.0, "Weight of this reward in the sum (TRL reward_weights).")


@dataclass(kw_only=True)
class Cluster:
    accelerator: str = knob("cuda", "Device kind. cpu runs trainer ranks as CPU processes (gloo) and vLLM's CPU "
                                    "build (no sleep mode, no NCCL weight sync: weights are reloaded from files).",
                            choices=tuple(DEVICES))
    nodes: int = knob(1, "Number of machines (at most 1024: grpo-launch plans every process of every node).",
                      ge=1, le=1024)
    gpus_per_node: int = knob(8, "GPUs per machine (with accelerator=cpu: trainer processes per machine); at most 64: "
                                 "no machine holds more accelerators.", ge=1, le=64)
    gpu_type: str = knob("H100", "GPU model, a row of the accelerator table (H100, H200, A100-80GB, ...): the "
                                 "plan view, the memory estimate and the step-time prediction read it.")
    gpu_memory_gib: float = knob(80.0, "Memory of one GPU in GiB.", gt=0)
    host_memory_gib: float = knob(2048.0, "CPU memory of one machine in GiB.", gt=0)
    gpu_hour_price: float | None = knob(None, "Price of one GPU-hour, in any currency: the plan prices the "
                                              "predicted GPU-hours of trainer.max_steps with it; null: no cost.",
                                        ge=0)
    hosts: list[str] = knob(factory=list, doc="Address of each machine, node 0 first. Empty: one node, or "
                                              "several CPU nodes with scheduler=local, run on this machine "
                                              "(127.0.0.1); otherwise node K's address is read where the job "
                                              "runs from GRPO_HOST_K, which the Slurm and SkyPilot job files "
                                              "set.")


@dataclass(kw_only=True)
class Vllm:
    """The engine settings every placement's vLLM takes; what one placement alone takes is in its own section of
    `placement` (placement.colocate, placement.server, placement.async_lora)."""

    enabled: bool = knob(True, "Generate with vLLM. false: generate with transformers inside the trainer "
                               "(CPU runs, debugging; colocate only).")
    tensor_parallel_size: int = knob(1, "GPUs per vLLM engine (tensor parallelism).", ge=1)
    gpu_memory_utilization: float = knob(doc="Fraction of GPU memory vLLM may take. Each placement's group file "
                                             "sets its default (`grpo recipes show` shows it).", gt=0.0, le=1.0)
    max_model_len: int | None = knob(None, "Longest prompt + completion vLLM serves; null: the model's.", ge=1)
    enable_prefix_caching: bool | None = knob(None, "vLLM automatic prefix caching; null: vLLM's default (on).")
    enforce_eager: bool = knob(False, "Disable CUDA graphs and torch.compile (faster start, slower generation), "
                                       "in colocate's engines too.")
    block_size: int = knob(DEFAULT_BLOCK_SIZE, "KV-cache block size in tokens (--block-size); the proxy hashes "
                                               "prompts in blocks of this size.", ge=1)
    cpu_kvcache_space_gib: int = knob(1, "cluster.accelerator=cpu: GiB of host memory each vLLM engine keeps for "
                                         "its KV cache (VLLM_CPU_KVCACHE_SPACE); gpu_memory_utilization does not "
                                         "apply on a CPU.", ge=1)
    port: int = knob(8000, "A `vllm serve` process (server, async-lora): HTTP port of the first on a machine; more "
                           "there take the next free ports.", ge=1, le=65535)
    health_timeout_s: float = knob(1800.0, "A `vllm serve` process: how long to wait for its /health before failing "
                                           "the run.", gt=0)
    extra_args: list[str] = knob(factory=list, doc="More `vllm serve` arguments (server, async-lora), appended "
                                                   "verbatim.")


@dataclass(kw_only=True)
class Colocate:
    sleep_level: int = knob(0, "0 keeps vLLM resident; 2 frees its weights and KV cache while training (TRL's "
                               "sleep mode). Level 1 is not implemented by the pinned TRL.", choices=(0, 1, 2))


@dataclass(kw_only=True)
class Server:
    group_port: int = knob(51216, "NCCL weight-sync rendezvous port, opened on trainer node 0.", ge=1, le=65535)


@dataclass(kw_only=True)
class Proxy(ProxyKnobs):
    port: int = knob(DEFAULT_PROXY_PORT, "Port of the routing proxy.", ge=1, le=65535)
    api_key_env: str | None = knob(None, "Name of the environment variable holding the key clients must send "
                                         "(the trainer sends it too); required when the proxy's host is not "
                                         "loopback; null: no client auth.", form=ENV_NAME)
    upstream_api_key_env: str | None = knob(None, f"Kept null: the replicas require the run's own key "
                                                  f"({REPLICA_KEY_ENV}), which the proxy sends them.", form=ENV_NAME)


@dataclass(kw_only=True)
class AsyncLora:
    replicas: int = knob(2, "Independent `vllm serve` replicas behind the routing proxy.", ge=1)
    max_loras: int | None = knob(None, "Adapter slots per replica (--max-loras); null: trainer.max_staleness + 2, "
                                       "the least TRL accepts.", ge=1)
    max_lora_rank: int | None = knob(None, "--max-lora-rank; null: the smallest vLLM rank >= lora.r.", ge=1)
    stagger_s: float = knob(10.0, "Seconds between starting two replicas (spreads the load of weights from shared "
                                  "storage).", ge=0)
    max_restarts: int = knob(3, "How often the supervisor restarts a replica that dies (the proxy takes it back "
                                "once healthy); the next death stops the run.", ge=0)
    restart_reset_s: float = knob(600.0, "A replica that was ready this long before it died has its restarts "
                                         "counted anew (max_restarts bounds deaths closer together).", gt=0)
    proxy: Proxy = knob(factory=Proxy, doc="The KV-prefix routing proxy in front of the replicas.")


@dataclass(kw_only=True)
class Placement:
    kind: str = knob(doc="Where generation runs: colocate (vLLM inside every trainer rank), server (a vLLM "
                         "server on its own GPUs), async-lora (vLLM replicas behind the routing proxy, "
                         "LoRA adapters synced through shared storage). Chosen with placement=NAME, whose "
                         "group file also sets the placement's defaults.")
    trainer_nodes: int | None = knob(None, "Machines given to the trainer; null: every machine (colocate), or every "
                                           "machine vLLM leaves whole, or node 0 when vLLM shares one machine with "
                                           "the trainer (server, async-lora).", ge=1)
    colocate: Colocate = knob(factory=Colocate, doc="placement=colocate: the engine inside the trainer ranks.")
    server: Server = knob(factory=Server, doc="placement=server: the one server's weight sync.")
    async_lora: AsyncLora = knob(factory=AsyncLora, doc="placement=async-lora: the replicas and the proxy.")


# Keys that moved, by their old name: a recipe or an override that uses one is told the new name.
MOVED = {
    "vllm.sleep_level": "placement.colocate.sleep_level",
    "vllm.group_port": "placement.server.group_port",
    "vllm.data_parallel_size": "placement.async_lora.replicas",
    "vllm.max_loras": "placement.async_lora.max_loras",
    "vllm.max_lora_rank": "placement.async_lora.max_lora_rank",
    "vllm.stagger_s": "placement.async_lora.stagger_s",
    "vllm.max_restarts": "placement.async_lora.max_restarts",
    "vllm.restart_reset_s": "placement.async_lora.restart_reset_s",
    "proxy": "placement.async_lora.proxy",
}


def moved_to(key: str) -> str | None:
    """The new name of a key that moved (a section's keys move with it), or None."""
    for old, new in MOVED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


@dataclass(kw_only=True)
class Zero:
    stage: int = knob(0, "DeepSpeed ZeRO stage; 0: plain data parallel (DDP), no DeepSpeed.", choices=(0, 1, 2, 3))
    offload_optimizer: bool = knob(False, "Keep optimizer states in CPU memory (stages 1-3).")
    offload_param: bool = knob(False, "Keep parameters in CPU memory (stage 3).")
    contiguous_gradients: bool | None = knob(None, "Copy gradients into one buffer (less fragmentation); null: "
                                                   "DeepSpeed's default.")
    overlap_comm: bool | None = knob(None, "Overlap gradient reduction with backward; null: DeepSpeed's default.")


@dataclass(kw_only=True)
class Run:
    root: str = knob("runs", "Directory holding runs/<recipe>/<timestamp>/.")
    dir: str | None = knob(None, "Exact run directory; null: <root>/<recipe>/<timestamp>.")
    main_process_port: int = knob(29500, "torch.distributed rendezvous port on trainer node 0.", ge=1, le=65535)
    rendezvous_timeout_s: float = knob(600.0, "Several trainer nodes: how long trainer node 0 waits for the "
                                              "others to join the rendezvous (and they for it) before the run "
                                              "fails.", gt=0)
    health_interval_s: float = knob(5.0, "Once a server (vLLM, the proxy) is ready, its /health is probed this "
                                         "often, each probe given as long to answer.", gt=0)
    health_failures: int = knob(3, "Unanswered /health probes in a row after which a ready server is treated as "
                                   "dead: restarted if it may be (placement.async_lora.max_restarts), else the run "
                                   "stops naming it. A wedged server is noticed within health_failures x 2 x "
                                   "health_interval_s.", ge=1)
    exit_timeout_s: float = knob(300.0, "Several trainer nodes: once one node's launcher finished, how long the "
                                        "others may take to exit before the run fails naming them (srun --wait "
                                        "under Slurm).", gt=0)
    node_local_checkpoints: bool = knob(False, "Several trainer nodes whose scheduler gives each its own copy of the "
                                               "run directory (SkyPilot): accept checkpoints kept on each node's own "
                                               "disk (a resume then needs every node's copy, and refuses "
                                               "otherwise); false: the plan is refused unless trainer.output_dir is "
                                               "an absolute path on storage every node mounts.")


def _scheduler_section() -> type:
    """The `scheduler` section: the kind, the setup lines, and each scheduler's own settings under its key, as the
    schedulers declare them (`contracts.schedulers`)."""
    kinds = ", ".join(f"{d.name} ({d.summary})" for d in DECLARED)
    fields: list[tuple[str, Any, Any]] = [
        ("kind", str, knob(doc=f"Who starts the processes on the machines: {kinds}. Chosen with scheduler=NAME.",
                           choices=tuple(d.name for d in DECLARED))),
        ("setup", list[str], knob(factory=list, doc="Shell commands a scheduler's job runs first on each machine it "
                                                    "starts (module load ..., source .venv/bin/activate), one line "
                                                    "each, run as written: they are shell by design; "
                                                    "scheduler=local starts nothing and ignores them.")),
        ("control_plane_timeout_s", float, knob(
            CONTROL_PLANE_TIMEOUT_S, gt=0,
            doc="How long the scheduler's control plane (Slurm's controller, the Hub's Jobs API) may answer nothing "
                "but transient errors (timeouts, 5xx, 429) before `grpo run` stops following: its job is then left "
                "as it is, and said so, never cancelled for it. Each such call is retried with backoff.")),
    ]
    fields += [(d.key, d.settings, knob(factory=d.settings, doc=d.doc)) for d in DECLARED if d.key]
    section = dataclasses.make_dataclass("Scheduler", fields, kw_only=True)
    section.__module__ = __name__
    return section


Scheduler = _scheduler_section()


@dataclass(kw_only=True)
class Env:
    set: dict[str, str] = knob(factory=dict, doc="Literal environment variables for every process (never "
                                                 "secrets: they are written to the run directory; a name or value "
                                                 "that looks like a secret is refused).", form=ENV_NAME)
    passthrough: list[str] = knob(factory=lambda: ["HF_TOKEN", "WANDB_API_KEY"],
                                  doc="Names of variables passed from your shell to every process; values "
                                      "are never written anywhere.", form=ENV_NAME)


@dataclass(kw_only=True)
class Config:
    model: Model = knob(factory=Model, doc="The model trained and served.")
    data: Data = knob(factory=Data, doc="The prompts.")
    cluster: Cluster = knob(factory=Cluster, doc="The machines.")
    placement: Placement = knob(factory=Placement, doc="Where generation runs.")
    description: str = knob("", "One line shown by `grpo recipes`.")
    seed: int = knob(42, "Random seed (TRL's seed; numpy takes at most 2**32 - 1).", ge=0, le=2**32 - 1)
    launcher: str = knob("accelerate", "Starts the trainer ranks.", choices=("accelerate", "torchrun"))
    rewards: list[Reward] = knob(factory=list, doc="Reward functions, summed with their weights.")
    vllm: Vllm = knob(factory=Vllm, doc="vLLM engines and servers.")
    zero: Zero = knob(factory=Zero, doc="DeepSpeed ZeRO.")
    lora: Lora = knob(factory=Lora, doc="LoRA adapter training.")
    run: Run = knob(factory=Run, doc="The run directory and rendezvous.")
    scheduler: Scheduler = knob(factory=Scheduler, doc="How the processes reach the machines.")
    env: Env = knob(factory=Env, doc="Environment of every process.")
    trainer: dict[str, Any] = knob(factory=dict, doc="TRL arguments by TRL's names (GRPOConfig; AsyncGRPOConfig "
                                                     "for async-lora), checked against the pinned TRL's fields.",
                                   any_text=True)


_SCALARS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _check_items(value: Any, tp: Any, path: str) -> None:
    """The items of a list or mapping of scalars are of their type: OmegaConf lets a nested list through as one."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    items = enumerate(value) if origin is list else value.items() if origin is dict else ()
    kind = args[-1] if args else None
    for where, item in items:
        ok = isinstance(item, kind) and not (kind is not bool and isinstance(item, bool)) if kind in _SCALARS else True
        if not ok and not (kind is float and isinstance(item, int) and not isinstance(item, bool)):
            at = f"{path}[{where}]" if origin is list else f"{path}.{where}"
            raise UserError(f"'{at}' must be {_SCALARS[kind]}, got {item!r}", key=path)


def check_bounds(section: Any, prefix: str = "") -> None:
    """Every knob's bounds and choices, and the items of its lists and mappings, in one pass over a typed section
    (lists of sections included); every knob out of bounds is reported, together."""
    hints = typing.get_type_hints(type(section))
    collect(*(partial(_check_knob, getattr(section, f.name), f.metadata, hints[f.name], f"{prefix}{f.name}")
              for f in dataclasses.fields(section)))


def _check_knob(value: Any, meta: Mapping[str, Any], tp: Any, path: str) -> None:
    if isinstance(value, (list, dict)) and value:
        _check_items(value, tp, path)
    if dataclasses.is_dataclass(value):
        check_bounds(value, f"{path}.")
    elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        collect(*(partial(check_bounds, item, f"{path}[{i}].") for i, item in enumerate(value)))
    elif value is not None:
        problem = violation(value, meta)
        if problem:
            choices = meta.get("choices") or ()
            suggestion = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
            key = _item_key(path, value, meta)
            raise UserError(f"'{key}' {problem}{suggestion}", key=key, hint=meta.get("doc") or None)


def _item_key(path: str, value: Any, meta: dict) -> str:
    """The key of the entry of a list or mapping that breaks the knob's bounds (`env.set.NAME`, `sbatch[1]`)."""
    if isinstance(value, dict):
        return next((f"{path}.{k}" for k, v in value.items() if violation({k: v}, meta)), path)
    if isinstance(value, list):
        return next((f"{path}[{i}]" for i, v in enumerate(value) if violation([v], meta)), path)
    return path


def type_at(path: str) -> Any:
    """The schema's type at a dotted path (list entries by index, optional types unwrapped), or None where the path
    leaves the schema; inside a free-form mapping, the mapping's value type."""
    tp: Any = Config
    for part in path.split("."):
        origin = typing.get_origin(tp)
        if origin is list and part.isdigit():
            tp = typing.get_args(tp)[0]
        elif origin is dict:
            tp = typing.get_args(tp)[1]
        elif dataclasses.is_dataclass(tp) and part in (hints := typing.get_type_hints(tp)):
            tp = hints[part]
        else:
            return None
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def opens_mapping(path: str) -> bool:
    """Whether a dotted override path reaches into a free-form mapping (trainer.*, env.set.*), where a key may be
    added; every other key exists in the schema already."""
    parts = path.split(".")
    return any(typing.get_origin(type_at(".".join(parts[:n]))) is dict for n in range(1, len(parts) + 1))


def schema_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, Any, dict]]:
    """Every (dotted key, type, default, metadata) of the schema, depth first; used for docs and did-you-mean."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(schema_keys(tp, f"{path}."))
            continue
        out.append((path, tp, default_of(cls, f.name), dict(f.metadata)))
    return out
