"""The TRL arguments of the trainer and TRL's batch rules, checked with the plan's world size.

The recipe's `trainer.*` passes through; the keys below are derived from other recipe keys and may not be set
in `trainer.*` (one fact, one place): the error names the key that controls each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_launch import builtins, trl_fields
from grpo_launch.errors import UserError
from grpo_launch.schema import Config

MANAGED = {
    "seed": "seed",
    "use_vllm": "vllm.enabled",
    "vllm_mode": "placement",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_enable_sleep_mode": "vllm.sleep_level",
    "vllm_max_model_length": "vllm.max_model_len",
    "vllm_server_base_url": "placement (the plan points the trainer at its server or proxy)",
    "vllm_server_host": "placement (the plan points the trainer at its server or proxy)",
    "vllm_server_port": "vllm.port",
    "vllm_group_port": "vllm.group_port",
    "deepspeed": "zero (the plan writes deepspeed.json)",
    "fsdp": "placement (async-lora writes an FSDP2 accelerate config)",
    "fsdp_config": "placement (async-lora writes an FSDP2 accelerate config)",
    "use_cpu": "cluster.accelerator",
    "model_init_kwargs": "model.dtype, model.revision and model.attn_implementation",
    "dtype": "model.dtype",
    "trust_remote_code": "model.trust_remote_code",
    "reward_weights": "rewards[].weight",
}


def check_unmanaged(trainer: dict[str, Any]) -> None:
    for name in trainer:
        if name in MANAGED:
            raise UserError(f"'trainer.{name}' is set by grpo-launch from {MANAGED[name]}", key=f"trainer.{name}",
                            hint=f"remove trainer.{name} and set {MANAGED[name].split(' ')[0]} instead")


def effective(trainer: dict[str, Any], config_class: str, name: str) -> Any:
    """The value TRL will see: the recipe's, else the pinned TRL's default."""
    return trainer[name] if name in trainer else trl_fields.default_of(config_class, name)


def model_args(config: Config, config_class: str) -> dict[str, Any]:
    m = config.model
    init: dict[str, Any] = {}
    if m.revision is not None:
        init["revision"] = m.revision
    if m.attn_implementation is not None:
        init["attn_implementation"] = m.attn_implementation
    args: dict[str, Any] = {"trust_remote_code": m.trust_remote_code}
    if config_class == "AsyncGRPOConfig":
        args["dtype"] = m.dtype  # AsyncGRPOConfig has its own dtype field (match `vllm serve --dtype`)
        init.pop("attn_implementation", None)  # the trainer always uses tree attention; the kernel is an input
    else:
        init["dtype"] = m.dtype
    if init:
        args["model_init_kwargs"] = init
    return args


def build_trainer_args(config: Config, config_class: str, placement_args: dict[str, Any]) -> dict[str, Any]:
    check_unmanaged(config.trainer)
    args: dict[str, Any] = {"output_dir": "checkpoints"}
    if config.cluster.accelerator == "cpu":
        args.update(use_cpu=True, bf16=False)  # TRL defaults to bf16; CPU runs use float32
    args.update(config.trainer)
    args.update(model_args(config, config_class))
    args.update(placement_args)
    args["seed"] = config.seed
    if any(r.weight != 1.0 for r in config.rewards):
        args["reward_weights"] = [r.weight for r in config.rewards]
    return args


def build_trainer_inputs(config: Config, model: str) -> dict[str, Any]:
    """What the trainer entrypoint builds besides the TRL arguments (it reads plan.json, never the recipe)."""
    if not config.rewards:
        raise UserError("the recipe has no reward function", key="rewards",
                        hint="add one, e.g. rewards=[{fn:accuracy}] (built-ins: " + ", ".join(builtins.REWARDS) + ")")
    lora = dataclasses.asdict(config.lora) if config.lora.enabled else None
    rewards = [{"fn": r.fn, "target": builtins.reward_target(r.fn, f"rewards[{i}].fn"), "weight": r.weight}
               for i, r in enumerate(config.rewards)]
    return {"model": model, "data": dataclasses.asdict(config.data), "rewards": rewards, "lora": lora,
            "attn_implementation": config.model.attn_implementation}


def _smallest_multiple(start: int, step_ok) -> int:
    value = start
    while not step_ok(value):
        value += 1
    return value


def check_grpo_batch(args: dict[str, Any], world: int, config_class: str) -> dict[str, Any]:
    """TRL's GRPOConfig.__post_init__ batch rules, with this plan's world size; returns the derived sizes."""
    get = lambda name: effective(args, config_class, name)  # noqa: E731
    groups = get("num_generations")
    if groups < 2:
        raise UserError(f"trainer.num_generations={groups}: GRPO compares completions within a group, it needs >= 2",
                        key="trainer.num_generations", hint="set trainer.num_generations=8 (TRL's default) or "
                                                            "any value >= 2")
    per_device = get("per_device_train_batch_size")
    accumulation = get("gradient_accumulation_steps")
    if config_class == "AsyncGRPOConfig":
        return {"num_generations": groups, "per_device_train_batch_size": per_device,
                "gradient_accumulation_steps": accumulation, "trainer_ranks": world,
                "token_budget": get("token_budget"), "max_staleness": get("max_staleness"),
                "max_inflight_tasks": get("max_inflight_tasks")}
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
    return {"num_generations": groups, "per_device_train_batch_size": per_device,
            "gradient_accumulation_steps": accumulation, "trainer_ranks": world,
            "generation_batch_size": gen_batch, "steps_per_generation": steps,
            "prompts_per_generation": gen_batch // groups,
            "completions_per_optimizer_step": global_batch * accumulation}
