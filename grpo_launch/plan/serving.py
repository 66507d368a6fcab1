"""vLLM serving: the `vllm serve` processes the server and async-lora placements start, with the flags TRL's
trainers need (what `trl vllm-serve` would exec), on GPUs and CPUs alike. Every one requires the run's key on every
route but /health (contracts.vllm_guard), which its clients and the supervisor's probes send."""

from __future__ import annotations

import dataclasses

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.devices import Device
from grpo_launch.contracts.plan import Engine, Liveness, ProcessSpec, Restart, Role
from grpo_launch.contracts.vllm import REPLICA_GUARD, REPLICA_KEY_ENV
from grpo_launch.errors import UserError
from grpo_launch.plan.context import Context

# `vllm serve`'s batch limits by GPU size (vllm/engine/arg_utils.py get_batch_defaults): (max_num_batched_tokens,
# max_num_seqs) on GPUs of at least LARGE_GPU_GIB, and below.
SERVE_BATCH_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}
LARGE_GPU_GIB = 70
# Weight transfer (NCCL), weight reload (/collective_rpc) and runtime LoRA endpoints are dev-mode only.
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


def vllm_serve_argv(ctx: Context, *, bind: str, port: int, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    v, m = ctx.config.vllm, ctx.config.model
    argv = ["vllm", "serve", ctx.model.path, "--host", bind, "--port", str(port),
            "--tensor-parallel-size", str(v.tensor_parallel_size),
            *ctx.device.memory_flags(v.gpu_memory_utilization), "--dtype", m.dtype]
    if m.revision is not None:
        argv += ["--revision", m.revision]
    if v.max_model_len is not None:
        argv += ["--max-model-len", str(v.max_model_len)]
    if v.enable_prefix_caching is not None:
        argv += ["--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching"]
    if v.enforce_eager:
        argv += ["--enforce-eager"]
    if m.trust_remote_code:
        argv += ["--trust-remote-code"]
    argv += ctx.device.serve_flags()
    argv += ["--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--middleware", REPLICA_GUARD]
    return tuple(argv) + extra + tuple(v.extra_args)


def served_engine(ctx: Context, index: int, name: str, owner: str, node: int, gpus: tuple[int, ...], *,
                  extra_flags: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
                  start_delay_s: float = 0.0, restart: Restart | None = None) -> tuple[ProcessSpec, Engine]:
    """One `vllm serve` on `gpus` of `node`, on the first free port from vllm.port, gated on its /health."""
    v = ctx.config.vllm
    port = ctx.ports.next_free(node, v.port, owner, "vllm.port")
    url = f"http://{ctx.hosts[node]}:{port}"
    env = ctx.env(gpus) | ctx.device.engine_env(v.cpu_kvcache_space_gib) | DEV_MODE | (extra_env or {})
    spec = ProcessSpec(name=name, role=Role.VLLM, node=node, gpus=gpus,
                       argv=vllm_serve_argv(ctx, bind=ctx.bind, port=port, extra=extra_flags),
                       env=env, pass_env=tuple(dict.fromkeys([*ctx.config.env.passthrough, REPLICA_KEY_ENV])),
                       port=port, ready_url=f"{url}/health", ready_timeout_s=v.health_timeout_s,
                       start_delay_s=start_delay_s, restart=restart, metrics_url=f"{url}/metrics",
                       probe_key_env=REPLICA_KEY_ENV)
    return spec, Engine(index=index, node=node, gpus=gpus, process=name, url=url)


def watched(config: Config, processes: tuple[ProcessSpec, ...]) -> tuple[ProcessSpec, ...]:
    """Every process with a readiness URL is probed there once it is ready (run.health_*): a server that stops
    answering is noticed within `Liveness.bound_s`, not when the trainer fails."""
    r = config.run
    liveness = Liveness(interval_s=r.health_interval_s, timeout_s=r.health_interval_s, failures=r.health_failures)
    return tuple(dataclasses.replace(p, liveness=liveness) if p.ready_url else p for p in processes)


def serve_batch_limits(config: Config) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of one `vllm serve` engine on this cluster's GPUs."""
    return SERVE_BATCH_DEFAULTS[config.cluster.gpu_memory_gib >= LARGE_GPU_GIB]


def check_servers_enabled(config: Config, placement: str) -> None:
    """A placement that generates with servers needs them enabled."""
    if not config.vllm.enabled:
        raise UserError(f"placement {placement} generates with vLLM servers but vllm.enabled=false",
                        key="vllm.enabled", hint="set vllm.enabled=true, or use placement=colocate to generate "
                                                 "with transformers inside the trainer")


def check_block_size(config: Config, device: Device) -> None:
    """vLLM's attention on some devices takes KV-cache blocks of a multiple of a size only."""
    block, multiple = config.vllm.block_size, device.block_multiple
    if block % multiple:
        raise UserError(f"vllm.block_size={block}: vLLM's {device.label} attention takes KV-cache blocks of a "
                        f"multiple of {multiple} tokens only, and the engine would not start", key="vllm.block_size",
                        hint=f"set vllm.block_size={multiple} (cluster={device.name}'s default)")
