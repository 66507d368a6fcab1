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

# Every `vllm serve` of a plan requires the run's key on every route but /health: the variable holding it (its value
# is made per run where `grpo run` starts every node, or taken from the environment; passed by environment only, and
# only its name is ever written). The proxy, the trainer and the supervisor's probes send it.
REPLICA_KEY_ENV = "GRPO_VLLM_API_KEY"
REPLICA_KEY_BYTES = 32  # a made key: 256 bits, URL-safe base64 (43 characters, sent as is in a header or a URL)
# vLLM's own --api-key (or VLLM_API_KEY) guards only the paths under /v1, /v2, /inference and /cohere
# (vllm/entrypoints/serve/middleware/authenticate.py, vLLM 0.31): /collective_rpc, /pause, /resume, /sleep,
# /wake_up, /reset_prefix_cache, /server_info and the weight-update routes that dev mode opens for TRL answer anyone.
# So grpo-launch gives vLLM an ASGI middleware of its own (`vllm serve --middleware`) that guards every route.
REPLICA_GUARD = "grpo_launch.contracts.vllm_guard.ReplicaKeyGuard"
UNGUARDED_PATHS = ("/health",)  # liveness only, changes nothing: asked by probes and schedulers that hold no key


def unguarded(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A `vllm serve` command line without the guard: for an image grpo-launch is not installed in, behind a
    scheduler that guards the port itself."""
    at = argv.index("--middleware") if "--middleware" in argv else -1
    return argv if at < 0 or argv[at + 1] != REPLICA_GUARD else argv[:at] + argv[at + 2:]
