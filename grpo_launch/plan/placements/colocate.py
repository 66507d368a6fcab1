"""colocate: vLLM runs inside every trainer rank (TRL's vllm_mode="colocate"); training and generation take turns.

TRL groups ranks [0..tp-1], [tp..2tp-1], ... into one engine each, so the TP size must divide the ranks of a node
(a group never spans machines). Sleep level 2 frees vLLM's weights and KV cache while the trainer steps.
"""

from __future__ import annotations

from dataclasses import replace

from grpo_launch.contracts.plan import Batch, Colocated, Engine, Plan, Trainer, VllmSettings
from grpo_launch.contracts.trl_fields import trl_version
from grpo_launch.errors import UserError, collect
from grpo_launch.estimate.step_time import StepModel, StepSplit, one_after_another
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import Layout, shared_layout
from grpo_launch.plan.placements.base import Placement, trl_weight_sync

# TRL builds the colocated engine with LLM(max_num_batched_tokens=4096) (trl/generation/vllm_generation.py).
TRL_BATCHED_TOKENS = 4096


class Colocate(Placement):
    name = "colocate"
    trainer = Trainer.GRPO
    engine_label = "vllm"
    utilization_choices = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # vLLM shares each GPU with a trainer rank
    sleep_levels = (0, 2)  # the pinned TRL implements level 2 only

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v, sleep = config.vllm, config.placement.colocate.sleep_level
        layout = shared_layout(config)
        if not v.enabled:
            if sleep:
                raise UserError(f"placement.colocate.sleep_level={sleep} needs vLLM (vllm.enabled=false)",
                                key="placement.colocate.sleep_level", hint="set placement.colocate.sleep_level=0")
            return PlacementResult(layout=layout, engines=[], services=[], trainer_args={"use_vllm": False},
                                   trainer_depends_on=(),
                                   vllm=VllmSettings(enabled=False, engine="transformers (in-process)"))
        collect(lambda: self._check_sleep(ctx), lambda: _check_tensor_parallel(layout, v.tensor_parallel_size))
        tp = v.tensor_parallel_size
        engines_count = layout.world_size // tp
        engines = []
        for e in range(engines_count):
            ranks = tuple(range(e * tp, (e + 1) * tp))
            node, _ = layout.rank_location(ranks[0])
            engines.append(Engine(index=e, node=node, gpus=tuple(layout.rank_location(r)[1] for r in ranks),
                                  ranks=ranks))
        args = {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": tp,
                "vllm_gpu_memory_utilization": v.gpu_memory_utilization,
                "vllm_enable_sleep_mode": sleep == 2}
        if v.max_model_len is not None:
            args["vllm_max_model_length"] = v.max_model_len
        else:
            ctx.warnings.append("vllm.max_model_len is unset: colocated vLLM reserves KV cache for the model's "
                                "full context; set it to prompt + completion length to save memory")
        settings = VllmSettings(enabled=True, engine="vLLM in-process (external_launcher)",
                                tensor_parallel_size=tp, data_parallel_size=engines_count,
                                gpu_memory_utilization=v.gpu_memory_utilization, max_model_len=v.max_model_len,
                                max_num_batched_tokens=TRL_BATCHED_TOKENS, colocated=Colocated(sleep, v.enforce_eager))
        # The engine lives in each trainer rank, so the ranks take vLLM's environment; where TRL's direct weight
        # load cannot work (a CPU: vLLM repacks CPU linear weights), the engine reloads the weights from files.
        return PlacementResult(layout=layout, engines=engines, services=[], trainer_args=args,
                               trainer_depends_on=(), vllm=settings,
                               trainer_env=ctx.device.engine_env(v.cpu_kvcache_space_gib),
                               weight_sync=ctx.device.dense_weight_sync)

    def _check_sleep(self, ctx: Context) -> None:
        config = ctx.config
        sleep = config.placement.colocate.sleep_level
        key = "placement.colocate.sleep_level"
        if sleep and not ctx.device.sleep_mode:
            raise UserError(f"{key}={sleep}: vLLM has no sleep mode on cluster.accelerator={ctx.device.name} (only "
                            f"on CUDA, ROCm and XPU), so it could not free its memory while the trainer steps",
                            key=key, hint=f"set {key}=0 on cluster.accelerator={ctx.device.name}")
        if sleep not in self.sleep_levels:
            raise UserError(f"{key}={sleep} is not available: TRL {trl_version()}'s colocate sleep mode always uses "
                            f"level 2 (weights and KV cache freed, weights re-pushed after each step)", key=key,
                            hint=f"use {key}=2, or 0 to keep vLLM resident")
        if sleep and "expandable_segments:True" in config.env.set.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise UserError("vLLM sleep mode does not work with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                            "(vllm-project/vllm#14189)", key="env.set.PYTORCH_CUDA_ALLOC_CONF",
                            hint=f"drop expandable_segments, or set {key}=0")

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

    def sized_vllm(self, result: PlacementResult, batch: Batch) -> VllmSettings:
        """TRL sizes each colocated engine for its TP group's share of one generation round."""
        if not result.vllm.enabled:
            return result.vllm
        seqs = batch.per_device_train_batch_size * result.vllm.tensor_parallel_size * batch.rounds.steps_per_generation
        return replace(result.vllm, max_num_seqs=seqs)


def _check_tensor_parallel(layout: Layout, tp: int) -> None:
    """TRL groups the ranks of a node into engines of `tp` ranks; a group cannot span machines."""
    per_node = len(layout.trainer_gpus)
    if per_node % tp:
        divisors = [d for d in range(1, per_node + 1) if per_node % d == 0]
        raise UserError(f"vllm.tensor_parallel_size={tp} must divide the {per_node} trainer ranks of a node: "
                        f"TRL groups ranks [0..{tp - 1}], [{tp}..{2 * tp - 1}], ... and a group cannot span "
                        f"machines", key="vllm.tensor_parallel_size", hint=f"use one of {divisors}")
