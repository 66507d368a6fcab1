"""Names of built-in parts a recipe can pick, and where each lives. Pure: plan checks names without importing them."""

from __future__ import annotations

from grpo_launch.errors import UserError, did_you_mean

# reward name -> "module:function"; the trainer imports the function.
REWARDS = {
    "accuracy": "trl.rewards:accuracy_reward",            # math-verify against the `solution` column
    "think_format": "trl.rewards:think_format_reward",    # <think>...</think> then an answer
    "length_penalty": "grpo_launch.rewards:length_penalty",
    "sevens": "grpo_launch.rewards:sevens",               # the tiny task's reward
}

# built-in dataset name -> "module:function" building it offline.
TASKS = {"sevens": "grpo_launch.tasks:sevens"}

# built-in model name (model.name_or_path=builtin:NAME) -> "module:function" writing it to a directory.
MODELS = {"tiny": "grpo_launch.tiny_model:build"}
BUILTIN_MODEL_PREFIX = "builtin:"


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
