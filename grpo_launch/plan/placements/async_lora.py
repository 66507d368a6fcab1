"""async-lora: TRL's AsyncGRPOTrainer trains a LoRA adapter while independent `vllm serve` replicas generate;
only the adapter travels, through a directory every replica can read, announced through the routing proxy.

One `vllm serve` per replica (not `--data-parallel-size`, whose API servers each keep their own adapter table),
the proxy in front (routing by KV prefix, broadcasting adapter loads), the trainer pointed at the proxy so TRL
sees a single server of data parallel size 1 and keeps adapter-only sync on. Replicas are replaceable: the
supervisor restarts one that dies (`vllm.max_restarts` times) and the proxy takes it back once healthy.
"""

from __future__ import annotations

from typing import Any

from grpo_launch.compose import trl_fields
from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Engine, LoraSlots, Plan, ProcessSpec, Restart, VllmSettings
from grpo_launch.contracts.proxy import unguarded_exposure
from grpo_launch.contracts.vllm import ADAPTER_SUBDIR, VLLM_LORA_RANKS
from grpo_launch.errors import UserError
from grpo_launch.memory.estimate import Workload
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import dedicated_layout
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.processes import (
    base_env,
    check_cpu_block_size,
    model_path,
    require_servers,
    serve_batch_limits,
    vllm_env,
    vllm_serve_argv,
)
from grpo_launch.plan.step_time import (
    ADAPTER_SYNC_S,
    ROW_FILL,
    Lengths,
    PhaseTime,
    StepModel,
    StepSplit,
    TrainingBatch,
)

DEFAULT_REPLICAS = 2
# AsyncGRPOTrainer always runs TRL's tree attention; this picks its kernel (grpo_launch.trainer.tree_attention).
TREE_ATTENTION_KERNELS = {None: "flash-attn3 (kernels-community, downloaded from the hub)",
                          "sdpa": "torch SDPA (grpo-launch, no download)"}
UNSERVABLE_TARGETS = ("lm_head", "embed_tokens")  # TRL falls back to full-weight NCCL sync for these
PROXY_READY_TIMEOUT_S = 60.0


def _lora_rank_slot(config: Config) -> int:
    r = config.lora.r
    chosen = config.vllm.max_lora_rank
    if chosen is None:
        fitting = [k for k in VLLM_LORA_RANKS if k >= r]
        if not fitting:
            raise UserError(f"lora.r={r} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}", key="lora.r",
                            hint=f"use lora.r <= {VLLM_LORA_RANKS[-1]}")
        return fitting[0]
    if chosen not in VLLM_LORA_RANKS:
        raise UserError(f"vllm.max_lora_rank={chosen} is not a rank vLLM accepts", key="vllm.max_lora_rank",
                        hint=f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}, or null to derive it from lora.r")
    if chosen < r:
        raise UserError(f"vllm.max_lora_rank={chosen} is below lora.r={r}: replicas could not load the adapter",
                        key="vllm.max_lora_rank", hint=f"raise it to at least {r}, or leave it null")
    return chosen


def _check(config: Config) -> None:
    lora = config.lora
    if not lora.enabled:
        raise UserError("placement async-lora syncs a LoRA adapter but lora.enabled=false", key="lora.enabled",
                        hint="set lora.enabled=true (and lora.r), or use placement=server for full-weight sync")
    bad = [m for m in lora.target_modules if m in UNSERVABLE_TARGETS]
    if bad:
        raise UserError(f"lora.target_modules includes {bad}: vLLM cannot serve adapters on the output head or the "
                        f"embeddings, and TRL would fall back to full-weight sync", key="lora.target_modules",
                        hint="target the attention and MLP projections, or ['all-linear']")
    if config.zero.stage:
        raise UserError(f"zero.stage={config.zero.stage}: AsyncGRPOTrainer trains with FSDP2 only, not DeepSpeed",
                        key="zero.stage", hint="choose zero=0; the plan writes an FSDP2 accelerate config")
    if problem := unguarded_exposure(config.proxy.host, keyed=config.proxy.api_key_env is not None):
        raise UserError(f"proxy.host={config.proxy.host}: {problem}", key="proxy.host",
                        hint="set proxy.api_key_env=NAME and export NAME=<key> where grpo runs: the trainer sends "
                             "it, as every other client must; or keep proxy.host=127.0.0.1")
    if config.model.attn_implementation not in TREE_ATTENTION_KERNELS:
        raise UserError(f"model.attn_implementation={config.model.attn_implementation}: AsyncGRPOTrainer always "
                        f"runs TRL's tree attention; only its kernel can be chosen", key="model.attn_implementation",
                        hint="leave it null (FlashAttention-3 from the hub, Hopper GPUs) or set sdpa (no download)")
    if config.launcher != "accelerate":
        raise UserError("async-lora needs launcher=accelerate: its FSDP2 setup comes from the accelerate config",
                        key="launcher", hint="set launcher=accelerate")


class AsyncLora(Placement):
    name = "async-lora"
    trainer_class = "AsyncGRPOConfig"
    trainer = "async-grpo"
    engine_label = "replica"
    utilization_choices = (0.8, 0.9)  # the GPUs are the replicas' alone
    chat_prompts = True  # TRL's rollout worker renders every prompt through the chat template
    cpu_trainer_ranks = 1  # on a CPU the trainer is TRL's async pieces in one process (trainer.async_cpu)
    no_evaluation = ("TRL 1.16's AsyncGRPOTrainer has no evaluation path: its batches come from the rollout queue, "
                     "not from a dataset it could evaluate")

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v = config.vllm
        require_servers(config, self.name)
        check_cpu_block_size(config)
        _check(config)
        staleness = trl_fields.effective(config.trainer, self.trainer_class, "max_staleness")
        max_loras = v.max_loras if v.max_loras is not None else staleness + 2
        if max_loras < staleness + 2:
            raise UserError(f"vllm.max_loras={max_loras} must be at least trainer.max_staleness + 2 = "
                            f"{staleness + 2}: the newest adapter loads before the oldest servable one unloads",
                            key="vllm.max_loras", hint=f"set vllm.max_loras={staleness + 2} or more")
        slots = LoraSlots(max_loras=max_loras, max_lora_rank=_lora_rank_slot(config))
        replicas = v.data_parallel_size or DEFAULT_REPLICAS
        layout = dedicated_layout(config, engines=replicas, gpus_per_engine=v.tensor_parallel_size,
                                  apart=ctx.engines_apart)
        if config.cluster.accelerator == "cpu" and layout.world_size != self.cpu_trainer_ranks:
            raise UserError(f"async-lora on a CPU trains in {self.cpu_trainer_ranks} process (TRL's async pieces; "
                            f"AsyncGRPOTrainer needs CUDA), but the layout gives the trainer {layout.world_size} "
                            f"ranks", key="cluster.gpus_per_node",
                            hint=f"give the trainer one slot: cluster.gpus_per_node = replicas + 1 "
                                 f"({replicas + 1})")
        lora_flags = ("--enable-lora", "--max-loras", str(slots.max_loras), "--max-lora-rank",
                      str(slots.max_lora_rank), "--served-model-name", model_path(config), "--block-size",
                      str(v.block_size))
        engines, services = [], []
        for i, (node, gpus) in enumerate(layout.engine_gpus):
            name = f"vllm-{i}"
            port = ctx.ports.next_free(node, v.port, f"vLLM replica {i}", "vllm.port")
            url = f"http://{ctx.host(node)}:{port}"
            env = base_env(config, gpus) | vllm_env(config) | {"VLLM_SERVER_DEV_MODE": "1",
                                                               "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
            services.append(ProcessSpec(
                name=name, role="vllm", node=node, gpus=gpus,
                argv=vllm_serve_argv(config, bind=ctx.bind_address(), port=port, extra=lora_flags),
                env=env, pass_env=tuple(config.env.passthrough), port=port, ready_url=f"{url}/health",
                ready_timeout_s=v.health_timeout_s, start_delay_s=v.stagger_s if i else 0.0,
                restart=Restart(max_restarts=v.max_restarts, reset_after_s=v.restart_reset_s) if v.max_restarts
                else None,
                metrics_url=f"{url}/metrics"))
            engines.append(Engine(index=i, node=node, gpus=gpus, process=name, url=url))

        proxy, proxy_url = self._proxy(ctx, layout.trainer_nodes[0], engines)
        services.append(proxy)
        output_dir = config.trainer.get("output_dir", "checkpoints")
        adapter_dir = f"{output_dir}/{ADAPTER_SUBDIR}"
        remote = sorted({e.node for e in engines} - {proxy.node})
        if remote and not ctx.scheduler.shares_run_dir:
            ctx.warnings.append(f"replicas on node(s) {remote} load adapters from {adapter_dir} written on node "
                                f"{proxy.node}: set trainer.output_dir to an absolute path on storage every node "
                                f"mounts at the same place")
        batched, seqs = serve_batch_limits(config)
        settings = VllmSettings(
            enabled=True, engine="vllm serve, one per replica", tensor_parallel_size=v.tensor_parallel_size,
            data_parallel_size=replicas, gpu_memory_utilization=v.gpu_memory_utilization,
            max_model_len=v.max_model_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
            block_size=v.block_size, lora=slots, proxy_url=proxy_url, adapter_dir=adapter_dir,
            max_staleness=staleness,
            tree_attention=TREE_ATTENTION_KERNELS[config.model.attn_implementation]
            if config.cluster.accelerator == "cuda" else None)
        key = config.proxy.api_key_env
        return PlacementResult(layout=layout, engines=engines, services=services,
                               trainer_args={"vllm_server_base_url": proxy_url}, trainer_depends_on=("proxy",),
                               vllm=settings, server_key_env=key,
                               # AsyncGRPOTrainer trains with FSDP2; the CPU loop (trainer.async_cpu) does not.
                               fsdp2=config.cluster.accelerator == "cuda")

    def _proxy(self, ctx: Context, node: int, engines: list[Engine]) -> tuple[ProcessSpec, str]:
        config = ctx.config
        p, v = config.proxy, config.vllm
        port = ctx.ports.claim(node, p.port, "the routing proxy", "proxy.port")
        url = f"http://{'127.0.0.1' if p.host in ('127.0.0.1', '0.0.0.0') else p.host}:{port}"
        argv = ["grpo", "proxy", "--host", p.host, "--port", str(port)]
        for e in engines:
            argv += ["--replica", e.url]
        argv += ["--block-size", str(v.block_size), "--imbalance", str(p.imbalance),
                 "--max-tracked-blocks", str(p.max_tracked_blocks), "--lora-load-timeout-s",
                 str(p.lora_load_timeout_s), "--tokenizer", model_path(config)]
        for flag, name in (("--api-key-env", p.api_key_env), ("--upstream-api-key-env", p.upstream_api_key_env)):
            if name:
                argv += [flag, name]
        secrets = [name for name in (p.api_key_env, p.upstream_api_key_env) if name]
        spec = ProcessSpec(name="proxy", role="proxy", node=node, gpus=(), argv=tuple(argv),
                           env=base_env(config, ()), pass_env=tuple(dict.fromkeys([*config.env.passthrough, *secrets])),
                           port=port, ready_url=f"{url}/health", ready_timeout_s=PROXY_READY_TIMEOUT_S,
                           depends_on=tuple(e.process for e in engines), metrics_url=f"{url}/metrics",
                           probe_key_env=p.api_key_env)
        return spec, url

    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        return [("trainer", "AsyncGRPOTrainer (FSDP2)", "TRL's async pieces in one process",
                 "AsyncGRPOTrainer needs CUDA")]

    def batch(self, args: dict[str, Any], world: int, result: PlacementResult) -> dict[str, Any]:
        """AsyncGRPOConfig has no batch rules beyond GRPO's group size; these are the sizes it trains with."""
        get = lambda name: trl_fields.effective(args, self.trainer_class, name)  # noqa: E731
        groups = get("num_generations")
        if groups < 2:
            raise UserError(f"trainer.num_generations={groups}: GRPO compares completions within a group, it needs "
                            f">= 2", key="trainer.num_generations", hint="set trainer.num_generations=8 or more")
        return {"num_generations": groups, "per_device_train_batch_size": get("per_device_train_batch_size"),
                "gradient_accumulation_steps": get("gradient_accumulation_steps"), "trainer_ranks": world,
                "token_budget": get("token_budget"), "max_staleness": get("max_staleness"),
                "max_inflight_tasks": get("max_inflight_tasks")}

    def workload(self, plan: Plan, seq_len: int) -> Workload:
        """AsyncGRPOTrainer packs rollouts into rows of token_budget tokens and scores every token."""
        budget = plan.batch["token_budget"]  # None: the server's max_model_len; <= 0: fixed-size rows
        row = seq_len if budget is None or budget <= 0 else budget
        tokens = plan.batch["per_device_train_batch_size"] * row
        return Workload(tokens=tokens, logit_tokens=tokens, reference_model=False, gather_for_generation=False,
                        generation_sequences=0)

    def training_batch(self, plan: Plan, lengths: Lengths) -> TrainingBatch:
        """AsyncGRPOTrainer packs samples without padding: rows of token_budget tokens (the server's max_model_len
        when unset), about ROW_FILL full, or per_device_train_batch_size samples per row when token_budget <= 0.
        The sampling log-probabilities come from vLLM: no extra forward."""
        b = plan.batch
        budget = b["token_budget"] if b["token_budget"] is not None else plan.vllm.max_model_len
        rows = b["gradient_accumulation_steps"]
        if budget and budget > 0:
            tokens = budget * ROW_FILL
            samples = plan.world_size * rows * tokens / lengths.sample
            detail = f"rows of token_budget {budget} packed {ROW_FILL:.0%} full, {tokens / lengths.sample:.1f} samples"
        else:
            tokens = b["per_device_train_batch_size"] * lengths.sample
            samples = plan.world_size * rows * b["per_device_train_batch_size"]
            detail = f"{b['per_device_train_batch_size']} sample(s) per row, unpadded"
        return TrainingBatch(micro_batches=rows, tokens=tokens, sequence=lengths.sample, samples=samples,
                             no_grad_forwards=0, generation_rounds=0, detail=detail)

    def step_time(self, model: StepModel) -> StepSplit:
        """The replicas generate while the trainer trains; the step takes the longer of the two, and a sync (every
        weight_sync_steps steps, the replicas paused) adds to it. In-flight requests bound how many sequences each
        replica runs; staleness and the queue only bound how far generation may run ahead."""
        plan, batch = model.plan, model.batch
        get = lambda name: trl_fields.effective(plan.trainer_args, self.trainer_class, name)  # noqa: E731
        in_flight = get("max_inflight_tasks")
        if in_flight < 0:  # TRL's automatic value: max_staleness x the fixed-count batch of a step
            b = plan.batch
            in_flight = max(get("max_staleness"), 1) * b["per_device_train_batch_size"] \
                * b["gradient_accumulation_steps"] * plan.world_size
        generation, how = model.stream_generation(batch.samples, in_flight)
        training = model.training
        every = get("weight_sync_steps")
        sync = ADAPTER_SYNC_S / every
        busy = max(training.seconds, generation)
        waiting = max(0.0, generation - training.seconds)
        phases = (PhaseTime("generation", generation, on_trainer_clock=False,
                            detail=f"the replicas' busy time for {batch.samples:.0f} samples: {how}"),
                  PhaseTime("weight_sync", sync, detail=f"an adapter through files every {every} step(s), "
                                                        f"{ADAPTER_SYNC_S:g} s each"),
                  PhaseTime("training", training.seconds, detail=training.detail),
                  PhaseTime("waiting", waiting, detail="the trainer waiting for rollouts"))
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
