"""The `Placement` interface every placement module implements (see `plan.placements`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import trl_fields
from grpo_launch.contracts.devices import CPU, Device
from grpo_launch.contracts.plan import Batch, Plan, Trainer, VllmSettings
from grpo_launch.estimate.memory import Workload
from grpo_launch.estimate.step_time import Lengths, StepModel, StepSplit, TrainingBatch
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.trl_rules import grpo_batch


def trl_weight_sync(plan: Plan, how: str) -> list[tuple[str, str, str, str]]:
    """TRL's own weight sync (`how` it reaches vLLM) where the plan uses it and a CPU cannot: full weights, no
    adapter."""
    inputs = plan.trainer_inputs
    if inputs.weight_sync == CPU.dense_weight_sync or not plan.vllm.enabled or inputs.lora is not None:
        return []
    return [("weight sync", f"TRL's ({how})", "weights written to the run directory and reloaded by vLLM",
             "NCCL and TRL's direct loads need CUDA")]


class Placement(ABC):
    name: ClassVar[str]                             # placement.kind, and the group file's name
    trainer: ClassVar[Trainer]                      # what the trainer entrypoint runs
    engine_label: ClassVar[str]                     # how the GPU map names its vLLM engines
    utilization_choices: ClassVar[tuple[float, ...]]  # vllm.gpu_memory_utilization values the advisor tries
    sleep_levels: ClassVar[tuple[int, ...]] = (0,)  # placement.colocate.sleep_level values it can run with
    chat_prompts: ClassVar[bool] = False            # its trainer takes prompts as chat messages only
    no_evaluation: ClassVar[str | None] = None      # why its trainer cannot evaluate data.eval (None: TRL's does)

    @property
    def trainer_class(self) -> str:
        """The TRL config class its trainer takes, on any device."""
        return self.trainer.config_class

    def trainer_on(self, device: Device) -> Trainer:
        """What the trainer entrypoint runs on `device`."""
        return self.trainer

    def trainer_ranks_on(self, device: Device) -> int | None:
        """How many trainer ranks its trainer takes on `device` (None: any)."""
        return None

    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        """What its plan does that only CUDA can, for a rehearsal on a CPU to list as could-not: (feature, what the
        recipe does, what the rehearsal does instead, why)."""
        return []

    @abstractmethod
    def plan(self, ctx: Context) -> PlacementResult:
        """The layout, services and TRL arguments of this placement, or a `UserError` naming the key at fault."""

    def batch(self, args: dict[str, Any], world: int, result: PlacementResult) -> Batch:
        """TRL's batch rules for this placement's trainer, at the plan's world size: the derived sizes."""
        return grpo_batch(args, world, self.trainer_class)

    def sized_vllm(self, result: PlacementResult, batch: Batch) -> VllmSettings:
        """The engines' settings once the batch is known (a placement whose engine size follows it sets it)."""
        return result.vllm

    def workload(self, plan: Plan, seq_len: int) -> Workload:
        """What one trainer rank computes per micro-batch (GRPOTrainer: whole sequences, completion logits)."""
        facts = plan.trainer_facts
        per_device = plan.batch.per_device_train_batch_size
        completion = min(facts.max_completion_length, seq_len)
        return Workload(tokens=per_device * seq_len, logit_tokens=per_device * completion,
                        reference_model=facts.beta > 0 and plan.trainer_inputs.lora is None,
                        gather_for_generation=facts.gather_for_generation,
                        generation_sequences=plan.batch.rounds.generation_batch_size // plan.world_size)

    def training_batch(self, plan: Plan, lengths: Lengths) -> TrainingBatch:
        """What one rank trains per optimizer step (GRPOTrainer): micro-batches of whole sequences padded to the
        longest completion of the rank's generation batch; an extra forward per generation scores the old
        log-probabilities (with vLLM's importance-sampling correction, TRL's default, or when generation and
        optimizer steps are misaligned), and one more runs the reference model (beta > 0, full weights)."""
        b, facts = plan.batch, plan.trainer_facts
        per_device, accumulation, steps = (b.per_device_train_batch_size, b.gradient_accumulation_steps,
                                           b.rounds.steps_per_generation)
        iterations = facts.num_iterations
        padded = lengths.prompt + lengths.longest(per_device * steps)
        scoring = (plan.vllm.enabled and facts.importance_sampling_correction) or \
            accumulation % (steps * iterations) != 0
        reference = facts.beta > 0 and plan.trainer_inputs.lora is None
        extra = (scoring + reference) / iterations
        what = ", ".join(w for w, on in (("old-logprob forward", scoring), ("reference forward", reference)) if on)
        return TrainingBatch(micro_batches=accumulation, tokens=per_device * padded, sequence=padded,
                             samples=per_device * plan.world_size * accumulation, no_grad_forwards=extra,
                             generation_rounds=accumulation / (steps * iterations),
                             detail=f"{per_device} sequence(s) padded to {padded:.0f} tokens"
                                    + (f"; {what}" if what else ""))

    @abstractmethod
    def step_time(self, model: StepModel) -> StepSplit:
        """How this placement's phases combine into one optimizer step (the model's costs, `estimate.step_time`)."""

    def model_args(self, config: Config) -> dict[str, Any]:
        """How the model's settings reach TRL: its own `dtype` field where the config class has one, else the
        from_pretrained keywords of `model_init_kwargs`."""
        m = config.model
        init: dict[str, Any] = {k: v for k, v in (("revision", m.revision),
                                                   ("attn_implementation", m.attn_implementation)) if v is not None}
        args: dict[str, Any] = {"trust_remote_code": m.trust_remote_code}
        if trl_fields.has_field(self.trainer_class, "dtype"):
            args["dtype"] = m.dtype
        else:
            init["dtype"] = m.dtype
        if init:
            args["model_init_kwargs"] = init
        return args
