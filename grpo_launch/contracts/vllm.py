"""vLLM's names that the planner and the processes must agree on."""

# The vLLM the plan's `vllm serve` arguments are checked against (the tests run it; pyproject's vllm extra allows it):
# the official image's tag a scheduler that runs vLLM's image uses.
VLLM_VERSION = "0.31.0"
# Ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Head sizes vLLM's CPU attention has kernels for (vllm/v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vLLM's KV-cache block on GPUs (--block-size); the routing proxy must hash prompts in the replicas' block size.
DEFAULT_BLOCK_SIZE = 16
# AsyncGRPOTrainer writes each adapter version under <output_dir>/.vllm_lora/trl-policy-vN, named like that on
# every replica.
ADAPTER_SUBDIR = ".vllm_lora"
ADAPTER_NAME = "trl-policy"


def adapter_version_name(version: int) -> str:
    return f"{ADAPTER_NAME}-v{version}"
