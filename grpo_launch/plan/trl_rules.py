"""TRL's own rules for a config, checked at plan time with the plan's world size, so that no trainer dies at start.

`grpo_batch` mirrors `GRPOConfig.__post_init__` (trl/trainer/grpo_config.py): its batch rules, returning the sizes
TRL derives, and the rest of its rules (`_grpo_config_rules`); AsyncGRPOConfig has no rules of this kind.
tests/test_trl_differential.py checks random layouts and settings against TRL's own verdict, so a rule that
drifts shows.
"""

from __future__ import annotations

from typing import Any

from grpo_launch.contracts.plan import Batch, GenerationRounds
from grpo_launch.contracts.trl_fields import effective
from grpo_launch.errors import UserError

TRUNCATE_MODES = ("token_truncate", "sequence_truncate")


def _smallest_multiple(start: int, step_ok) -> int:
    value = start
    while not step_ok(value):
        value += 1
    return value


def _grpo_config_rules(args: dict[str, Any], world: int, config_class: str) -> None:
    """GRPOConfig's rules that are not batch sizes."""
    get = lambda name: effective(args, config_class, name)  # noqa: E731
    if get("auto_find_batch_size"):
        raise UserError("trainer.auto_find_batch_size is not supported by GRPO: halving the batch on out-of-memory "
                        "would break the prompt groups of num_generations completions",
                        key="trainer.auto_find_batch_size",
                        hint="remove it and lower trainer.per_device_train_batch_size instead")
    if get("log_completions_hub_repo") is not None and not get("log_completions"):
        raise UserError("trainer.log_completions_hub_repo is set but trainer.log_completions is false",
                        key="trainer.log_completions_hub_repo",
                        hint="set trainer.log_completions=true to upload completions, or remove the repo")
    if get("eval_strategy") != "no":
        groups = get("num_generations_eval") or get("num_generations")
        per_device = get("per_device_eval_batch_size")
        if (per_device * world) % groups:
            good = _smallest_multiple(per_device, lambda p: (p * world) % groups == 0)
            raise UserError(f"the eval batch (per_device_eval_batch_size x trainer ranks = {per_device} x {world} = "
                            f"{per_device * world}) must be divisible by the {groups} generations per prompt used "
                            f"for evaluation", key="trainer.per_device_eval_batch_size",
                            hint=f"set trainer.per_device_eval_batch_size={good}, or trainer.num_generations_eval")
    low = get("vllm_importance_sampling_clip_min")
    high = get("vllm_importance_sampling_cap")  # deprecated: TRL moves it to clip_max
    high = high if high is not None else get("vllm_importance_sampling_clip_max")
    if low is not None and high is not None and low >= high:
        raise UserError(f"trainer.vllm_importance_sampling_clip_min={low} must be below "
                        f"trainer.vllm_importance_sampling_clip_max={high}",
                        key="trainer.vllm_importance_sampling_clip_min", hint="lower clip_min or raise clip_max")
    if get("vllm_importance_sampling_correction") and get("vllm_importance_sampling_mode") in TRUNCATE_MODES \
            and low is None and high is None:
        raise UserError(f"trainer.vllm_importance_sampling_mode={get('vllm_importance_sampling_mode')} truncates "
                        f"importance ratios but sets no bound", key="trainer.vllm_importance_sampling_mode",
                        hint="set trainer.vllm_importance_sampling_clip_max (or clip_min)")


MIN_GENERATIONS = 2  # GRPO compares the completions of a prompt's group


def check_num_generations(groups: int) -> int:
    if groups < MIN_GENERATIONS:
        raise UserError(f"trainer.num_generations={groups}: GRPO compares completions within a group, it needs >= "
                        f"{MIN_GENERATIONS}", key="trainer.num_generations",
                        hint=f"set trainer.num_generations=8 (TRL's default) or any value >= {MIN_GENERATIONS}")
    return groups


def grpo_batch(args: dict[str, Any], world: int, config_class: str) -> Batch:
    """GRPOConfig's rules with this plan's world size; returns the derived batch sizes."""
    _grpo_config_rules(args, world, config_class)
    get = lambda name: effective(args, config_class, name)  # noqa: E731
    groups = check_num_generations(get("num_generations"))
    per_device = get("per_device_train_batch_size")
    accumulation = get("gradient_accumulation_steps")
    global_batch = per_device * world
    gen_batch, steps = get("generation_batch_size"), get("steps_per_generation")
    if gen_batch is not None and steps is not None:
        raise UserError("trainer.generation_batch_size and trainer.steps_per_generation can not both be set",
                        key="trainer.generation_batch_size", hint="keep one of them (TRL derives the other)")
    if gen_batch is None and steps is None:
        steps = accumulation
    if steps is not None:
        gen_batch = global_batch * steps
    elif gen_batch % global_batch:
        raise UserError(f"trainer.generation_batch_size={gen_batch} must be divisible by the global batch "
                        f"per_device_train_batch_size x trainer ranks = {per_device} x {world} = {global_batch}",
                        key="trainer.generation_batch_size",
                        hint=f"use a multiple of {global_batch}, or set trainer.steps_per_generation instead")
    else:
        steps = gen_batch // global_batch
    if gen_batch % groups:
        good = _smallest_multiple(per_device, lambda p: (p * world * steps) % groups == 0)
        raise UserError(f"the generation batch (per_device_train_batch_size x trainer ranks x steps_per_generation "
                        f"= {per_device} x {world} x {steps} = {gen_batch}) must be divisible by "
                        f"trainer.num_generations={groups}, so that every prompt's group is whole",
                        key="trainer.per_device_train_batch_size",
                        hint=f"set trainer.per_device_train_batch_size={good}, or change trainer.num_generations")
    return Batch(num_generations=groups, per_device_train_batch_size=per_device,
                 gradient_accumulation_steps=accumulation, trainer_ranks=world,
                 rounds=GenerationRounds(generation_batch_size=gen_batch, steps_per_generation=steps,
                                         prompts_per_generation=gen_batch // groups,
                                         completions_per_optimizer_step=global_batch * accumulation))
