"""Plan-time checks of the recipe's parts that no placement owns: hosts, data, built-in names."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import PurePath

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.builtins import HELD_OUT, REWARDS, TASKS
from grpo_launch.contracts.devices import Device
from grpo_launch.contracts.plan import Reward
from grpo_launch.contracts.trl_fields import effective
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.plan.model import ModelSource

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# RFC 1123: dot-separated labels of letters, digits and inner hyphens, 253 characters at most.
HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                      r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def check_hosts(config: Config) -> None:
    hosts = config.cluster.hosts
    if hosts and len(hosts) != config.cluster.nodes:
        raise UserError(f"cluster.hosts lists {len(hosts)} address(es) for {config.cluster.nodes} node(s)",
                        key="cluster.hosts", hint="give one address per node, node 0 first, or leave it empty")
    for i, host in enumerate(hosts):
        if not is_host(host):
            raise UserError(f"cluster.hosts[{i}] {host!r} is neither a hostname nor an IP address", key="cluster.hosts",
                            hint="a hostname (letters, digits, '-' and '.': node-1.cluster) or an address (10.0.0.2, "
                                 "fd00::2), without a port or a user")


def is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return HOSTNAME.fullmatch(host) is not None


def check_data(config: Config) -> None:
    d = config.data
    if d.source == "builtin" and d.path not in TASKS:
        raise UserError(f"unknown built-in task '{d.path}'{did_you_mean(d.path, TASKS)}", key="data.path",
                        hint=f"built-in tasks: {', '.join(TASKS)}")
    if d.source == "files":
        _check_data_file("data.path", d.path, hint="use data.source=hub for a dataset on the hub")
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
    elif d.source == "files":
        _check_data_file("data.eval", d.eval, hint=f"a file of the same format, or {HELD_OUT} (the data's last rows, "
                                                   f"which training then skips)")


def _check_data_file(key: str, path: str, hint: str) -> None:
    """A files source's path (or glob) names files of a format it reads."""
    if not path.endswith(DATA_SUFFIXES):
        raise UserError(f"{key} '{path}' is not a {'/'.join(DATA_SUFFIXES)} file or glob", key=key, hint=hint)


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


def check_tensor_parallel(config: Config, model: ModelSource) -> None:
    """vLLM splits the attention heads across its tensor-parallel ranks and refuses a size that does not divide
    them (its ModelConfig check; the KV heads are split, or replicated when fewer than the ranks). Known here from
    the model's shape, so a 7B with TP 8 fails at plan time, not when the engine starts on the GPUs."""
    tp = config.vllm.tensor_parallel_size
    resolved = model.resolved if config.vllm.enabled and tp > 1 else None
    if resolved is None:
        return
    heads, kv = resolved.shape.heads, resolved.shape.kv_heads
    fits = [t for t in range(1, heads + 1) if heads % t == 0 and (kv % t == 0 if kv >= t else t % kv == 0)]
    if tp not in fits:
        what = f"{heads} attention heads" if heads % tp else f"{kv} KV heads"
        raise UserError(f"vllm.tensor_parallel_size={tp} does not split {config.model.name_or_path}'s {what}: vLLM "
                        f"refuses it", key="vllm.tensor_parallel_size",
                        hint=f"a size vLLM accepts for this model: {', '.join(map(str, fits))}")


def check_reward_files(rewards: Sequence[Reward]) -> None:
    """Reward files are copied into the run's rewards/ and imported there by their file name, so each name is a
    module name, and no two are the same."""
    seen: dict[str, int] = {}
    for i, reward in enumerate(rewards):
        where = reward.target.rpartition(":")[0]
        if not where.endswith(".py"):
            continue
        stem = PurePath(where).stem
        if not stem.isidentifier():
            raise UserError(f"rewards[{i}].fn names {where}, whose name '{stem}' is not a Python module name: the "
                            f"trainer imports it by that name", key=f"rewards[{i}].fn",
                            hint="rename the file with letters, digits and '_' only")
        if stem in seen:
            raise UserError(f"rewards[{seen[stem]}].fn and rewards[{i}].fn are both files named {stem}.py: the "
                            f"run's rewards/ holds one of each name", key=f"rewards[{i}].fn",
                            hint="rename one of them")
        seen[stem] = i


def check_model_shape(config: Config, model: ModelSource, device: Device) -> None:
    """The built-in tiny model's heads split its hidden size (and its KV heads its heads), as transformers needs;
    where vLLM serves a model on a device with a few attention kernels (a CPU), its head size is one of them."""
    tiny = model.builtin is not None
    t = config.model.tiny
    if tiny and t.hidden_size % t.num_heads:
        raise UserError(f"model.tiny.num_heads={t.num_heads} does not divide model.tiny.hidden_size={t.hidden_size}",
                        key="model.tiny.num_heads", hint=f"heads that divide it: {_divisors(t.hidden_size)}")
    if tiny and t.num_heads % t.num_kv_heads:
        raise UserError(f"model.tiny.num_kv_heads={t.num_kv_heads} does not divide model.tiny.num_heads="
                        f"{t.num_heads}", key="model.tiny.num_kv_heads", hint=f"KV heads that divide it: "
                                                                               f"{_divisors(t.num_heads)}")
    sizes = device.head_sizes
    resolved = model.resolved if config.vllm.enabled and sizes is not None else None
    if resolved is None or resolved.shape.head_dim in sizes:
        return
    head, served = resolved.shape.head_dim, ", ".join(map(str, sizes))
    if tiny:
        fits = [h for h in range(1, t.hidden_size + 1) if t.hidden_size % h == 0 and t.hidden_size // h in sizes]
        raise UserError(f"the tiny model's head size (hidden_size / num_heads = {t.hidden_size} / {t.num_heads} = "
                        f"{head}) is one vLLM's {device.label} attention cannot serve", key="model.tiny.num_heads",
                        hint=f"head sizes it serves: {served}; " +
                             (f"with hidden_size={t.hidden_size}: num_heads={' or '.join(map(str, fits))}" if fits
                              else f"no num_heads gives one with hidden_size={t.hidden_size}: use a multiple of "
                                   f"{min(sizes)}"))
    raise UserError(f"{config.model.name_or_path} has a head size of {head}, which vLLM's {device.label} attention "
                    f"cannot serve", key="model.name_or_path", hint=f"head sizes it serves: {served}")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def prompt_room(config: Config, config_class: str, model_context: int | None) -> int | None:
    """The tokens a prompt may take beside a whole completion in what vLLM serves (vllm.max_model_len, else the
    model's context); None when vLLM does not serve or the context is unknown."""
    served = config.vllm.max_model_len or model_context
    completion = effective(config.trainer, config_class, "max_completion_length")
    if not config.vllm.enabled or served is None or completion is None:
        return None
    return served - completion


def check_context(config: Config, config_class: str, model: ModelSource) -> None:
    """What vLLM serves, `vllm.max_model_len` or else the model's context, holds a prompt and a whole completion;
    vLLM refuses a `max_model_len` beyond the model's context."""
    if not config.vllm.enabled:
        return
    asked = config.vllm.max_model_len
    if asked is not None and model.context is not None and asked > model.context:
        raise UserError(f"vllm.max_model_len={asked} is beyond {model.context_key} of {model.context} tokens: vLLM "
                        f"refuses it", key="vllm.max_model_len",
                        hint=f"set it to at most {model.context}, or null for the model's")
    room = prompt_room(config, config_class, model.context)
    if room is None or room > 0:
        return
    completion = effective(config.trainer, config_class, "max_completion_length")
    where = f"vllm.max_model_len={asked}" if asked else f"the model's context of {model.context} tokens"
    raise UserError(f"trainer.max_completion_length={completion} leaves no room for a prompt in {where}",
                    key="vllm.max_model_len" if asked else "trainer.max_completion_length",
                    hint=f"raise vllm.max_model_len above {completion} + the longest prompt, or lower "
                         f"trainer.max_completion_length")


# A recipe's name is written into the job files (Slurm's --job-name, SkyPilot's task and cluster name) and the run
# directory's path; option files may be named anything, so the name is checked here.
RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_recipe_name(recipe: str) -> None:
    if not RECIPE_NAME.fullmatch(recipe):
        raise UserError(f"recipe name {recipe!r}: a recipe's name goes into job names and paths, so it takes "
                        f"letters, digits and . _ - only", key="recipe",
                        hint="rename the recipe's file (recipe/NAME.yaml)")

