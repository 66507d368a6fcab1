"""The `Placement` interface every placement module implements (see `plan.placements`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from grpo_launch.compose import trl_fields
from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Plan, VllmSettings
from grpo_launch.memory.estimate import Workload
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.trl_rules import grpo_batch


class Placement(ABC):
    name: ClassVar[str]                             # placement.kind, and the group file's name
    trainer_class: ClassVar[str]                    # the TRL config class its trainer takes (trl_fields)
    trainer: ClassVar[str]                          # what the trainer entrypoint runs (contracts.plan.TRAINERS)
    engine_label: ClassVar[str]                     # how the GPU map names its vLLM engines
    utilization_choices: ClassVar[tuple[float, ...]]  # vllm.gpu_memory_utilization values the advisor tries
    sleep_levels: ClassVar[tuple[int, ...]] = (0,)  # vllm.sleep_level values it can run with
    chat_prompts: ClassVar[bool] = False            # its trainer takes prompts as chat messages only
    cpu_trainer_ranks: ClassVar[int | None] = None  # how many trainer ranks its trainer takes on a CPU (None: any)
    no_evaluation: ClassVar[str | None] = None      # why its trainer cannot evaluate data.eval (None: TRL's does)

    @abstractmethod
    def plan(self, ctx: Context) -> PlacementResult:
        """The layout, services and TRL arguments of this placement, or a `UserError` naming the key at fault."""

    def batch(self, args: dict[str, Any], world: int, result: PlacementResult) -> dict[str, Any]:
        """TRL's batch rules for this placement's trainer, at the plan's world size: the derived sizes."""
        return grpo_batch(args, world, self.trainer_class)

    def sized_vllm(self, result: PlacementResult, batch: dict[str, Any]) -> VllmSettings:
        """The engines' settings once the batch is known (a placement whose engine size follows it sets it)."""
        return result.vllm

    def workload(self, plan: Plan, seq_len: int) -> Workload:
        """What one trainer rank computes per micro-batch (GRPOTrainer: whole sequences, completion logits)."""
        get = lambda name: trl_fields.effective(plan.trainer_args, self.trainer_class, name)  # noqa: E731
        per_device = plan.batch["per_device_train_batch_size"]
        completion = min(get("max_completion_length"), seq_len)
        return Workload(tokens=per_device * seq_len, logit_tokens=per_device * completion,
                        reference_model=get("beta") > 0 and plan.trainer_inputs.lora is None,
                        gather_for_generation=bool(get("ds3_gather_for_generation")),
                        generation_sequences=plan.batch["generation_batch_size"] // plan.world_size)

    def model_args(self, config: Config) -> dict[str, Any]:
        """How the model's settings reach TRL: its own `dtype` field where the config class has one, else the
        from_pretrained keywords of `model_init_kwargs`."""
        m = config.model
        init: dict[str, Any] = {}
        if m.revision is not None:
            init["revision"] = m.revision
        if m.attn_implementation is not None:
            init["attn_implementation"] = m.attn_implementation
        args: dict[str, Any] = {"trust_remote_code": m.trust_remote_code}
        if trl_fields.has_field(self.trainer_class, "dtype"):
            args["dtype"] = m.dtype
        else:
            init["dtype"] = m.dtype
        if init:
            args["model_init_kwargs"] = init
        return args
