"""The processes every placement builds from: the trainer launchers, `vllm serve`, the prepare steps."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import tiny
from grpo_launch.contracts.builtins import BUILTIN_MODEL_DIR, MODELS
from grpo_launch.contracts.plan import Diagnosis, Liveness, PrepareStep, ProcessSpec
from grpo_launch.contracts.rundir import ACCELERATE_FILE
from grpo_launch.errors import UserError
from grpo_launch.plan.checks import builtin_model
from grpo_launch.plan.context import Context
from grpo_launch.plan.layout import Layout

TRAINER_MODULE = "grpo_launch.trainer"
# vLLM's CPU attention takes KV-cache blocks of a multiple of this many tokens only (`No common block size`).
CPU_BLOCK_MULTIPLE = 32
# `vllm serve`'s batch limits by GPU size (vllm/engine/arg_utils.py get_batch_defaults): (max_num_batched_tokens,
# max_num_seqs) on GPUs of at least LARGE_GPU_GIB, and below.
SERVE_BATCH_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}
LARGE_GPU_GIB = 70


def model_path(config: Config) -> str:
    """What every process loads: the built-in model's directory in the run, or the hub id / local path."""
    return BUILTIN_MODEL_DIR if builtin_model(config.model.name_or_path) else config.model.name_or_path


def prepare_steps(config: Config) -> tuple[PrepareStep, ...]:
    """Work done once before any process starts: building a built-in model (it needs torch, so not in-process)."""
    name = builtin_model(config.model.name_or_path)
    if name is None:
        return ()
    t = config.model.tiny
    argv = ("python", "-m", MODELS[name], "--out", BUILTIN_MODEL_DIR, "--hidden-size",
            str(t.hidden_size), "--num-layers", str(t.num_layers), "--num-heads", str(t.num_heads),
            "--num-kv-heads", str(t.num_kv_heads), "--max-position-embeddings", str(t.max_position_embeddings),
            "--seed", str(config.seed))
    # The build is a function of its arguments and of the model description: built once, kept between runs.
    what = json.dumps([argv, tiny.BUILD_FORMAT, tiny.MODEL_TYPE, tiny.VOCABULARY, tiny.CHAT_TEMPLATE])
    return (PrepareStep(name=f"{name}-model", argv=argv, creates=BUILTIN_MODEL_DIR,
                        cache_key=f"{name}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"),)


def base_env(config: Config, gpus: tuple[int, ...]) -> dict[str, str]:
    env = dict(config.env.set)
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: CPU runs (and CPU-side processes) never grab one.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus)) if config.cluster.accelerator == "cuda" else ""
    if builtin_model(config.model.name_or_path):  # everything is local: nothing may reach for the hub
        env |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return env


def rendezvous_diagnoses(main_ip: str, port: int, timeout_s: float) -> tuple[Diagnosis, ...]:
    """torch.distributed's errors when the nodes' rendezvous does not complete, and what they mean (the errors,
    not the warnings of connection attempts it retries)."""
    where, key = f"{main_ip}:{port}", "run.rendezvous_timeout_s"
    return (
        Diagnosis(r"DistStoreError: Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined",
                  f"the trainer rendezvous at {where} did not complete within {timeout_s:g} s ({key}): not every "
                  f"trainer node joined; start each node's `grpo run --node-rank K` within that time"),
        Diagnosis(r"DistNetworkError: The client socket has timed out after \d+ms while trying to connect to",
                  f"trainer node 0's rendezvous at {where} did not answer within {timeout_s:g} s ({key}): start "
                  f"node 0, and check that {main_ip} is this node's way to reach it"),
    )


def vllm_env(config: Config) -> dict[str, str]:
    """What a process running a vLLM engine needs beyond its base environment. On a CPU: the KV cache's size in
    host memory (gpu_memory_utilization means nothing there) and the engine in the API server's own process
    (one process less per engine, about 0.5 GiB)."""
    if config.cluster.accelerator != "cpu":
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": str(config.vllm.cpu_kvcache_space_gib), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def trainer_processes(ctx: Context, layout: Layout, depends_on: tuple[str, ...], extra_env: dict[str, str],
                      secrets: tuple[str, ...]) -> list[ProcessSpec]:
    """One launcher per trainer node: accelerate (reading accelerate.yaml) or torchrun. Several nodes rendezvous
    at trainer node 0 within run.rendezvous_timeout_s. `secrets`: variables it reads besides env.passthrough."""
    config = ctx.config
    machines = len(layout.trainer_nodes)
    main_ip = ctx.host(layout.trainer_nodes[0])
    port = config.run.main_process_port
    ctx.ports.claim(layout.trainer_nodes[0], port, "the trainer rendezvous", "run.main_process_port")
    timeout = config.run.rendezvous_timeout_s
    rendezvous = ["--rdzv_conf", f"timeout={math.ceil(timeout)}"] if machines > 1 else []
    entry = ("-m", TRAINER_MODULE, "--run-dir", ".")
    out = []
    for machine_rank, node in enumerate(layout.trainer_nodes):
        if config.launcher == "accelerate":
            argv = ["accelerate", "launch", "--config_file", ACCELERATE_FILE]
            if machines > 1:  # the address on the command line too: a scheduler's job may give it at run time
                argv += ["--machine_rank", str(machine_rank), "--main_process_ip", main_ip, *rendezvous]
        else:
            argv = ["torchrun", "--nnodes", str(machines), "--node_rank", str(machine_rank),
                    "--nproc_per_node", str(len(layout.trainer_gpus)), "--master_addr", main_ip,
                    "--master_port", str(port), *rendezvous]
        name = "trainer" if machines == 1 else f"trainer-node{node}"
        out.append(ProcessSpec(name=name, role="trainer", node=node, gpus=layout.trainer_gpus,
                               argv=tuple(argv) + entry, env=base_env(config, layout.trainer_gpus) | extra_env,
                               pass_env=tuple(dict.fromkeys([*config.env.passthrough, *secrets])),
                               depends_on=depends_on,
                               ranks=layout.ranks_on(node),
                               diagnoses=rendezvous_diagnoses(main_ip, port, timeout) if machines > 1 else (),
                               exit_timeout_s=config.run.exit_timeout_s if machines > 1 else None))
    return out


def watched(config: Config, processes: tuple[ProcessSpec, ...]) -> tuple[ProcessSpec, ...]:
    """Every process with a readiness URL is probed there once it is ready (run.health_*): a server that stops
    answering is noticed within `Liveness.bound_s`, not when the trainer fails."""
    r = config.run
    liveness = Liveness(interval_s=r.health_interval_s, timeout_s=r.health_interval_s, failures=r.health_failures)
    return tuple(dataclasses.replace(p, liveness=liveness) if p.ready_url else p for p in processes)


def vllm_serve_argv(config: Config, *, bind: str, port: int, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`vllm serve` with the flags TRL 1.16's trainers need (what `trl vllm-serve` would exec), on GPUs and CPUs
    alike."""
    v, m = config.vllm, config.model
    argv = ["vllm", "serve", model_path(config), "--host", bind, "--port", str(port),
            "--tensor-parallel-size", str(v.tensor_parallel_size)]
    if config.cluster.accelerator == "cuda":  # a CPU's KV cache is sized by VLLM_CPU_KVCACHE_SPACE (`vllm_env`)
        argv += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    argv += ["--dtype", m.dtype]
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
    if config.cluster.accelerator == "cuda":  # TRL's weight sync; on a CPU weights are reloaded from files
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    argv += ["--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    return tuple(argv) + extra + tuple(v.extra_args)


def check_cpu_block_size(config: Config) -> None:
    if config.cluster.accelerator == "cpu" and config.vllm.block_size % CPU_BLOCK_MULTIPLE:
        raise UserError(f"vllm.block_size={config.vllm.block_size}: vLLM's CPU attention takes KV-cache blocks of a "
                        f"multiple of {CPU_BLOCK_MULTIPLE} tokens only, and the engine would not start",
                        key="vllm.block_size", hint=f"set vllm.block_size={CPU_BLOCK_MULTIPLE} (cluster=cpu's default)")


def serve_batch_limits(config: Config) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of one `vllm serve` engine on this cluster's GPUs."""
    return SERVE_BATCH_DEFAULTS[config.cluster.gpu_memory_gib >= LARGE_GPU_GIB]


def require_servers(config: Config, placement: str) -> None:
    """A placement that generates with servers needs them enabled, and has no sleep mode."""
    if not config.vllm.enabled:
        raise UserError(f"placement {placement} generates with vLLM servers but vllm.enabled=false",
                        key="vllm.enabled", hint="set vllm.enabled=true, or use placement=colocate to generate "
                                                 "with transformers inside the trainer")
    if config.vllm.sleep_level:
        raise UserError(f"vllm.sleep_level={config.vllm.sleep_level} only applies to placement=colocate: a "
                        f"server keeps its own GPUs", key="vllm.sleep_level", hint="set vllm.sleep_level=0")
