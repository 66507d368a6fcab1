"""async-lora: TRL's AsyncGRPOTrainer trains a LoRA adapter while independent `vllm serve` replicas generate;
only the adapter travels, through a directory every replica can read, announced through the routing proxy.

One `vllm serve` per replica (not `--data-parallel-size`, whose API servers each keep their own adapter table),
the proxy in front (routing by KV prefix, broadcasting adapter loads), the trainer pointed at the proxy so TRL
sees a single server of data parallel size 1 and keeps adapter-only sync on.
"""

from __future__ import annotations

from grpo_launch.errors import UserError
from grpo_launch.plan.common import (
    VLLM_LORA_RANKS,
    Context,
    PlacementResult,
    base_env,
    model_path,
    require_servers,
    vllm_serve_argv,
)
from grpo_launch.plan.layout import dedicated_layout
from grpo_launch.plan.trainer_args import effective
from grpo_launch.plan.types import Engine, ProcessSpec

CONFIG_CLASS = "AsyncGRPOConfig"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_REPLICAS = 2
ADAPTER_SUBDIR = ".vllm_lora"  # AsyncGRPOTrainer writes trl-policy-vN under <output_dir>/.vllm_lora
ADAPTER_NAME = "trl-policy"    # ... versioned as trl-policy-v1, -v2, ...
# AsyncGRPOTrainer always runs TRL's tree attention; this picks its kernel (grpo_launch.tree_attention).
TREE_ATTENTION_KERNELS = {None: "flash-attn3 (kernels-community, downloaded from the hub)",
                          "sdpa": "torch SDPA (grpo-launch, no download)"}
UNSERVABLE_TARGETS = ("lm_head", "embed_tokens")  # TRL falls back to full-weight NCCL sync for these


def _lora_rank_slot(config) -> int:
    r = config.lora.r
    chosen = config.vllm.max_lora_rank
    if chosen is None:
        fitting = [k for k in VLLM_LORA_RANKS if k >= r]
        if not fitting:
            raise UserError(f"lora.r={r} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}", key="lora.r",
                            hint=f"use lora.r <= {VLLM_LORA_RANKS[-1]}")
        return fitting[0]
    if chosen not in VLLM_LORA_RANKS:
        raise UserError(f"vllm.max_lora_rank={chosen} is not a rank vLLM accepts", key="vllm.max_lora_rank",
                        hint=f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}, or null to derive it from lora.r")
    if chosen < r:
        raise UserError(f"vllm.max_lora_rank={chosen} is below lora.r={r}: replicas could not load the adapter",
                        key="vllm.max_lora_rank", hint=f"raise it to at least {r}, or leave it null")
    return chosen


def plan(ctx: Context) -> PlacementResult:
    config = ctx.config
    v, lora = config.vllm, config.lora
    require_servers(config, "async-lora")
    if not lora.enabled:
        raise UserError("placement async-lora syncs a LoRA adapter but lora.enabled=false", key="lora.enabled",
                        hint="set lora.enabled=true (and lora.r), or use placement=server for full-weight sync")
    bad = [m for m in lora.target_modules if m in UNSERVABLE_TARGETS]
    if bad:
        raise UserError(f"lora.target_modules includes {bad}: vLLM cannot serve adapters on the output head or the "
                        f"embeddings, and TRL would fall back to full-weight sync", key="lora.target_modules",
                        hint="target the attention and MLP projections, or ['all-linear']")
    if config.zero.stage:
        raise UserError(f"zero.stage={config.zero.stage}: AsyncGRPOTrainer trains with FSDP2 only, not DeepSpeed",
                        key="zero.stage", hint="choose zero=0; the plan writes an FSDP2 accelerate config")
    if config.proxy.api_key_env:
        raise UserError("proxy.api_key_env makes the proxy require a key that TRL's async client never sends, so "
                        "the trainer could not reach it", key="proxy.api_key_env",
                        hint="keep the proxy on 127.0.0.1 without a client key for async-lora; a standalone "
                             "`grpo proxy --api-key-env NAME` serves keyed outside clients")
    if config.model.attn_implementation not in TREE_ATTENTION_KERNELS:
        raise UserError(f"model.attn_implementation={config.model.attn_implementation}: AsyncGRPOTrainer always runs "
                        f"TRL's tree attention; only its kernel can be chosen", key="model.attn_implementation",
                        hint="leave it null (FlashAttention-3 from the hub, Hopper GPUs) or set sdpa (no download)")
    if config.launcher != "accelerate":
        raise UserError("async-lora needs launcher=accelerate: its FSDP2 setup comes from the accelerate config",
                        key="launcher", hint="set launcher=accelerate")
    staleness = effective(config.trainer, CONFIG_CLASS, "max_staleness")
    max_loras = v.max_loras if v.max_loras is not None else staleness + 2
    if max_loras < staleness + 2:
        raise UserError(f"vllm.max_loras={max_loras} must be at least trainer.max_staleness + 2 = {staleness + 2}: "
                        f"the newest adapter loads before the oldest servable one unloads", key="vllm.max_loras",
                        hint=f"set vllm.max_loras={staleness + 2} or more")
    rank_slot = _lora_rank_slot(config)
    replicas = v.data_parallel_size or DEFAULT_REPLICAS
    layout = dedicated_layout(config, engines=replicas, gpus_per_engine=v.tensor_parallel_size)
    utilization = v.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    lora_flags = ("--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(rank_slot),
                  "--served-model-name", model_path(config), "--block-size", str(v.block_size))
    engines, services = [], []
    for i, (node, gpus) in enumerate(layout.engine_gpus):
        name = f"vllm-{i}"
        port = ctx.ports.next_free(node, v.port, f"vLLM replica {i}", "vllm.port")
        url = f"http://{ctx.host(node)}:{port}"
        env = base_env(config, gpus) | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
        services.append(ProcessSpec(
            name=name, role="vllm", node=node, gpus=gpus,
            argv=vllm_serve_argv(config, bind=ctx.bind_address(), port=port, gpu_memory_utilization=utilization,
                                 extra=lora_flags),
            env=env, pass_env=tuple(config.env.passthrough), port=port, ready_url=f"{url}/health",
            ready_timeout_s=v.health_timeout_s, start_delay_s=v.stagger_s if i else 0.0))
        engines.append(Engine(index=i, node=node, gpus=gpus, process=name, url=url))

    p = config.proxy
    proxy_node = layout.trainer_nodes[0]
    proxy_port = ctx.ports.claim(proxy_node, p.port, "the routing proxy", "proxy.port")
    proxy_url = f"http://{'127.0.0.1' if p.host in ('127.0.0.1', '0.0.0.0') else p.host}:{proxy_port}"
    argv = ["grpo", "proxy", "--host", p.host, "--port", str(proxy_port)]
    for e in engines:
        argv += ["--replica", e.url]
    argv += ["--block-size", str(v.block_size), "--imbalance", str(p.imbalance),
             "--max-tracked-blocks", str(p.max_tracked_blocks), "--lora-load-timeout-s", str(p.lora_load_timeout_s),
             "--tokenizer", model_path(config)]
    secrets = (p.upstream_api_key_env,) if p.upstream_api_key_env else ()
    if p.upstream_api_key_env:
        argv += ["--upstream-api-key-env", p.upstream_api_key_env]
    services.append(ProcessSpec(
        name="proxy", role="proxy", node=proxy_node, gpus=(), argv=tuple(argv), env=base_env(config, ()),
        pass_env=tuple(dict.fromkeys([*config.env.passthrough, *secrets])), port=proxy_port,
        ready_url=f"{proxy_url}/health", ready_timeout_s=60.0, depends_on=tuple(e.process for e in engines)))

    output_dir = config.trainer.get("output_dir", "checkpoints")
    adapter_dir = f"{output_dir}/{ADAPTER_SUBDIR}"
    remote = sorted({e.node for e in engines} - {proxy_node})
    if remote:
        ctx.warnings.append(f"replicas on node(s) {remote} load adapters from {adapter_dir} written on node "
                            f"{proxy_node}: set trainer.output_dir to an absolute path on storage every node "
                            f"mounts at the same place")
    args = {"vllm_server_base_url": proxy_url}
    engine = "vllm serve" if v.server == "vllm" else "CPU smoke-test engine (not vLLM)"
    summary = {"enabled": True, "engine": f"{engine}, one per replica", "tensor_parallel_size":
               v.tensor_parallel_size, "data_parallel_size": replicas, "sleep_level": 0,
               "gpu_memory_utilization": utilization, "max_model_len": v.max_model_len, "max_loras": max_loras,
               "max_lora_rank": rank_slot, "block_size": v.block_size, "proxy_url": proxy_url,
               "adapter_dir": adapter_dir, "max_staleness": staleness}
    if config.cluster.accelerator == "cuda":
        summary["tree_attention"] = TREE_ATTENTION_KERNELS[config.model.attn_implementation]
    return PlacementResult(layout=layout, engines=engines, services=services, trainer_args=args,
                           trainer_depends_on=("proxy",), vllm=summary,
                           # AsyncGRPOTrainer trains with FSDP2; the CPU stand-in (grpo_launch.async_cpu) does not.
                           fsdp2=config.cluster.accelerator == "cuda")
