"""async-lora: TRL's AsyncGRPOTrainer trains a LoRA adapter while independent `vllm serve` replicas generate;
only the adapter travels, through a directory every replica can read, announced through the routing proxy.

One `vllm serve` per replica (not `--data-parallel-size`, whose API servers each keep their own adapter table),
the proxy in front (routing by KV prefix, broadcasting adapter loads), the trainer pointed at the proxy so TRL
sees a single server of data parallel size 1 and keeps adapter-only sync on. Replicas are replaceable: the
supervisor restarts one that dies (`placement.async_lora.max_restarts` times) and the proxy takes it back once healthy.
"""

from __future__ import annotations

from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import trl_fields
from grpo_launch.contracts.devices import CPU, Device
from grpo_launch.contracts.hosts import EVERY_INTERFACE, LOOPBACK
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.plan import (
    Batch,
    Engine,
    LoraSlots,
    Plan,
    ProcessSpec,
    Replicas,
    Restart,
    Role,
    Rollouts,
    Trainer,
    VllmSettings,
)
from grpo_launch.contracts.proxy import proxy_argv, unguarded_exposure
from grpo_launch.contracts.vllm import ADAPTER_SUBDIR, REPLICA_KEY_ENV, VLLM_LORA_RANKS
from grpo_launch.errors import UserError, collect
from grpo_launch.estimate.memory import Workload
from grpo_launch.estimate.step_time import (
    ADAPTER_SYNC_S,
    ROW_FILL,
    Lengths,
    PhaseTime,
    StepModel,
    StepSplit,
    TrainingBatch,
)
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import Layout, dedicated_layout
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.serving import check_block_size, check_servers_enabled, serve_batch_limits, served_engine
from grpo_launch.plan.trainer_args import output_dir
from grpo_launch.plan.trl_rules import check_num_generations

# AsyncGRPOTrainer always runs TRL's tree attention; this picks its kernel (grpo_launch.trainer.tree_attention).
TREE_ATTENTION_KERNELS = {None: "flash-attn3 (kernels-community, downloaded from the hub)",
                          "sdpa": "torch SDPA (grpo-launch, no download)"}
UNSERVABLE_TARGETS = ("lm_head", "embed_tokens")  # TRL falls back to full-weight NCCL sync for these
PROXY_READY_TIMEOUT_S = 60.0
KEY = "placement.async_lora"
# What AsyncGRPOTrainer needs where it cannot run (a CPU): TRL's async pieces in one trainer process.
LOOP_TRAINER_RANKS = 1


def _lora_rank_slot(config: Config) -> int:
    r = config.lora.r
    chosen = config.placement.async_lora.max_lora_rank
    if chosen is None:
        fitting = [k for k in VLLM_LORA_RANKS if k >= r]
        if not fitting:
            raise UserError(f"lora.r={r} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}", key="lora.r",
                            hint=f"use lora.r <= {VLLM_LORA_RANKS[-1]}")
        return fitting[0]
    if chosen not in VLLM_LORA_RANKS:
        raise UserError(f"{KEY}.max_lora_rank={chosen} is not a rank vLLM accepts", key=f"{KEY}.max_lora_rank",
                        hint=f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}, or null to derive it from lora.r")
    if chosen < r:
        raise UserError(f"{KEY}.max_lora_rank={chosen} is below lora.r={r}: replicas could not load the adapter",
                        key=f"{KEY}.max_lora_rank", hint=f"raise it to at least {r}, or leave it null")
    return chosen


def _lora_slots(config: Config, staleness: int) -> LoraSlots:
    chosen = config.placement.async_lora.max_loras
    max_loras = chosen if chosen is not None else staleness + 2
    if max_loras < staleness + 2:
        raise UserError(f"{KEY}.max_loras={max_loras} must be at least trainer.max_staleness + 2 = "
                        f"{staleness + 2}: the newest adapter loads before the oldest servable one unloads",
                        key=f"{KEY}.max_loras", hint=f"set {KEY}.max_loras={staleness + 2} or more")
    return LoraSlots(max_loras=max_loras, max_lora_rank=_lora_rank_slot(config))


def _check_lora(config: Config) -> None:
    lora = config.lora
    if not lora.enabled:
        raise UserError("placement async-lora syncs a LoRA adapter but lora.enabled=false", key="lora.enabled",
                        hint="set lora.enabled=true (and lora.r), or use placement=server for full-weight sync")
    bad = [m for m in lora.target_modules if m in UNSERVABLE_TARGETS]
    if bad:
        raise UserError(f"lora.target_modules includes {bad}: vLLM cannot serve adapters on the output head or the "
                        f"embeddings, and TRL would fall back to full-weight sync", key="lora.target_modules",
                        hint="target the attention and MLP projections, or ['all-linear']")


def _check_trainer(config: Config) -> None:
    if config.zero.stage:
        raise UserError(f"zero.stage={config.zero.stage}: AsyncGRPOTrainer trains with FSDP2 only, not DeepSpeed",
                        key="zero.stage", hint="choose zero=0; the plan writes an FSDP2 accelerate config")
    if config.launcher != "accelerate":
        raise UserError("async-lora needs launcher=accelerate: its FSDP2 setup comes from the accelerate config",
                        key="launcher", hint="set launcher=accelerate")
    if config.model.attn_implementation not in TREE_ATTENTION_KERNELS:
        raise UserError(f"model.attn_implementation={config.model.attn_implementation}: AsyncGRPOTrainer always "
                        f"runs TRL's tree attention; only its kernel can be chosen", key="model.attn_implementation",
                        hint="leave it null (FlashAttention-3 from the hub, Hopper GPUs) or set sdpa (no download)")


def _check_proxy(config: Config) -> None:
    p = config.placement.async_lora.proxy
    if problem := unguarded_exposure(p.host, keyed=p.api_key_env is not None):
        raise UserError(f"{KEY}.proxy.host={p.host}: {problem}", key=f"{KEY}.proxy.host",
                        hint=f"set {KEY}.proxy.api_key_env=NAME and export NAME=<key> where grpo runs: the trainer "
                             f"sends it, as every other client must; or keep {KEY}.proxy.host={LOOPBACK}")
    if p.upstream_api_key_env is not None:
        raise UserError(f"{KEY}.proxy.upstream_api_key_env={p.upstream_api_key_env}: the replicas require the run's "
                        f"own key ({REPLICA_KEY_ENV}), and the proxy sends them that one",
                        key=f"{KEY}.proxy.upstream_api_key_env",
                        hint=f"leave it null; to choose the replicas' key, export {REPLICA_KEY_ENV} where grpo runs")


def _check_trainer_ranks(config: Config, device: Device, layout: Layout) -> None:
    if device.cuda_kernels or layout.world_size == LOOP_TRAINER_RANKS:
        return
    replicas = config.placement.async_lora.replicas
    raise UserError(f"async-lora on cluster.accelerator={device.name} trains in {LOOP_TRAINER_RANKS} process (TRL's "
                    f"async pieces; AsyncGRPOTrainer needs CUDA), but the layout gives the trainer "
                    f"{layout.world_size} ranks", key="cluster.gpus_per_node",
                    hint=f"give the trainer one slot: cluster.gpus_per_node = replicas + 1 ({replicas + 1})")


class AsyncLora(Placement):
    name = "async-lora"
    trainer = Trainer.ASYNC_GRPO
    engine_label = "replica"
    utilization_choices = (0.8, 0.9)  # the GPUs are the replicas' alone
    chat_prompts = True  # TRL's rollout worker renders every prompt through the chat template
    no_evaluation = ("AsyncGRPOTrainer has no evaluation path: its batches come from the rollout queue, not from a "
                     "dataset it could evaluate")

    def trainer_on(self, device: Device) -> Trainer:
        return self.trainer if device.cuda_kernels else Trainer.ASYNC_LOOP

    def trainer_ranks_on(self, device: Device) -> int | None:
        return None if device.cuda_kernels else LOOP_TRAINER_RANKS

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v, a = config.vllm, config.placement.async_lora
        staleness = trl_fields.effective(config.trainer, self.trainer_class, "max_staleness")
        slots: list[LoraSlots] = []
        layouts: list[Layout] = []

        def lay_out() -> None:
            layouts.append(dedicated_layout(config, engines=a.replicas, gpus_per_engine=v.tensor_parallel_size,
                                            engines_key=f"{KEY}.replicas", apart=ctx.engines_apart))
            _check_trainer_ranks(config, ctx.device, layouts[0])

        collect(lambda: check_servers_enabled(config, self.name), lambda: check_block_size(config, ctx.device),
                lambda: _check_lora(config), lambda: _check_trainer(config), lambda: _check_proxy(config),
                lambda: slots.append(_lora_slots(config, staleness)), lay_out)
        layout = layouts[0]
        lora_flags = ("--enable-lora", "--max-loras", str(slots[0].max_loras), "--max-lora-rank",
                      str(slots[0].max_lora_rank), "--served-model-name", ctx.model.path, "--block-size",
                      str(v.block_size))
        engines, services = [], []
        for i, (node, gpus) in enumerate(layout.engine_gpus):
            spec, engine = served_engine(ctx, i, f"vllm-{i}", f"vLLM replica {i}", node, gpus, extra_flags=lora_flags,
                                         extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
                                         start_delay_s=a.stagger_s if i else 0.0,
                                         restart=Restart(max_restarts=a.max_restarts, reset_after_s=a.restart_reset_s)
                                         if a.max_restarts else None)
            services.append(spec)
            engines.append(engine)

        proxy, proxy_url = self._proxy(ctx, layout.trainer_nodes[0], engines)
        services.append(proxy)
        adapter_dir = f"{output_dir(config)}/{ADAPTER_SUBDIR}"
        remote = sorted({e.node for e in engines} - {proxy.node})
        if remote and not ctx.scheduler.shares_run_dir:
            ctx.warnings.append(f"replicas on node(s) {remote} load adapters from {adapter_dir} written on node "
                                f"{proxy.node}: set trainer.output_dir to an absolute path on storage every node "
                                f"mounts at the same place")
        batched, seqs = serve_batch_limits(config)
        settings = VllmSettings(
            enabled=True, engine="vllm serve, one per replica", tensor_parallel_size=v.tensor_parallel_size,
            data_parallel_size=a.replicas, gpu_memory_utilization=v.gpu_memory_utilization,
            max_model_len=v.max_model_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
            block_size=v.block_size,
            replicas=Replicas(lora=slots[0], proxy_url=proxy_url, adapter_dir=adapter_dir, max_staleness=staleness,
                              tree_attention=TREE_ATTENTION_KERNELS[config.model.attn_implementation]
                              if ctx.device.cuda_kernels else None))
        return PlacementResult(layout=layout, engines=engines, services=services,
                               trainer_args={"vllm_server_base_url": proxy_url}, trainer_depends_on=("proxy",),
                               vllm=settings, server_key_env=a.proxy.api_key_env,
                               # AsyncGRPOTrainer trains with FSDP2; the CPU loop (trainer.async_cpu) does not.
                               fsdp2=ctx.device.cuda_kernels)

    def _proxy(self, ctx: Context, node: int, engines: list[Engine]) -> tuple[ProcessSpec, str]:
        config = ctx.config
        p = config.placement.async_lora.proxy
        port = ctx.ports.claim(node, p.port, "the routing proxy", f"{KEY}.proxy.port")
        url = f"http://{LOOPBACK if p.host in (LOOPBACK, EVERY_INTERFACE) else p.host}:{port}"
        argv = proxy_argv(p, port=port, replica=[e.url for e in engines], block_size=config.vllm.block_size,
                          tokenizer=ctx.model.path, api_key_env=p.api_key_env, upstream_api_key_env=REPLICA_KEY_ENV)
        secrets = [name for name in (p.api_key_env, REPLICA_KEY_ENV) if name]
        spec = ProcessSpec(name="proxy", role=Role.PROXY, node=node, gpus=(), argv=argv, env=ctx.env(()),
                           pass_env=tuple(dict.fromkeys([*config.env.passthrough, *secrets])),
                           port=port, ready_url=f"{url}/health", ready_timeout_s=PROXY_READY_TIMEOUT_S,
                           depends_on=tuple(e.process for e in engines), metrics_url=f"{url}/metrics",
                           probe_key_env=p.api_key_env)
        return spec, url

    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        if plan.trainer_inputs.trainer == self.trainer_on(CPU):
            return []
        return [("trainer", "AsyncGRPOTrainer (FSDP2)", "TRL's async pieces in one process",
                 "AsyncGRPOTrainer needs CUDA")]

    def batch(self, args: dict[str, Any], world: int, result: PlacementResult) -> Batch:
        """AsyncGRPOConfig has no batch rules beyond GRPO's group size; these are the sizes it trains with."""
        get = lambda name: trl_fields.effective(args, self.trainer_class, name)  # noqa: E731
        return Batch(num_generations=check_num_generations(get("num_generations")),
                     per_device_train_batch_size=get("per_device_train_batch_size"),
                     gradient_accumulation_steps=get("gradient_accumulation_steps"), trainer_ranks=world,
                     rollouts=Rollouts(token_budget=get("token_budget"), max_staleness=get("max_staleness"),
                                       max_inflight_tasks=get("max_inflight_tasks")))

    def workload(self, plan: Plan, seq_len: int) -> Workload:
        """AsyncGRPOTrainer packs rollouts into rows of token_budget tokens and scores every token."""
        budget = plan.batch.rollouts.token_budget  # None: the server's max_model_len; <= 0: fixed-size rows
        row = seq_len if budget is None or budget <= 0 else budget
        tokens = plan.batch.per_device_train_batch_size * row
        return Workload(tokens=tokens, logit_tokens=tokens, reference_model=False, gather_for_generation=False,
                        generation_sequences=0)

    def training_batch(self, plan: Plan, lengths: Lengths) -> TrainingBatch:
        """AsyncGRPOTrainer packs samples without padding: rows of token_budget tokens (the server's max_model_len
        when unset), about ROW_FILL full, or per_device_train_batch_size samples per row when token_budget <= 0.
        The sampling log-probabilities come from vLLM: no extra forward."""
        b = plan.batch
        budget = b.rollouts.token_budget if b.rollouts.token_budget is not None else plan.vllm.max_model_len
        rows = b.gradient_accumulation_steps
        if budget and budget > 0:
            tokens = budget * ROW_FILL
            samples = plan.world_size * rows * tokens / lengths.sample
            detail = f"rows of token_budget {budget} packed {ROW_FILL:.0%} full, {tokens / lengths.sample:.1f} samples"
        else:
            tokens = b.per_device_train_batch_size * lengths.sample
            samples = plan.world_size * rows * b.per_device_train_batch_size
            detail = f"{b.per_device_train_batch_size} sample(s) per row, unpadded"
        return TrainingBatch(micro_batches=rows, tokens=tokens, sequence=lengths.sample, samples=samples,
                             no_grad_forwards=0, generation_rounds=0, detail=detail)

    def step_time(self, model: StepModel) -> StepSplit:
        """The replicas generate while the trainer trains; the step takes the longer of the two, and a sync (every
        weight_sync_steps steps, the replicas paused) adds to it. In-flight requests bound how many sequences each
        replica runs; staleness and the queue only bound how far generation may run ahead."""
        plan, batch = model.plan, model.batch
        b = plan.batch
        in_flight = b.rollouts.max_inflight_tasks
        if in_flight < 0:  # TRL's automatic value: max_staleness x the fixed-count batch of a step
            in_flight = max(b.rollouts.max_staleness, 1) * b.per_device_train_batch_size \
                * b.gradient_accumulation_steps * plan.world_size
        generation, how = model.stream_generation(batch.samples, in_flight)
        training = model.training
        every = plan.trainer_facts.weight_sync_steps
        sync = ADAPTER_SYNC_S / every
        busy = max(training.seconds, generation)
        waiting = max(0.0, generation - training.seconds)
        phases = (PhaseTime(Phase.GENERATE, generation, on_trainer_clock=False,
                            detail=f"the replicas' busy time for {batch.samples:.0f} samples: {how}"),
                  PhaseTime(Phase.SYNC, sync, detail=f"an adapter through files every {every} step(s), "
                                                     f"{ADAPTER_SYNC_S:g} s each"),
                  PhaseTime(Phase.TRAIN, training.seconds, detail=training.detail),
                  PhaseTime(Phase.WAIT, waiting, detail="the trainer waiting for rollouts"))
        if generation > training.seconds:
            bottleneck = (f"generation: the replicas need {generation:.1f} s per step against the trainer's "
                          f"{training.seconds:.1f} s (more replicas or trainer.max_inflight_tasks, now {in_flight})")
        else:
            bottleneck = (f"training: the trainer needs {training.seconds:.1f} s per step, the replicas "
                          f"{generation:.1f} s")
        return StepSplit(phases, busy + sync, busy if every > 1 else busy + sync, bottleneck)

    def model_args(self, config: Config) -> dict[str, Any]:
        args = super().model_args(config)
        # The trainer always uses TRL's tree attention; its kernel is a trainer input, not a model argument.
        init = args.get("model_init_kwargs", {})
        init.pop("attn_implementation", None)
        if not init:
            args.pop("model_init_kwargs", None)
        return args
