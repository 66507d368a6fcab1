"""The typed recipe schema: every key with its type, default, bounds and one-line doc.

A composed recipe (a plain dict from Hydra) becomes a frozen `Config` through `build_config`, which rejects
unknown keys, wrong types, out-of-range values and missing required values, naming the key each time.
`trainer.*` is the one open section: its names are TRL's and are checked against `trl_fields`.
The reference in docs/recipe-reference.md is generated from these classes (`python -m grpo_launch.docs`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.errors import UserError, did_you_mean

REQUIRED: Any = dataclasses.MISSING  # no default: the recipe or the command line must set it


def key(default: Any = REQUIRED, doc: str = "", *, factory: Any = None, choices: tuple | None = None,
        ge: float | None = None, le: float | None = None, gt: float | None = None) -> Any:
    meta = {"doc": doc, "choices": choices, "ge": ge, "le": le, "gt": gt}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class TinyModel:
    hidden_size: int = key(64, "Hidden size of the built-in tiny Qwen2-shaped model.", ge=8)
    num_layers: int = key(2, "Decoder layers of the tiny model.", ge=1)
    num_heads: int = key(4, "Attention heads of the tiny model.", ge=1)
    num_kv_heads: int = key(2, "Key/value heads of the tiny model (divides num_heads).", ge=1)
    max_position_embeddings: int = key(128, "Longest sequence the tiny model accepts.", ge=16)


@dataclass(frozen=True, kw_only=True)
class Model:
    name_or_path: str = key(doc="Hub id (Qwen/Qwen2.5-Math-7B), a local directory, or 'builtin:tiny' "
                                "(a tiny random model and character tokenizer made offline).")
    revision: str | None = key(None, "Hub revision (branch, tag or commit); null: the default branch.")
    dtype: str = key("bfloat16", "Weights dtype for training and vLLM.",
                     choices=("bfloat16", "float16", "float32", "auto"))
    attn_implementation: str | None = key(None, "transformers attention implementation (sdpa, eager, "
                                                "flash_attention_2, ...); null: transformers' choice.")
    trust_remote_code: bool = key(False, "Allow model code from the hub repository.")
    tiny: TinyModel = key(factory=TinyModel, doc="Shape of the built-in tiny model (name_or_path=builtin:tiny).")


@dataclass(frozen=True, kw_only=True)
class Data:
    source: str = key("hub", "Where prompts come from.", choices=("hub", "files", "builtin"))
    path: str = key(doc="Hub dataset id, a local file or glob (jsonl, parquet, csv), or a built-in task name.")
    config: str | None = key(None, "Hub dataset configuration (subset) name.")
    split: str = key("train", "Split to train on.")
    prompt_column: str = key("prompt", "Column holding the prompt (text or chat messages).")
    answer_column: str | None = key(None, "Column holding the reference answer; reward functions receive it "
                                          "as `solution` (TRL's accuracy reward reads that name).")
    system_prompt: str | None = key(None, "System message placed before each prompt (makes prompts chat-formatted).")
    max_samples: int | None = key(None, "Use only the first N rows.", ge=1)
    num_samples: int = key(512, "Rows generated for a built-in task.", ge=1)


@dataclass(frozen=True, kw_only=True)
class Reward:
    fn: str = key(doc="Built-in reward name, 'package.module:function', or 'path/to/file.py:function'.")
    weight: float = key(1.0, "Weight of this reward in the sum (TRL reward_weights).")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    accelerator: str = key("cuda", "Device kind. cpu runs trainer ranks as CPU processes (gloo) and cannot "
                                   "host vLLM.", choices=("cuda", "cpu"))
    nodes: int = key(1, "Number of machines.", ge=1)
    gpus_per_node: int = key(8, "GPUs per machine (with accelerator=cpu: trainer processes per machine).", ge=1)
    gpu_type: str = key("H100", "GPU model, for the plan view and the memory estimate.")
    gpu_memory_gib: float = key(80.0, "Memory of one GPU in GiB.", gt=0)
    host_memory_gib: float = key(2048.0, "CPU memory of one machine in GiB.", gt=0)
    hosts: list[str] = key(factory=list, doc="Address of each machine, node 0 first; empty: placeholders "
                                             "node0, node1, ... (a single node uses 127.0.0.1).")


@dataclass(frozen=True, kw_only=True)
class Placement:
    kind: str = key(doc="Where generation runs: colocate (vLLM inside every trainer rank), server (a vLLM "
                        "server on its own GPUs), async-lora (vLLM replicas behind the routing proxy, "
                        "LoRA adapters synced through shared storage).",
                    choices=("colocate", "server", "async-lora"))
    trainer_nodes: int | None = key(None, "server/async-lora: machines given to the trainer; null: every "
                                          "machine vLLM leaves whole, or node 0 when vLLM shares one "
                                          "machine with the trainer.", ge=1)


@dataclass(frozen=True, kw_only=True)
class Vllm:
    enabled: bool = key(True, "Generate with vLLM. false: generate with transformers inside the trainer "
                              "(CPU runs, debugging; colocate only).")
    server: str = key("vllm", "What serves vLLM's HTTP API in server placements: vllm (`vllm serve`), or cpu-smoke "
                              "(grpo-launch's CPU engine for smoke tests without a GPU; not vLLM; async-lora only).",
                      choices=("vllm", "cpu-smoke"))
    tensor_parallel_size: int = key(1, "GPUs per vLLM engine (tensor parallelism).", ge=1)
    data_parallel_size: int | None = key(None, "vLLM engines. colocate: derived (trainer ranks / TP); server: 1; "
                                               "async-lora: independent replicas (default 2).", ge=1)
    sleep_level: int = key(0, "colocate: 0 keeps vLLM resident; 2 frees its weights and KV cache while "
                              "training (TRL's sleep mode). Level 1 is not implemented by TRL 1.16.",
                           choices=(0, 1, 2))
    gpu_memory_utilization: float | None = key(None, "Fraction of GPU memory vLLM may take; null: 0.3 "
                                                     "colocated (TRL's default), 0.9 on its own GPUs.",
                                               gt=0.0, le=1.0)
    max_model_len: int | None = key(None, "Longest prompt + completion vLLM serves; null: the model's.", ge=1)
    port: int = key(8000, "HTTP port of the first vLLM server on a machine; more servers there take the "
                          "next free ports.", ge=1, le=65535)
    group_port: int = key(51216, "server: NCCL weight-sync rendezvous port, opened on trainer node 0.",
                          ge=1, le=65535)
    enable_prefix_caching: bool | None = key(None, "vLLM automatic prefix caching; null: vLLM's default (on).")
    enforce_eager: bool = key(False, "Disable CUDA graphs (faster start, slower generation).")
    max_loras: int | None = key(None, "async-lora: adapter slots per replica (--max-loras); null: "
                                      "max_staleness + 2, the least TRL accepts.", ge=1)
    max_lora_rank: int | None = key(None, "async-lora: --max-lora-rank; null: the smallest vLLM rank >= lora.r.",
                                    ge=1)
    block_size: int = key(16, "KV-cache block size in tokens (--block-size); the proxy hashes prompts in "
                              "blocks of this size.", ge=1)
    extra_args: list[str] = key(factory=list, doc="More `vllm serve` arguments, appended verbatim.")
    health_timeout_s: float = key(1800.0, "How long to wait for a server's /health before failing the run.",
                                  gt=0)
    stagger_s: float = key(10.0, "async-lora: seconds between starting two replicas (spreads the load "
                                 "of weights from shared storage).", ge=0)


@dataclass(frozen=True, kw_only=True)
class Zero:
    stage: int = key(0, "DeepSpeed ZeRO stage; 0: plain data parallel (DDP), no DeepSpeed.", choices=(0, 1, 2, 3))
    offload_optimizer: bool = key(False, "Keep optimizer states in CPU memory (stages 1-3).")
    offload_param: bool = key(False, "Keep parameters in CPU memory (stage 3).")
    contiguous_gradients: bool | None = key(None, "Copy gradients into one buffer (less fragmentation); null: "
                                                  "DeepSpeed's default.")
    overlap_comm: bool | None = key(None, "Overlap gradient reduction with backward; null: DeepSpeed's default.")


@dataclass(frozen=True, kw_only=True)
class Lora:
    enabled: bool = key(False, "Train a LoRA adapter (peft) instead of all weights.")
    r: int = key(16, "LoRA rank.", ge=1)
    alpha: int = key(32, "LoRA alpha.", ge=1)
    dropout: float = key(0.05, "LoRA dropout.", ge=0.0, le=1.0)
    target_modules: list[str] = key(factory=lambda: ["all-linear"],
                                    doc="Modules to adapt; ['all-linear'] adapts every linear layer but the "
                                        "output head.")


@dataclass(frozen=True, kw_only=True)
class Proxy:
    host: str = key("127.0.0.1", "Address the routing proxy binds (async-lora); 0.0.0.0 exposes it.")
    port: int = key(8080, "Port of the routing proxy.", ge=1, le=65535)
    imbalance: int = key(8, "A prefix-affine replica keeps a request while its in-flight count exceeds the "
                            "least-loaded replica's by at most this much.", ge=0)
    max_tracked_blocks: int = key(500_000, "Prefix blocks remembered (LRU).", ge=1)
    api_key_env: str | None = key(None, "Name of the environment variable holding the key clients must send; "
                                        "null: no client auth.")
    upstream_api_key_env: str | None = key(None, "Name of the environment variable whose value is sent to "
                                                 "replicas as a Bearer token.")
    lora_load_timeout_s: float = key(300.0, "How long an adapter load waits for a replica to see the files.",
                                     gt=0)


@dataclass(frozen=True, kw_only=True)
class Run:
    root: str = key("runs", "Directory holding runs/<recipe>/<timestamp>/.")
    dir: str | None = key(None, "Exact run directory; null: <root>/<recipe>/<timestamp>.")
    main_process_port: int = key(29500, "torch.distributed rendezvous port on trainer node 0.", ge=1, le=65535)


@dataclass(frozen=True, kw_only=True)
class Env:
    set: dict[str, str] = key(factory=dict, doc="Literal environment variables for every process (never "
                                                "secrets: they are written to the run directory).")
    passthrough: list[str] = key(factory=lambda: ["HF_TOKEN", "WANDB_API_KEY"],
                                 doc="Names of variables passed from your shell to every process; values "
                                     "are never written anywhere.")


@dataclass(frozen=True, kw_only=True)
class Config:
    model: Model
    data: Data
    cluster: Cluster
    placement: Placement
    description: str = key("", "One line shown by `grpo recipes`.")
    seed: int = key(42, "Random seed (TRL's seed).", ge=0)
    launcher: str = key("accelerate", "Starts the trainer ranks.", choices=("accelerate", "torchrun"))
    rewards: list[Reward] = key(factory=list, doc="Reward functions, summed with their weights.")
    vllm: Vllm = key(factory=Vllm, doc="vLLM engines and servers.")
    zero: Zero = key(factory=Zero, doc="DeepSpeed ZeRO.")
    lora: Lora = key(factory=Lora, doc="LoRA adapter training.")
    proxy: Proxy = key(factory=Proxy, doc="The KV-prefix routing proxy (async-lora).")
    run: Run = key(factory=Run, doc="The run directory and rendezvous.")
    env: Env = key(factory=Env, doc="Environment of every process.")
    trainer: dict[str, Any] = key(factory=dict, doc="TRL arguments by TRL's names (GRPOConfig; AsyncGRPOConfig "
                                                    "for async-lora), checked against the pinned TRL's fields.")


# ---------------------------------------------------------------------------------------------------------------
# Validation: plain dict -> typed dataclasses, naming the key on every error.

_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _check_bounds(path: str, value: Any, meta: dict) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        listed = ", ".join(str(c) for c in choices)
        hint = did_you_mean(str(value), [str(c) for c in choices]) if isinstance(value, str) else ""
        raise UserError(f"'{path}' must be one of {listed}; got {value!r}{hint}", key=path)
    if meta.get("ge") is not None and value < meta["ge"]:
        raise UserError(f"'{path}' must be >= {meta['ge']}, got {value!r}", key=path)
    if meta.get("gt") is not None and value <= meta["gt"]:
        raise UserError(f"'{path}' must be > {meta['gt']}, got {value!r}", key=path)
    if meta.get("le") is not None and value > meta["le"]:
        raise UserError(f"'{path}' must be <= {meta['le']}, got {value!r}", key=path)


def _convert(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(path, args[0], value)
    if value is None:
        raise UserError(f"'{path}' must not be null", key=path,
                        hint="give it a value, or drop it to use the default")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"'{path}' must be a mapping of keys, got {_describe(value)}", key=path)
        return build_section(tp, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"'{path}' must be a list, got {_describe(value)}", key=path,
                            hint=f"Hydra list syntax: {path}=[a,b]")
        (item_tp,) = typing.get_args(tp)
        return [_convert(f"{path}[{i}]", item_tp, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"'{path}' must be a mapping, got {_describe(value)}", key=path)
        key_tp, val_tp = typing.get_args(tp)
        if val_tp is Any:
            return dict(value)
        return {str(k): _convert(f"{path}.{k}", val_tp, v) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in _KIND_NAMES and (type(value) is not tp):
        raise UserError(f"'{path}' must be {_KIND_NAMES[tp]}, got {_describe(value)}", key=path)
    return value


def build_section(cls: type, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            dotted = f"{prefix}." if prefix else ""
            path = f"{dotted}{name}"
            raise UserError(f"unknown key '{path}'{did_you_mean(str(name), fields, prefix=dotted)}",
                            key=path, hint=_known_keys_hint(prefix, fields))
    values = {}
    for name, f in fields.items():
        path = f"{prefix}.{name}" if prefix else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if dataclasses.is_dataclass(hints[name]):
                    values[name] = build_section(hints[name], {}, path)
                    continue
                raise UserError(f"missing required value '{path}'", key=path,
                                hint=f"set it in the recipe or on the command line: {path}=...")
            continue
        value = _convert(path, hints[name], data[name])
        if value is not None:
            _check_bounds(path, value, f.metadata)
        values[name] = value
    return cls(**values)


def _known_keys_hint(prefix: str, fields: dict) -> str:
    where = f"under '{prefix}'" if prefix else "at the top level"
    return f"keys {where}: {', '.join(sorted(fields))}"


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
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        out.append((path, tp, default, dict(f.metadata)))
    return out
