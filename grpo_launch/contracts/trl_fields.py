"""TRL's config fields, without importing TRL, and the facts of a plan's TRL arguments that its readers need.

`trl_fields.json` lists every field of `GRPOConfig` and `AsyncGRPOConfig` of the pinned TRL (name, accepted
kinds, default, choices of enum-typed fields). `grpo plan` checks `trainer.*` against it in microseconds
(`compose.trl_checks`); a test regenerates it from the installed TRL and fails when they differ. Regenerate after
changing the TRL pin:

    python -m grpo_launch.contracts.trl_fields --write

A TRL argument is read by name only where the recipe is composed and the plan is built; what the memory estimate,
the step-time model and the report need of them afterwards, the plan carries as `TrainerFacts`, resolved here
(the argument's value, else the pinned TRL's default). It sits in `contracts` because the reader of an older
plan.json (`contracts.rundir`) resolves them as the planner does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

FIELDS_FILE = Path(__file__).with_name("trl_fields.json")
CONFIG_CLASSES = {"GRPOConfig": "trl:GRPOConfig", "AsyncGRPOConfig": "trl.experimental.async_grpo:AsyncGRPOConfig"}

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


def default_of(config_class: str, name: str) -> Any:
    return fields_of(config_class)[name].default


def has_field(config_class: str, name: str) -> bool:
    return name in fields_of(config_class)


def effective(args: Mapping[str, Any], config_class: str, name: str) -> Any:
    """The value TRL will see: the arguments', else the pinned TRL's default."""
    return args[name] if name in args else default_of(config_class, name)


@dataclass(frozen=True)
class TrainerFacts:
    """What the trainer computes, as TRL's arguments decide it: the facts the memory estimate, the step-time model
    and the report read once the plan exists. None: the trainer's config class has no such field."""

    max_completion_length: int | None
    gradient_checkpointing: bool
    half_precision: bool                       # bf16 or fp16 (TRL's bf16=None: half unless told otherwise)
    beta: float | None                         # the KL coefficient; None: no KL term (AsyncGRPOConfig)
    num_iterations: int | None                 # optimizer passes over each generation
    importance_sampling_correction: bool       # vLLM's sampling log-probabilities corrected: an extra forward
    gather_for_generation: bool                # ZeRO-3 gathers the whole model to generate (transformers' generate)
    weight_sync_steps: int | None              # steps between adapter or weight syncs (AsyncGRPOConfig)
    output_dir: str                            # where checkpoints go: relative to the run directory, or absolute
    saves_checkpoints: bool                    # save_strategy is not "no"


def trainer_facts(args: Mapping[str, Any], config_class: str) -> TrainerFacts:
    """The facts of TRL arguments `args` for `config_class`, defaults filled in as TRL fills them."""
    def get(name: str) -> Any:
        return effective(args, config_class, name) if has_field(config_class, name) else None

    bf16, fp16 = get("bf16"), bool(get("fp16"))
    return TrainerFacts(max_completion_length=get("max_completion_length"),
                        gradient_checkpointing=bool(get("gradient_checkpointing")),
                        half_precision=bool((not fp16 if bf16 is None else bf16) or fp16), beta=get("beta"),
                        num_iterations=get("num_iterations"),
                        importance_sampling_correction=bool(get("vllm_importance_sampling_correction")),
                        gather_for_generation=bool(get("ds3_gather_for_generation")),
                        weight_sync_steps=get("weight_sync_steps"), output_dir=str(get("output_dir")),
                        saves_checkpoints=get("save_strategy") != "no")


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
