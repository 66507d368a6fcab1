"""The recipe's `trainer.*` checked against TRL's fields (`contracts.trl_fields`), without importing TRL: names the
pinned TRL's config class lacks (a removed field or another trainer's is named as such), values of a kind it does not
accept, and values TRL or the libraries under it would refuse or misuse (`BOUNDS`).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from grpo_launch.compose.origins import shown
from grpo_launch.contracts.knobs import violation
from grpo_launch.contracts.trl_fields import CONFIG_CLASSES, TrlField, fields_of, trl_version
from grpo_launch.errors import UserError, collect, did_you_mean

# Fields TRL removed that old recipes and blog posts still set, with what replaced them.
REMOVED_FIELDS = {
    "max_prompt_length": "removed in TRL 0.28 (prompts are no longer truncated); bound the context with "
                         "vllm.max_model_len",
    "use_peft": "grpo-launch configures LoRA through lora.enabled",
}
# Values TRL (or transformers, torch and vLLM under it) refuses once the trainer starts, or takes and then trains
# wrongly: name -> (bounds as a knob declares them, values allowed beside them, why). A number is finite besides.
BOUNDS: dict[str, tuple[dict[str, float], tuple[Any, ...], str]] = {
    "learning_rate": ({"gt": 0}, (), "torch's optimizers refuse a negative rate, and 0 trains nothing"),
    "per_device_train_batch_size": ({"ge": 1}, (), "each rank trains on at least one completion a step"),
    "per_device_eval_batch_size": ({"ge": 1}, (), "each rank evaluates at least one completion a step"),
    "gradient_accumulation_steps": ({"ge": 1}, (), "transformers divides the loss by it"),
    "max_completion_length": ({"ge": 1}, (), "a completion has at least one token"),
    "max_steps": ({"ge": 1}, (-1,), "or -1 (TRL's default), which trains for trainer.num_train_epochs, as "
                                    "transformers takes 0 and anything else below 1"),
    "num_train_epochs": ({"gt": 0}, (), "0 trains nothing"),
    "logging_steps": ({"gt": 0}, (), "transformers refuses 0 (a value below 1 is a fraction of the run)"),
    "save_steps": ({"gt": 0}, (), "transformers refuses 0 (a value below 1 is a fraction of the run)"),
    "eval_steps": ({"gt": 0}, (), "transformers refuses 0 (a value below 1 is a fraction of the run)"),
    "warmup_steps": ({"ge": 0}, (), "a warmup has no negative length"),
    "weight_decay": ({"ge": 0}, (), "torch's AdamW refuses a negative weight decay"),
    "adam_beta1": ({"ge": 0, "lt": 1}, (), "torch's Adam refuses betas outside [0, 1)"),
    "adam_beta2": ({"ge": 0, "lt": 1}, (), "torch's Adam refuses betas outside [0, 1)"),
    "adam_epsilon": ({"ge": 0}, (), "torch's Adam refuses a negative epsilon"),
    "max_grad_norm": ({"ge": 0}, (), "clipping to a negative norm reverses the gradients; 0 turns clipping off"),
    "temperature": ({"gt": 0}, (), "TRL divides the logits by it"),
    "top_p": ({"gt": 0, "le": 1}, (), "vLLM refuses top_p outside (0, 1]"),
    "top_k": ({"ge": -1}, (), "vLLM refuses top_k below -1 (0 and -1 consider every token)"),
    "min_p": ({"ge": 0, "le": 1}, (), "vLLM refuses min_p outside [0, 1]"),
    "repetition_penalty": ({"gt": 0}, (), "vLLM refuses a penalty of 0 or below"),
    "beta": ({"ge": 0}, (), "a negative KL coefficient rewards drifting away from the reference model"),
    "epsilon": ({"ge": 0}, (), "a negative clipping range inverts the clipping of the policy ratio"),
    "epsilon_high": ({"ge": 0}, (), "a negative clipping range inverts the clipping of the policy ratio"),
    "num_iterations": ({"ge": 1}, (), "each generation is trained on at least once"),
    "steps_per_generation": ({"ge": 1}, (), "a generation serves at least one step"),
    "generation_batch_size": ({"ge": 1}, (), "a generation holds at least one completion"),
    "max_staleness": ({"ge": 0}, (), "an adapter version is at least 0 steps old"),
    "dataloader_num_workers": ({"ge": 0}, (), "torch's DataLoader refuses a negative number of workers"),
    "data_seed": ({"ge": 0, "le": 2**32 - 1}, (), "numpy takes seeds from 0 to 2**32 - 1"),
}
# Why a field of one of TRL's config classes is missing from another (the plan's error says it).
MISSING_BECAUSE = {("AsyncGRPOConfig", "beta"): "async GRPO has no KL term"}

_KIND_OK = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
    "any": lambda v: True,
}


def _check(args: dict[str, Any], fields: dict[str, TrlField], where: str) -> None:
    """Every field of `args`, each on its own: their mistakes together."""
    collect(*(partial(_check_field, name, value, fields, where) for name, value in args.items()))


def _check_field(name: str, value: Any, fields: dict[str, TrlField], where: str) -> None:
    path = f"trainer.{name}"
    if name not in fields:
        if name in REMOVED_FIELDS:
            raise UserError(f"unknown key '{path}': {REMOVED_FIELDS[name]}", key=path)
        owners = [cls for cls in CONFIG_CLASSES if name in fields_of(cls)]
        if owners:  # valid with another placement's trainer: say so, not "unknown"
            why = MISSING_BECAUSE.get((where, name))
            raise UserError(f"{path}={shown(value)} is not a field of {where}{f': {why}' if why else ''}; "
                            f"remove it with ~{path}", key=path,
                            hint=f"trainer.* takes the fields of TRL {trl_version()}'s {where}; {name} is "
                                 f"{' and '.join(owners)}'s")
        raise UserError(f"unknown key '{path}'{did_you_mean(name, fields, prefix='trainer.')}", key=path,
                        hint=f"trainer.* takes the fields of TRL {trl_version()}'s {where}")
    f = fields[name]
    if not any(_KIND_OK[k](value) for k in f.kinds):
        raise UserError(f"'{path}' must be {' or '.join(f.kinds)}, got {value!r} ({type(value).__name__})",
                        key=path)
    if f.choices and isinstance(value, str) and value not in f.choices:
        raise UserError(f"'{path}' must be one of {', '.join(f.choices)}; got {value!r}"
                        f"{did_you_mean(value, f.choices)}", key=path)
    bounds, allowed, why = BOUNDS.get(name, ({}, (), ""))
    problem = violation(value, bounds) if isinstance(value, (int, float)) and value not in allowed else None
    if problem:
        because = f": {why}" if why and math.isfinite(value) else ""
        raise UserError(f"'{path}' {problem}{because}", key=path,
                        hint=f"TRL's default is {shown(f.default)}" if f.default is not None else None)


def check_trainer_names(args: dict[str, Any]) -> None:
    """Compose's check, before the placement is known: every name must be a field of some TRL config class, and
    its value of a kind that class accepts."""
    merged: dict[str, TrlField] = {}
    for cls in CONFIG_CLASSES:
        for name, f in fields_of(cls).items():
            known = merged.get(name)
            merged[name] = f if known is None else TrlField(name, tuple(sorted({*known.kinds, *f.kinds})),
                                                            known.default, known.choices or f.choices)
    _check(args, merged, " or ".join(CONFIG_CLASSES))


def check_trainer_args(args: dict[str, Any], config_class: str) -> None:
    """The plan's check: names `config_class` of the pinned TRL lacks, and values of the wrong kind, are refused."""
    _check(args, fields_of(config_class), config_class)
