"""The TRL arguments of the trainer, and the inputs the trainer entrypoint builds besides them.

The recipe's `trainer.*` passes through; the keys below are derived from other recipe keys and may not be set
in `trainer.*` (one fact, one place): the error names the key that controls each.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import trl_fields
from grpo_launch.contracts.builtins import REWARDS
from grpo_launch.contracts.plan import Reward, Sharding, TrainerInputs
from grpo_launch.contracts.rundir import CHECKPOINTS_DIR, DEEPSPEED_FILE
from grpo_launch.errors import UserError
from grpo_launch.plan.checks import check_reward_files, reward_target
from grpo_launch.plan.context import Context, PlacementResult

if TYPE_CHECKING:  # the placements call this module (async-lora: output_dir); it only asks them
    from grpo_launch.plan.placements.base import Placement

MANAGED = {
    "seed": "seed",
    "use_vllm": "vllm.enabled",
    "vllm_mode": "placement",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "vllm_enable_sleep_mode": "placement.colocate.sleep_level",
    "vllm_max_model_length": "vllm.max_model_len",
    "vllm_server_base_url": "placement (the plan points the trainer at its server or proxy)",
    "vllm_server_host": "placement (the plan points the trainer at its server or proxy)",
    "vllm_server_port": "vllm.port",
    "vllm_group_port": "placement.server.group_port",
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


def output_dir(config: Config) -> str:
    """Where the trainer writes checkpoints (TRL's output_dir): trainer.output_dir, else the run directory's own
    checkpoints/ (relative: the trainer runs in the run directory)."""
    return str(config.trainer.get("output_dir", CHECKPOINTS_DIR))


def check_evaluation(config: Config, placement: Placement) -> None:
    """data.eval where the placement's trainer can evaluate it."""
    if config.data.eval is not None and placement.no_evaluation:
        raise UserError(f"data.eval is set, and placement {placement.name} cannot evaluate: TRL "
                        f"{trl_fields.trl_version()}'s {placement.no_evaluation}", key="data.eval",
                        hint="drop data.eval, or evaluate the saved adapter apart from the run")


def build_trainer_args(ctx: Context, placement: Placement, placement_args: dict[str, Any],
                       shared: Sharding) -> dict[str, Any]:
    """`shared`: how the trainer ranks share the model."""
    config = ctx.config
    args: dict[str, Any] = {"output_dir": CHECKPOINTS_DIR, **ctx.device.trainer_args}
    if shared == Sharding.DDP:
        # transformers asks DDP to look for unused parameters unless gradients are checkpointed: an extra walk of
        # the graph every step, and a warning from every rank. A causal LM's forward uses every trainable parameter
        # (a LoRA's adapters too); a model that leaves some unused sets trainer.ddp_find_unused_parameters=true.
        args["ddp_find_unused_parameters"] = False
    if config.data.eval is not None:  # check_evaluation refused it where the placement cannot evaluate
        args["eval_strategy"] = "steps"  # every eval_steps (TRL: logging_steps unless set); the trainer adds the end
    args.update(config.trainer)
    args.update(placement.model_args(config))
    args.update(placement_args)
    args["seed"] = config.seed
    if any(r.weight != 1.0 for r in config.rewards):
        args["reward_weights"] = [r.weight for r in config.rewards]
    if config.zero.stage and config.launcher == "torchrun":
        args["deepspeed"] = DEEPSPEED_FILE  # accelerate reads it from accelerate.yaml instead
    return args


def check_checkpoint_storage(ctx: Context, trainer_nodes: tuple[int, ...], args: dict[str, Any],
                             config_class: str) -> None:
    """Checkpoints that several trainer nodes write where each node has a run directory of its own (SkyPilot's
    copies) are each node's alone: a resume would find step N on one node and nothing on the others. Refused unless
    trainer.output_dir is on storage every node mounts, or the recipe accepts them (run.node_local_checkpoints)."""
    saves = trl_fields.effective(args, config_class, "save_strategy") != "no"
    output = str(args.get("output_dir", CHECKPOINTS_DIR))
    if not (saves and ctx.scheduler.copies_run_dir and len(trainer_nodes) > 1 and not output.startswith(("/", "~"))):
        return
    if ctx.config.run.node_local_checkpoints:
        return
    raise UserError(f"{len(trainer_nodes)} trainer nodes save checkpoints to {output} in the run directory, which "
                    f"scheduler={ctx.scheduler.name} copies to each node: every node would keep its own, and a "
                    f"resume mix them", key="trainer.output_dir",
                    hint="set trainer.output_dir to an absolute path on storage every node mounts at the same place, "
                         "or run.node_local_checkpoints=true to accept checkpoints per node")


def check_rewards(config: Config) -> tuple[Reward, ...]:
    if not config.rewards:
        raise UserError("the recipe has no reward function", key="rewards",
                        hint="add one, e.g. rewards=[{fn:accuracy}] (built-ins: " + ", ".join(REWARDS) + ")")
    rewards = tuple(Reward(fn=r.fn, target=reward_target(r.fn, f"rewards[{i}].fn"), weight=r.weight)
                    for i, r in enumerate(config.rewards))
    check_reward_files(rewards)
    return rewards


def build_trainer_inputs(ctx: Context, placement: Placement, result: PlacementResult, args: dict[str, Any],
                         rewards: tuple[Reward, ...]) -> TrainerInputs:
    """What the trainer entrypoint builds besides the TRL arguments (it reads plan.json, never the recipe)."""
    config = ctx.config
    return TrainerInputs(trainer=placement.trainer_on(ctx.device), model=ctx.model.path,
                         data=dataclasses.replace(config.data), rewards=rewards,
                         lora=dataclasses.replace(config.lora) if config.lora.enabled else None,
                         attn_implementation=config.model.attn_implementation,
                         max_steps=trl_fields.effective(args, placement.trainer_class, "max_steps"),
                         seed=config.seed, chat_prompts=placement.chat_prompts, weight_sync=result.weight_sync,
                         server_key_env=result.server_key_env)
