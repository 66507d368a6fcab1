"""colocate: vLLM runs inside every trainer rank (TRL's vllm_mode="colocate"); training and generation take turns.

TRL groups ranks [0..tp-1], [tp..2tp-1], ... into one engine each, so the TP size must divide the ranks of a node
(a group never spans machines). Sleep level 2 frees vLLM's weights and KV cache while the trainer steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from grpo_launch.contracts.plan import Engine, Plan, VllmSettings
from grpo_launch.errors import UserError
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import shared_layout
from grpo_launch.plan.placements.base import Placement, trl_weight_sync
from grpo_launch.plan.processes import vllm_env
from grpo_launch.plan.step_time import StepModel, StepSplit, one_after_another

# TRL builds the colocated engine with LLM(max_num_batched_tokens=4096) (trl/generation/vllm_generation.py).
TRL_BATCHED_TOKENS = 4096


class Colocate(Placement):
    name = "colocate"
    trainer_class = "GRPOConfig"
    trainer = "grpo"
    engine_label = "vllm"
    utilization_choices = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # vLLM shares each GPU with a trainer rank
    sleep_levels = (0, 2)  # TRL 1.16 implements level 2 only

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v = config.vllm
        layout = shared_layout(config)
        per_node = len(layout.trainer_gpus)
        if not v.enabled:
            if v.sleep_level:
                raise UserError(f"vllm.sleep_level={v.sleep_level} needs vLLM (vllm.enabled=false)",
                                key="vllm.sleep_level", hint="set vllm.sleep_level=0")
            return PlacementResult(layout=layout, engines=[], services=[], trainer_args={"use_vllm": False},
                                   trainer_depends_on=(),
                                   vllm=VllmSettings(enabled=False, engine="transformers (in-process)"))
        cpu = config.cluster.accelerator == "cpu"
        if cpu and v.sleep_level:
            raise UserError(f"vllm.sleep_level={v.sleep_level}: vLLM has no sleep mode on a CPU (only on CUDA, ROCm "
                            f"and XPU), so it could not free its memory while the trainer steps",
                            key="vllm.sleep_level", hint="set vllm.sleep_level=0 on cluster.accelerator=cpu")
        tp = v.tensor_parallel_size
        if per_node % tp:
            divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
            raise UserError(f"vllm.tensor_parallel_size={tp} must divide the {per_node} trainer ranks of a node: "
                            f"TRL groups ranks [0..{tp - 1}], [{tp}..{2 * tp - 1}], ... and a group cannot span "
                            f"machines", key="vllm.tensor_parallel_size", hint=f"use one of {divisors}")
        engines_count = layout.world_size // tp
        if v.data_parallel_size not in (None, engines_count):
            raise UserError(f"vllm.data_parallel_size={v.data_parallel_size}, but colocated vLLM runs one engine "
                            f"per TP group: {layout.world_size} ranks / TP {tp} = {engines_count}",
                            key="vllm.data_parallel_size",
                            hint="leave vllm.data_parallel_size unset (null) for colocate")
        if v.sleep_level not in self.sleep_levels:
            raise UserError(f"vllm.sleep_level={v.sleep_level} is not available: TRL 1.16's colocate sleep mode "
                            f"always uses level 2 (weights and KV cache freed, weights re-pushed after each step)",
                            key="vllm.sleep_level", hint="use vllm.sleep_level=2, or 0 to keep vLLM resident")
        if v.sleep_level and "expandable_segments:True" in config.env.set.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise UserError("vLLM sleep mode does not work with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                            "(vllm-project/vllm#14189)", key="env.set.PYTORCH_CUDA_ALLOC_CONF",
                            hint="drop expandable_segments, or set vllm.sleep_level=0")
        engines = []
        for e in range(engines_count):
            ranks = tuple(range(e * tp, (e + 1) * tp))
            node, _ = layout.rank_location(ranks[0])
            engines.append(Engine(index=e, node=node, gpus=tuple(layout.rank_location(r)[1] for r in ranks),
                                  ranks=ranks))
        args = {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": tp,
                "vllm_gpu_memory_utilization": v.gpu_memory_utilization,
                "vllm_enable_sleep_mode": v.sleep_level == 2}
        if v.max_model_len is not None:
            args["vllm_max_model_length"] = v.max_model_len
        else:
            ctx.warnings.append("vllm.max_model_len is unset: colocated vLLM reserves KV cache for the model's "
                                "full context; set it to prompt + completion length to save memory")
        settings = VllmSettings(enabled=True, engine="vLLM in-process (external_launcher)",
                                tensor_parallel_size=tp, data_parallel_size=engines_count,
                                sleep_level=v.sleep_level, gpu_memory_utilization=v.gpu_memory_utilization,
                                max_model_len=v.max_model_len, max_num_batched_tokens=TRL_BATCHED_TOKENS)
        # The engine lives in each trainer rank, so the ranks take vLLM's environment; on a CPU TRL's direct weight
        # load cannot work (vLLM repacks CPU linear weights), so the engine reloads the weights from files.
        return PlacementResult(layout=layout, engines=engines, services=[], trainer_args=args,
                               trainer_depends_on=(), vllm=settings, trainer_env=vllm_env(config),
                               weight_sync="reload" if cpu else "trl")

    def step_time(self, model: StepModel) -> StepSplit:
        """Every GPU generates, loads the new weights into its engine, then trains: one after another. Sleep level 2
        frees and re-maps the engine's memory around training; the weights are loaded after every step either way."""
        tp = model.plan.vllm.tensor_parallel_size
        gather, load = model.gather_s(), model.load_s(tp)
        sync = (gather + load, ("weights gathered from their shards, " if gather else "")
                + f"copied into the engine on the same GPU (TP {tp})")
        training = model.training
        return one_after_another(model.batch_generation(), sync, (training.seconds, training.detail),
                                 why="every GPU generates, then trains")
    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        return trl_weight_sync(plan, "direct loads into the colocated engines")

    def sized_vllm(self, result: PlacementResult, batch: dict[str, Any]) -> VllmSettings:
        """TRL sizes each colocated engine for its TP group's share of one generation round."""
        if not result.vllm.enabled:
            return result.vllm
        seqs = batch["per_device_train_batch_size"] * result.vllm.tensor_parallel_size * batch["steps_per_generation"]
        return replace(result.vllm, max_num_seqs=seqs)
