"""/server_info: the slice of vLLM's resolved `VllmConfig` that clients read, from this server's settings.

TRL's async GRPO reads `lora_config` (null without --enable-lora), `parallel_config.data_parallel_size` and
`model_config.dtype` (a stringified torch dtype, "torch.float32"); the proxy and launcher may read the rest.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from grpo_launch.cpu_server.settings import ServerSettings

ENGINE = "grpo_launch.cpu_server (CPU engine for smoke tests, not vLLM)"


def vllm_config(settings: ServerSettings) -> dict[str, Any]:
    lora = None
    if settings.enable_lora:
        lora = {"max_loras": settings.max_loras, "max_cpu_loras": settings.max_cpu_loras,
                "max_lora_rank": settings.max_lora_rank, "fully_sharded_loras": False, "lora_dtype": "auto"}
    return {
        "model_config": {
            "model": settings.model, "served_model_name": settings.served_model_name,
            "max_model_len": settings.max_model_len, "dtype": f"torch.{settings.dtype}", "seed": settings.seed,
            "max_logprobs": settings.max_logprobs, "logprobs_mode": settings.logprobs_mode,
            "trust_remote_code": settings.trust_remote_code, "enforce_eager": settings.enforce_eager,
        },
        "cache_config": {"block_size": settings.block_size, "enable_prefix_caching": settings.enable_prefix_caching,
                         "gpu_memory_utilization": settings.gpu_memory_utilization},
        "parallel_config": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1,
                            "world_size": 1},
        "device_config": {"device": "cpu"},
        "lora_config": lora,
        "weight_transfer_config": settings.weight_transfer_config,
    }


def server_info(settings: ServerSettings, config_format: str) -> dict[str, Any]:
    config = vllm_config(settings)
    return {
        "engine": ENGINE,
        "vllm_config": config if config_format == "json" else repr(config),
        "vllm_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_") and "KEY" not in k},
        "system_env": {"os": platform.platform(), "python_version": platform.python_version(),
                       "torch_version": torch.__version__, "is_cuda_available": False},
    }
