"""The server's command line, spelled like `vllm serve`'s so a plan can swap one for the other.

Flags vLLM has but this engine cannot honour are refused (exit 2), never silently ignored; the few a plan always passes
and that change nothing on a CPU (`--gpu-memory-utilization`, `--weight-transfer-config`, ...) are accepted and reported
in /server_info. Parsing reads only the model's config.json: no torch, so a typo fails fast.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from grpo_launch.contracts.vllm import VLLM_LORA_RANKS as LORA_RANKS
from grpo_launch.errors import UserError

PROG = "python -m grpo_launch.cpu_server"
DTYPES = {"auto": "auto", "float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
          "half": "float16"}
# vLLM's processed_* modes report the distribution actually sampled from; *_logits modes return unnormalised values,
# which nothing here needs.
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
# Where Hugging Face configs keep the context length, in the order vLLM looks for it.
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


@dataclass(frozen=True)
class ServerSettings:
    model: str
    host: str
    port: int
    served_model_names: tuple[str, ...]
    max_model_len: int
    dtype: str  # a torch dtype name: float32, bfloat16, float16
    enable_lora: bool
    max_loras: int
    max_cpu_loras: int  # adapters kept loaded at once; the least recently used is evicted past this
    max_lora_rank: int
    block_size: int
    seed: int
    max_logprobs: int  # -1: unlimited
    logprobs_mode: str
    gpu_memory_utilization: float
    weight_transfer_config: dict[str, Any] | None
    enable_prefix_caching: bool
    enforce_eager: bool
    trust_remote_code: bool
    allow_runtime_lora_updating: bool  # VLLM_ALLOW_RUNTIME_LORA_UPDATING: registers the adapter endpoints
    dev_mode: bool  # VLLM_SERVER_DEV_MODE: registers /pause, /resume, /server_info, /get_world_size

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{PROG}: {message}", hint=f"run `{PROG} --help` for the flags this CPU engine accepts")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, allow_abbrev=False, description="CPU engine for smoke tests, speaking part of vLLM's API.")
    p.add_argument("model", metavar="MODEL", help="local model directory (config, weights, tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="auto")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--max-cpu-loras", type=int, default=None)
    p.add_argument("--max-lora-rank", type=int, choices=LORA_RANKS, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="raw_logprobs")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--weight-transfer-config", default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def _env_flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "0").strip().lower() in ("1", "true")


def _model_config(model: str) -> dict[str, Any]:
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        raise UserError(f"MODEL {model!r} is not a local model directory (no config.json there)",
                        hint="this CPU engine never downloads: pass a directory holding config, weights and tokenizer")
    return json.loads(config_file.read_text())


def _context_length(config: dict[str, Any], requested: int | None) -> int:
    derived = next((config[k] for k in CONTEXT_LENGTH_KEYS if isinstance(config.get(k), int)), None)
    if derived is None:
        raise UserError("the model's config.json names no context length", hint="pass --max-model-len")
    if requested is None:
        return derived
    if not 0 < requested <= derived:
        raise UserError(f"--max-model-len {requested} must be between 1 and the model's context length {derived}")
    return requested


def _dtype(config: dict[str, Any], requested: str) -> str:
    if DTYPES[requested] != "auto":
        return DTYPES[requested]
    configured = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return DTYPES.get(configured.removeprefix("torch."), "float32")


def parse_settings(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> ServerSettings:
    """Flags and environment -> settings; every mistake is a `UserError` (exit 2)."""
    args = _parser().parse_args(list(argv))
    if args.tensor_parallel_size != 1:
        raise UserError(f"--tensor-parallel-size {args.tensor_parallel_size}: this CPU engine runs one process",
                        hint="pass --tensor-parallel-size 1")
    if args.max_loras < 1:
        raise UserError(f"--max-loras {args.max_loras} must be at least 1")
    max_cpu_loras = args.max_cpu_loras if args.max_cpu_loras is not None else args.max_loras
    if max_cpu_loras < args.max_loras:
        raise UserError(f"--max-cpu-loras {max_cpu_loras} must be at least --max-loras {args.max_loras}")
    try:
        weight_transfer = json.loads(args.weight_transfer_config) if args.weight_transfer_config else None
    except json.JSONDecodeError as error:
        raise UserError(f"--weight-transfer-config is not JSON: {error}") from None
    config = _model_config(args.model)
    return ServerSettings(
        model=args.model, host=args.host, port=args.port,
        served_model_names=tuple(args.served_model_name or [args.model]),
        max_model_len=_context_length(config, args.max_model_len), dtype=_dtype(config, args.dtype),
        enable_lora=args.enable_lora, max_loras=args.max_loras, max_cpu_loras=max_cpu_loras,
        max_lora_rank=args.max_lora_rank, block_size=args.block_size, seed=args.seed,
        max_logprobs=args.max_logprobs, logprobs_mode=args.logprobs_mode,
        gpu_memory_utilization=args.gpu_memory_utilization, weight_transfer_config=weight_transfer,
        enable_prefix_caching=args.enable_prefix_caching, enforce_eager=args.enforce_eager,
        trust_remote_code=args.trust_remote_code,
        allow_runtime_lora_updating=_env_flag(environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
        dev_mode=_env_flag(environ, "VLLM_SERVER_DEV_MODE"))
