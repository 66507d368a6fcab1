"""TRL's config fields, without importing TRL.

`trl_fields.json` lists every field of `GRPOConfig` and `AsyncGRPOConfig` of the pinned TRL (name, accepted
kinds, default, choices of enum-typed fields). `grpo plan` checks `trainer.*` against it in microseconds; a test
regenerates it from the installed TRL and fails when they differ. Regenerate after changing the TRL pin:

    python -m grpo_launch.compose.trl_fields --write
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from grpo_launch.compose.origins import shown
from grpo_launch.contracts.knobs import violation
from grpo_launch.errors import UserError, collect, did_you_mean

FIELDS_FILE = Path(__file__).with_name("trl_fields.json")
CONFIG_CLASSES = {"GRPOConfig": "trl:GRPOConfig", "AsyncGRPOConfig": "trl.experimental.async_grpo:AsyncGRPOConfig"}

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


@dataclass(frozen=True)
class TrlField:
    name: str
    kinds: tuple[str, ...]
    default: Any
    choices: tuple[str, ...] | None


@cache
def _load() -> dict:
    return json.loads(FIELDS_FILE.read_text())


def trl_version() -> str:
    return _load()["trl_version"]


@cache
def fields_of(config_class: str) -> dict[str, TrlField]:
    raw = _load()["classes"][config_class]
    return {name: TrlField(name, tuple(f["kinds"]), f.get("default"),
                           tuple(f["choices"]) if f.get("choices") else None) for name, f in raw.items()}


def all_field_names() -> list[str]:
    """Every field name of every TRL config class grpo-launch builds."""
    return sorted({name for cls in CONFIG_CLASSES for name in fields_of(cls)})


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


def default_of(config_class: str, name: str) -> Any:
    return fields_of(config_class)[name].default


def has_field(config_class: str, name: str) -> bool:
    return name in fields_of(config_class)


def effective(args: dict[str, Any], config_class: str, name: str) -> Any:
    """The value TRL will see: the arguments', else the pinned TRL's default."""
    return args[name] if name in args else default_of(config_class, name)


# ---------------------------------------------------------------------------------------------------------------
# Generation from the installed TRL (imports trl; never called by `grpo plan`).

def _kinds_of(tp: Any) -> tuple[list[str], list[str] | None]:
    import enum
    import types
    import typing

    kinds: list[str] = []
    choices: list[str] | None = None
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    for a in args:
        origin = typing.get_origin(a) or a
        if a is type(None):
            kinds.append("null")
        elif origin is typing.Literal:
            for lit in typing.get_args(a):
                kinds.append("null" if lit is None else type(lit).__name__)
        elif isinstance(origin, type) and issubclass(origin, enum.Enum):
            kinds.append("str")
            choices = [m.value for m in origin]
        elif origin in (bool, int, float, str):
            kinds.append(origin.__name__)
        elif origin in (list, tuple):
            kinds.append("list")
        elif origin is dict:
            kinds.append("dict")
        else:
            kinds.append("any")
    return sorted(set(kinds)), choices


def _jsonable(value: Any) -> Any:
    import enum

    if isinstance(value, enum.Enum):
        return value.value
    try:
        json.dumps(value)
        return value
    except TypeError:
        return None


def generate() -> dict:
    import dataclasses
    import importlib
    import typing

    import trl

    out: dict = {"trl_version": trl.__version__, "classes": {}}
    for class_name, target in CONFIG_CLASSES.items():
        module, attr = target.split(":")
        cls = getattr(importlib.import_module(module), attr)
        hints = typing.get_type_hints(cls)
        fields = {}
        for f in sorted(dataclasses.fields(cls), key=lambda f: f.name):
            if not f.init:
                continue
            kinds, choices = _kinds_of(hints.get(f.name, f.type))
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            entry: dict = {"kinds": kinds, "default": _jsonable(default)}
            if choices:
                entry["choices"] = choices
            fields[f.name] = entry
        out["classes"][class_name] = fields
    return out


def main() -> None:
    import argparse
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {FIELDS_FILE.name}")
    args = parser.parse_args()
    text = json.dumps(generate(), indent=1, sort_keys=True) + "\n"
    if args.write:
        FIELDS_FILE.write_text(text)
        print(f"wrote {FIELDS_FILE}")
    else:
        print(text)


if __name__ == "__main__":
    main()
