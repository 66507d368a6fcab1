"""Plan-time checks of the recipe's parts that no placement owns: hosts, secrets, data, built-in names."""

from __future__ import annotations

import re

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.builtins import BUILTIN_MODEL_PREFIX, HELD_OUT, MODELS, REWARDS, TASKS
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.memory.catalog import resolve

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|(^|_)KEY($|_)", re.IGNORECASE)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


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


def check_data(config: Config) -> None:
    d = config.data
    if d.source == "builtin" and d.path not in TASKS:
        raise UserError(f"unknown built-in task '{d.path}'{did_you_mean(d.path, TASKS)}", key="data.path",
                        hint=f"built-in tasks: {', '.join(TASKS)}")
    if d.source == "files" and not d.path.endswith(DATA_SUFFIXES):
        raise UserError(f"data.path '{d.path}' is not a {'/'.join(DATA_SUFFIXES)} file or glob", key="data.path",
                        hint="use data.source=hub for a dataset on the hub")
    if d.eval is None:
        if d.eval_samples is not None:
            raise UserError("data.eval_samples is set but data.eval is not", key="data.eval_samples",
                            hint="set data.eval (a split, a file, or held-out for a built-in task), or drop it")
        if config.trainer.get("eval_strategy", "no") != "no":
            raise UserError(f"trainer.eval_strategy={config.trainer['eval_strategy']} evaluates, but data.eval names "
                            f"no held-out prompts", key="trainer.eval_strategy",
                            hint="set data.eval (a split, a file, or held-out for a built-in task)")
    elif d.eval == HELD_OUT:
        return
    elif d.source == "builtin":
        raise UserError(f"data.eval={d.eval!r}: a built-in task's held-out rows are '{HELD_OUT}'", key="data.eval",
                        hint=f"data.eval={HELD_OUT}")
    elif d.source == "files" and not d.eval.endswith(DATA_SUFFIXES):
        raise UserError(f"data.eval '{d.eval}' is not a {'/'.join(DATA_SUFFIXES)} file or glob", key="data.eval",
                        hint=f"a file of the same format, or {HELD_OUT} (the data's last rows, which training then "
                             f"skips)")


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
