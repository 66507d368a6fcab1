"""Plan-time checks of the recipe's parts that no placement owns: hosts, data, built-in names."""

from __future__ import annotations

import re
from collections.abc import Sequence

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.builtins import BUILTIN_MODEL_PREFIX, MODELS, REWARDS, TASKS
from grpo_launch.contracts.hosts import is_loopback
from grpo_launch.contracts.plan import ProcessSpec
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.memory.catalog import resolve

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def check_hosts(config: Config) -> None:
    hosts = config.cluster.hosts
    if hosts and len(hosts) != config.cluster.nodes:
        raise UserError(f"cluster.hosts lists {len(hosts)} address(es) for {config.cluster.nodes} node(s)",
                        key="cluster.hosts", hint="give one address per node, node 0 first, or leave it empty")


def check_data(config: Config) -> None:
    d = config.data
    if d.source == "builtin" and d.path not in TASKS:
        raise UserError(f"unknown built-in task '{d.path}'{did_you_mean(d.path, TASKS)}", key="data.path",
                        hint=f"built-in tasks: {', '.join(TASKS)}")
    if d.source == "files" and not d.path.endswith(DATA_SUFFIXES):
        raise UserError(f"data.path '{d.path}' is not a {'/'.join(DATA_SUFFIXES)} file or glob", key="data.path",
                        hint="use data.source=hub for a dataset on the hub")


def reward_target(fn: str, key: str) -> str:
    """Resolve a reward reference to 'module:function' or 'path.py:function', rejecting malformed ones."""
    if fn in REWARDS:
        return REWARDS[fn]
    if ":" not in fn:
        raise UserError(f"unknown built-in reward '{fn}'{did_you_mean(fn, REWARDS)}", key=key,
                        hint=f"built-ins: {', '.join(REWARDS)}; or 'package.module:function' or "
                             "'path/to/file.py:function'")
    where, _, func = fn.rpartition(":")
    if not where or not func.isidentifier():
        raise UserError(f"'{fn}' is not 'module:function' or 'file.py:function'", key=key)
    if not where.endswith(".py") and not all(part.isidentifier() for part in where.split(".")):
        raise UserError(f"'{where}' in '{fn}' is neither a dotted module name nor a .py file", key=key)
    return fn


def builtin_model(name_or_path: str) -> str | None:
    """The built-in model's name if `name_or_path` names one, else None; unknown built-ins are an error."""
    if not name_or_path.startswith(BUILTIN_MODEL_PREFIX):
        return None
    name = name_or_path[len(BUILTIN_MODEL_PREFIX):]
    if name not in MODELS:
        known = [BUILTIN_MODEL_PREFIX + m for m in MODELS]
        raise UserError(f"unknown built-in model '{name}'{did_you_mean(name, MODELS, prefix=BUILTIN_MODEL_PREFIX)}",
                        key="model.name_or_path", hint=f"built-ins: {', '.join(known)}")
    return name


def check_tensor_parallel(config: Config) -> None:
    """vLLM splits the attention heads across its tensor-parallel ranks and refuses a size that does not divide
    them (its ModelConfig check; the KV heads are split, or replicated when fewer than the ranks). Known here from
    the model's shape, so a 7B with TP 8 fails at plan time, not when the engine starts on the GPUs."""
    tp = config.vllm.tensor_parallel_size
    resolved = resolve(config.model) if config.vllm.enabled and tp > 1 else None
    if resolved is None:
        return
    heads, kv = resolved.shape.heads, resolved.shape.kv_heads
    fits = [t for t in range(1, heads + 1) if heads % t == 0 and (kv % t == 0 if kv >= t else t % kv == 0)]
    if tp not in fits:
        what = f"{heads} attention heads" if heads % tp else f"{kv} KV heads"
        raise UserError(f"vllm.tensor_parallel_size={tp} does not split {config.model.name_or_path}'s {what}: vLLM "
                        f"refuses it", key="vllm.tensor_parallel_size",
                        hint=f"a size vLLM accepts for this model: {', '.join(map(str, fits))}")


# A recipe's name is written into the job files (Slurm's --job-name, SkyPilot's task and cluster name) and the run
# directory's path; option files may be named anything, so the name is checked here.
RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_recipe_name(recipe: str) -> None:
    if not RECIPE_NAME.fullmatch(recipe):
        raise UserError(f"recipe name {recipe!r}: a recipe's name goes into job names and paths, so it takes "
                        f"letters, digits and . _ - only", key="recipe",
                        hint="rename the recipe's file (recipe/NAME.yaml)")


# Routes `vllm serve` opens with VLLM_SERVER_DEV_MODE=1, which TRL needs; vLLM's --api-key does not guard them.
DEV_MODE_ROUTES = "/pause, /sleep, /collective_rpc and the weight-update routes"


def exposed_dev_mode(processes: Sequence[ProcessSpec]) -> list[str]:
    """A warning for each vLLM server that listens beyond loopback with dev mode on."""
    warnings = []
    for p in processes:
        if p.env.get("VLLM_SERVER_DEV_MODE") != "1" or "--host" not in p.argv:
            continue
        bind = p.argv[p.argv.index("--host") + 1]
        if is_loopback(bind):
            continue
        warnings.append(f"{p.name} listens on {bind}:{p.port} with vLLM's dev mode on (TRL needs it): "
                        f"{DEV_MODE_ROUTES} answer anyone who can reach that port, and --api-key does not guard "
                        f"them. Keep the port closed to everyone but the job: the nodes' private network, a "
                        f"firewall, or the network isolation of the scheduler's allocation")
    return warnings
