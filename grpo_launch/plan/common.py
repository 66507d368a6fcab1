"""What every placement shares: host addresses, process environments, the trainer launch commands, vLLM servers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from grpo_launch import builtins
from grpo_launch.errors import UserError
from grpo_launch.plan.documents import ACCELERATE_FILE
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.ports import PortBook
from grpo_launch.plan.types import Engine, PrepareStep, ProcessSpec
from grpo_launch.schema import Config

TRAINER_MODULE = "grpo_launch.train"
BUILTIN_MODEL_DIR = "model"  # built-in models are made inside the run directory, so a run is self-contained
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|(^|_)KEY($|_)", re.IGNORECASE)
# Ranks allowed by vLLM's --max-lora-rank (vllm/config/lora.py).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class Context:
    """Shared, per-plan state a placement reads and adds to."""

    config: Config
    ports: PortBook = field(default_factory=PortBook)
    warnings: list[str] = field(default_factory=list)

    @property
    def single_node(self) -> bool:
        return self.config.cluster.nodes == 1

    def host(self, node: int) -> str:
        hosts = self.config.cluster.hosts
        if hosts:
            return hosts[node]
        return "127.0.0.1" if self.single_node else f"node{node}"

    def bind_address(self) -> str:
        """Servers listen on loopback when everything runs on one machine, on every interface otherwise."""
        return "127.0.0.1" if self.single_node else "0.0.0.0"


@dataclass
class PlacementResult:
    layout: Layout
    engines: list[Engine]
    services: list[ProcessSpec]          # vLLM servers and the proxy, in start order
    trainer_args: dict[str, Any]         # the TRL arguments this placement decides
    trainer_depends_on: tuple[str, ...]  # services the trainer waits for
    vllm: dict[str, Any]                 # resolved vLLM settings for the plan view and JSON
    fsdp2: bool = False


def model_path(config: Config) -> str:
    """What every process loads: the built-in model's directory in the run, or the hub id / local path."""
    return BUILTIN_MODEL_DIR if builtins.builtin_model(config.model.name_or_path) else config.model.name_or_path


def prepare_steps(config: Config) -> tuple[PrepareStep, ...]:
    """Work done once before any process starts: building a built-in model (it needs torch, so not in-process)."""
    if builtins.builtin_model(config.model.name_or_path) is None:
        return ()
    t = config.model.tiny
    argv = ("python", "-m", "grpo_launch.tiny_model", "--out", BUILTIN_MODEL_DIR, "--hidden-size",
            str(t.hidden_size), "--num-layers", str(t.num_layers), "--num-heads", str(t.num_heads),
            "--num-kv-heads", str(t.num_kv_heads), "--max-position-embeddings", str(t.max_position_embeddings),
            "--seed", str(config.seed))
    return (PrepareStep(name="tiny-model", argv=argv, creates=BUILTIN_MODEL_DIR),)


def check_hosts(config: Config) -> None:
    hosts = config.cluster.hosts
    if hosts and len(hosts) != config.cluster.nodes:
        raise UserError(f"cluster.hosts lists {len(hosts)} address(es) for {config.cluster.nodes} node(s)",
                        key="cluster.hosts", hint="give one address per node, node 0 first, or leave it empty")


def check_env(config: Config) -> None:
    for name in config.env.set:
        if SECRET_NAME.search(name):
            raise UserError(f"env.set.{name} looks like a secret; values in env.set are written to the run "
                            f"directory", key=f"env.set.{name}",
                            hint=f"remove it from env.set and add '{name}' to env.passthrough: its value is then "
                                 f"read from your shell by name and never written")


def base_env(config: Config, gpus: tuple[int, ...]) -> dict[str, str]:
    env = dict(config.env.set)
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: CPU runs (and CPU-side processes) never grab one.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus)) if config.cluster.accelerator == "cuda" else ""
    return env


def trainer_processes(ctx: Context, layout: Layout, depends_on: tuple[str, ...]) -> list[ProcessSpec]:
    """One launcher per trainer node: accelerate (reading accelerate.yaml) or torchrun."""
    config = ctx.config
    machines = len(layout.trainer_nodes)
    main_ip = ctx.host(layout.trainer_nodes[0])
    port = config.run.main_process_port
    ctx.ports.claim(layout.trainer_nodes[0], port, "the trainer rendezvous", "run.main_process_port")
    entry = ("-m", TRAINER_MODULE, "--run-dir", ".")
    out = []
    for machine_rank, node in enumerate(layout.trainer_nodes):
        if config.launcher == "accelerate":
            argv = ["accelerate", "launch", "--config_file", ACCELERATE_FILE]
            if machines > 1:
                argv += ["--machine_rank", str(machine_rank)]
        else:
            argv = ["torchrun", "--nnodes", str(machines), "--node_rank", str(machine_rank),
                    "--nproc_per_node", str(len(layout.trainer_gpus)), "--master_addr", main_ip,
                    "--master_port", str(port)]
        name = "trainer" if machines == 1 else f"trainer-node{node}"
        out.append(ProcessSpec(name=name, role="trainer", node=node, gpus=layout.trainer_gpus,
                               argv=tuple(argv) + entry, env=base_env(config, layout.trainer_gpus),
                               pass_env=tuple(config.env.passthrough), depends_on=depends_on,
                               ranks=layout.ranks_on(node)))
    return out


SERVER_COMMANDS = {"vllm": ("vllm", "serve"), "cpu-smoke": ("python", "-m", "grpo_launch.cpu_server")}


def vllm_serve_argv(config: Config, *, bind: str, port: int, gpu_memory_utilization: float,
                    extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`vllm serve` with the flags TRL 1.16's trainers need (what `trl vllm-serve` would exec); the CPU smoke
    engine takes the same flags."""
    v, m = config.vllm, config.model
    argv = [*SERVER_COMMANDS[v.server], model_path(config), "--host", bind, "--port", str(port),
            "--tensor-parallel-size", str(v.tensor_parallel_size),
            "--gpu-memory-utilization", str(gpu_memory_utilization), "--dtype", m.dtype]
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
    argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"}),
             "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    return tuple(argv) + extra + tuple(v.extra_args)


def require_servers(config: Config, placement: str) -> None:
    """A placement that generates with servers needs them enabled, and vLLM itself needs GPUs."""
    if not config.vllm.enabled:
        raise UserError(f"placement {placement} generates with vLLM servers but vllm.enabled=false",
                        key="vllm.enabled", hint="set vllm.enabled=true, or use placement=colocate to generate "
                                                 "with transformers inside the trainer")
    if config.cluster.accelerator == "cpu" and config.vllm.server == "vllm":
        hint = "pick a GPU cluster (cluster=1x8-h100-80gb), or placement=colocate with vllm.enabled=false on CPU"
        if placement == "async-lora":
            hint += ", or vllm.server=cpu-smoke (the CPU smoke-test engine)"
        raise UserError(f"placement {placement} runs vLLM servers, which need GPUs (cluster.accelerator=cpu)",
                        key="cluster.accelerator", hint=hint)
    if config.vllm.sleep_level:
        raise UserError(f"vllm.sleep_level={config.vllm.sleep_level} only applies to placement=colocate: a "
                        f"server keeps its own GPUs", key="vllm.sleep_level", hint="set vllm.sleep_level=0")
