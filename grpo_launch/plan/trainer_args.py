"""The TRL arguments of the trainer, and the inputs the trainer entrypoint builds besides them.

The recipe's `trainer.*` passes through; the keys below are derived from other recipe keys and may not be set
in `trainer.*` (one fact, one place): the error names the key that controls each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.builtins import REWARDS
from grpo_launch.contracts.plan import Reward, TrainerInputs
from grpo_launch.errors import UserError
from grpo_launch.plan.checks import check_reward_files, reward_target
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.processes import model_path

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


def build_trainer_args(config: Config, placement: Placement, placement_args: dict[str, Any], *,
                       ddp: bool) -> dict[str, Any]:
    """`ddp`: the trainer ranks share the model through torch's DistributedDataParallel."""
    check_unmanaged(config.trainer)
    args: dict[str, Any] = {"output_dir": "checkpoints"}
    if config.cluster.accelerator == "cpu":
        args.update(use_cpu=True, bf16=False)  # TRL defaults to bf16; CPU runs use float32
    if ddp:
        # transformers asks DDP to look for unused parameters unless gradients are checkpointed: an extra walk of
        # the graph every step, and a warning from every rank. A causal LM's forward uses every trainable parameter
        # (a LoRA's adapters too); a model that leaves some unused sets trainer.ddp_find_unused_parameters=true.
        args["ddp_find_unused_parameters"] = False
    if config.data.eval is not None:
        if placement.no_evaluation:
            raise UserError(f"data.eval is set, and placement {placement.name} cannot evaluate: "
                            f"{placement.no_evaluation}", key="data.eval",
                            hint="drop data.eval, or evaluate the saved adapter apart from the run")
        args["eval_strategy"] = "steps"  # every eval_steps (TRL: logging_steps unless set); the trainer adds the end
    args.update(config.trainer)
    args.update(placement.model_args(config))
    args.update(placement_args)
    args["seed"] = config.seed
    if any(r.weight != 1.0 for r in config.rewards):
        args["reward_weights"] = [r.weight for r in config.rewards]
    return args


def build_trainer_inputs(config: Config, placement: Placement, weight_sync: str,
                         server_key_env: str | None = None) -> TrainerInputs:
    """What the trainer entrypoint builds besides the TRL arguments (it reads plan.json, never the recipe)."""
    if not config.rewards:
        raise UserError("the recipe has no reward function", key="rewards",
                        hint="add one, e.g. rewards=[{fn:accuracy}] (built-ins: " + ", ".join(REWARDS) + ")")
    rewards = tuple(Reward(fn=r.fn, target=reward_target(r.fn, f"rewards[{i}].fn"), weight=r.weight)
                    for i, r in enumerate(config.rewards))
    check_reward_files(rewards)
    return TrainerInputs(trainer=placement.trainer, model=model_path(config), data=dataclasses.replace(config.data),
                         rewards=rewards, lora=dataclasses.replace(config.lora) if config.lora.enabled else None,
                         attn_implementation=config.model.attn_implementation,
                         chat_prompts=placement.chat_prompts, weight_sync=weight_sync,
                         server_key_env=server_key_env)
