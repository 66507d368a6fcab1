"""The memory estimate: for every GPU and phase what it holds, and each node's host memory. Pure arithmetic.

The trainer's model states follow DeepSpeed's own accounting (`estimate_zero2/3_model_states_mem_needs` in
deepspeed/runtime/zero/stage_1_and_2.py and stage3.py): with bf16, 2 B of weights per parameter, and per trainable
parameter 2 B of bf16 gradients, 4 B of fp32 gradients, 4 B of fp32 master weights and 8 B of Adam moments, split
over the data-parallel ranks by the ZeRO stage and moved to CPU memory by the offload settings. vLLM's share of a
GPU is `gpu_memory_utilization` x the GPU: weights over TP, its activation peak, CUDA graphs, and the KV cache in
what is left. docs/memory.md derives every formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.devices import Device
from grpo_launch.contracts.memory import GIB, Budget, Component, KvCache, MemoryEstimate, MemoryPhase, parameter_count
from grpo_launch.contracts.plan import Plan, Role, Sharding
from grpo_launch.estimate import catalog
from grpo_launch.estimate.catalog import ModelShape

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}  # auto: the checkpoint's, bf16 for the catalog
# Per process on a GPU: the CUDA context (~0.5 GiB on Hopper), cuBLAS workspaces, NCCL communicator buffers and
# allocator fragmentation. An assumption until measured on the GPU machine (docs/memory.md).
PROCESS_OVERHEAD_GIB = 1.5
_OVERHEAD = Component("CUDA/NCCL overhead", PROCESS_OVERHEAD_GIB, "fixed per process")
# A vLLM engine on a CPU, beside its KV cache (vllm.cpu_kvcache_space_gib): measured here, `vllm serve` of the tiny
# model (its API server and engine core processes) held 2.15 GiB of RSS.
VLLM_CPU_ENGINE_GIB = 2.2
# vLLM's captured CUDA graphs (its log: "Graph capturing finished ... took X GiB"); none with enforce_eager.
VLLM_CUDA_GRAPHS_GIB = 0.5
# DeepSpeed stage 1-2 defaults: reduce_bucket_size = allgather_bucket_size = 5e8 elements; with overlap_comm it
# keeps 4.5x that (transformers' DeepSpeed guide: "5e8 x 2Bytes x 2 x 4.5" = 9 GB). Stage 3's buckets are
# filled in by transformers from the hidden size ("auto"): reduce hidden^2, prefetch 0.9 x hidden^2.
DS_BUCKET_ELEMENTS = 500_000_000
DS_OVERLAP_COMM_FACTOR = 4.5


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


@dataclass(frozen=True)
class Workload:
    """What one trainer rank computes per micro-batch, as its placement's trainer does it."""

    tokens: int                 # through every layer
    logit_tokens: int           # through the output head
    reference_model: bool       # TRL loads a second copy of the model (beta > 0, full weights)
    gather_for_generation: bool  # ZeRO-3 gathers the whole model to generate (vLLM off)
    generation_sequences: int   # per rank and generation round when the trainer generates itself (vLLM off)


class Workloads(Protocol):
    """A placement, as the estimate sees it."""

    def workload(self, plan: Plan, seq_len: int) -> Workload: ...


@dataclass(frozen=True)
class _Trainer:
    """What the estimate needs to know about the trainer ranks, resolved from the config and the plan."""

    shape: ModelShape
    params: int
    trainable: int
    lora: bool
    dtype_bytes: int        # model.dtype: weights as loaded (DDP, FSDP2)
    half: bool              # bf16 or fp16 training: DeepSpeed keeps 2 B weights and fp32 master copies
    ranks: int
    stage: int
    offload_optimizer: bool
    offload_param: bool
    overlap_comm: bool
    fsdp2: bool
    reference: bool         # beta > 0 without LoRA: TRL loads a second copy of the model
    checkpointing: bool
    eager_attention: bool
    sequences: int          # per micro-batch
    seq_len: int
    tokens: int             # per micro-batch, through every layer
    logit_tokens: int       # per micro-batch, through the output head (TRL keeps only completion logits)
    generation_sequences: int  # per rank and generation round (transformers generation, vLLM off)
    gather_for_generation: bool
    device: Device          # its gpus: a rank's states on a GPU, else in host memory

    @property
    def ds_bytes(self) -> int:
        return 2 if self.half else 4

    @property
    def weight_bytes(self) -> int:
        return self.ds_bytes if self.stage else self.dtype_bytes

    @property
    def act_bytes(self) -> int:
        return 2 if self.half else self.dtype_bytes


@dataclass(frozen=True)
class _Held:
    component: Component
    on_host: bool = False       # moved to CPU memory by ZeRO offload
    persistent: bool = True     # held between training steps too; False: only inside a step


def _trainer(config: Config, plan: Plan, shape: ModelShape, workloads: Workloads) -> _Trainer:
    lora, facts = config.lora, plan.trainer_facts
    trainable = shape.lora_parameters(lora.r, lora.target_modules) if lora.enabled else shape.parameters
    seq_len = plan.vllm.max_model_len or shape.context
    work = workloads.workload(plan, seq_len)
    z = config.zero
    return _Trainer(
        shape=shape, params=shape.parameters, trainable=trainable, lora=lora.enabled,
        dtype_bytes=DTYPE_BYTES[config.model.dtype], half=facts.half_precision, ranks=plan.world_size, stage=z.stage,
        offload_optimizer=z.offload_optimizer, offload_param=z.offload_param,
        overlap_comm=z.overlap_comm if z.overlap_comm is not None else z.stage == 3,  # DeepSpeed's default
        fsdp2=plan.sharding == Sharding.FSDP2, reference=work.reference_model,
        checkpointing=facts.gradient_checkpointing,
        eager_attention=config.model.attn_implementation == "eager",
        sequences=plan.batch.per_device_train_batch_size, seq_len=seq_len, tokens=work.tokens,
        logit_tokens=work.logit_tokens, generation_sequences=work.generation_sequences,
        gather_for_generation=work.gather_for_generation, device=plan.device)


def _model_states(t: _Trainer) -> list[_Held]:
    """Weights, gradients, optimizer states and master weights of one rank (DeepSpeed's model states)."""
    n, shards = t.ranks, f"{t.ranks} ranks"
    weights = t.params + (t.trainable if t.lora else 0)
    sharded = t.stage == 3 or t.fsdp2
    wb = t.weight_bytes
    held = [_Held(Component("weights", _gib(wb * weights / (n if sharded else 1)),
                            f"{wb} B x {parameter_count(weights)}" + (f" / {shards}" if sharded else "")),
                  on_host=t.offload_param)]
    what = "LoRA " if t.lora else ""
    if not t.stage:  # DDP (or FSDP2): gradients and torch AdamW moments in the parameters' dtype
        share = n if t.fsdp2 else 1
        held.append(_Held(Component("gradients", _gib(wb * t.trainable / share),
                                    f"{wb} B x {what}{parameter_count(t.trainable)}"
                                    + (f" / {shards}" if t.fsdp2 else "")),
                          persistent=False))
        held.append(_Held(Component("optimizer states", _gib(2 * wb * t.trainable / share),
                                    f"Adam m, v: 2 x {wb} B x {what}{parameter_count(t.trainable)}"
                                    + (f" / {shards}" if t.fsdp2 else ""))))
        return held
    # Stage 1 keeps whole half-precision gradients, stage 2 its partition of them; stage 3, and stage 2 with the
    # optimizer offloaded, reduce straight into the fp32 partition (DeepSpeed's estimates count no half copy there).
    half_grads = {1: t.ds_bytes * t.trainable, 2: 0.0 if t.offload_optimizer else t.ds_bytes * t.trainable / n}
    fp32 = 4 * t.trainable / n if t.half else 0.0
    if half_grads.get(t.stage):
        held.append(_Held(Component("gradients", _gib(half_grads[t.stage]),
                                    f"{t.ds_bytes} B x {what}{parameter_count(t.trainable)}"
                                    + (f" / {shards}" if t.stage == 2 else "")), persistent=False))
    if fp32:
        held.append(_Held(Component("fp32 gradients", _gib(fp32),
                                    f"4 B x {what}{parameter_count(t.trainable)} / {shards}"),
                          on_host=t.offload_optimizer, persistent=t.offload_optimizer))
        held.append(_Held(Component("fp32 master weights", _gib(fp32),
                                    f"4 B x {what}{parameter_count(t.trainable)} / {shards}"),
                          on_host=t.offload_optimizer))
    held.append(_Held(Component("optimizer states", _gib(8 * t.trainable / n),
                                f"Adam m, v: 8 B x {what}{parameter_count(t.trainable)} / {shards}"),
                      on_host=t.offload_optimizer))
    if t.stage == 3:  # DeepSpeed's largest_layer_memory: one module's weights and gradients, gathered whole
        largest = t.shape.largest_layer_parameters
        held.append(_Held(Component("ZeRO-3 gathered layer", _gib(2 * t.ds_bytes * largest),
                                    f"2 x {t.ds_bytes} B x largest module {parameter_count(largest)}"),
                          persistent=False))
    return held


def _activations(t: _Trainer) -> list[_Held]:
    s, a = t.shape, t.act_bytes
    # Saved for backward per token and decoder layer (Korthikanti et al. 2022, sec. 4.1, redone for RMSNorm, GQA,
    # flash/SDPA attention and a SwiGLU MLP): two norms' inputs and outputs (4h), q, k, v after RoPE (q + 2kv),
    # attention output and o_proj input (2q), gate, up, SiLU(gate) and the down input (4I).
    per_layer = a * (4 * s.hidden + 3 * s.q_dim + 2 * s.kv_dim + 4 * s.intermediate)
    if t.checkpointing:  # each layer keeps its input; one layer is recomputed whole during backward
        layers = t.tokens * (s.layers * a * s.hidden + per_layer)
        how = f"checkpointed: {s.layers} layer inputs + 1 layer"
    else:
        layers = t.tokens * s.layers * per_layer
        how = f"{s.layers} layers"
    held = [_Held(Component("activations", _gib(layers), f"{t.tokens} tokens/micro-batch, {how}"), persistent=False)]
    if t.eager_attention:  # scores kept as fp32 softmax output and its half copy, per head and sequence
        live = 1 if t.checkpointing else s.layers
        scores = live * t.sequences * s.heads * t.seq_len ** 2 * (4 + a)
        held.append(_Held(Component("eager attention scores", _gib(scores), f"{t.sequences} x {s.heads} heads x "
                                    f"{t.seq_len}^2 x {4 + a} B x {live} layer(s)"), persistent=False))
    logits = 2 * a * t.logit_tokens * s.vocab  # the logits and their gradient
    held.append(_Held(Component("logits", _gib(logits), f"2 x {a} B x {t.logit_tokens} tokens x vocab {s.vocab}"),
                      persistent=False))
    return held


def _buffers(t: _Trainer) -> list[_Held]:
    held = []
    if t.stage in (1, 2):
        factor = DS_OVERLAP_COMM_FACTOR if t.overlap_comm else 1
        size = 2 * DS_BUCKET_ELEMENTS * t.ds_bytes * factor
        held.append(_Held(Component("DeepSpeed buckets", _gib(size), f"reduce + allgather 5e8 x {t.ds_bytes} B"
                                    + (f" x {factor} (overlap_comm)" if t.overlap_comm else ""))))
    elif t.stage == 3:
        size = 1.9 * t.shape.hidden ** 2 * t.ds_bytes
        held.append(_Held(Component("DeepSpeed buckets", _gib(size), "reduce + prefetch 1.9 x hidden^2")))
    elif t.ranks > 1 and not t.fsdp2:  # torch DDP's buckets hold a second copy of the gradients
        held.append(_Held(Component("DDP gradient buckets", _gib(t.weight_bytes * t.trainable),
                                    f"{t.weight_bytes} B x {parameter_count(t.trainable)}")))
    elif t.fsdp2:  # the layer being computed and the one prefetched, unsharded
        size = 2 * t.weight_bytes * t.shape.layer_parameters
        held.append(_Held(Component("FSDP2 gathered layers", _gib(size), "2 decoder layers unsharded"),
                          persistent=False))
    if t.reference:
        sharded = t.stage == 3
        held.append(_Held(Component("reference model", _gib(t.weight_bytes * t.params / (t.ranks if sharded else 1)),
                                    f"beta > 0: {t.weight_bytes} B x {parameter_count(t.params)}"
                                    + (f" / {t.ranks} ranks" if sharded else "")), on_host=t.offload_param))
    if t.device.gpus:
        held.append(_Held(_OVERHEAD))
    return held


def _transformers_generation(t: _Trainer) -> list[Component]:
    """Generation inside the trainer (vLLM off): the KV cache of transformers' generate, and ZeRO-3's gathered model."""
    s = t.shape
    kv = t.generation_sequences * t.seq_len * s.kv_bytes_per_token(t.act_bytes)
    out = [Component("transformers KV cache", _gib(kv), f"{t.generation_sequences} sequences x {t.seq_len} tokens")]
    if t.stage == 3 and t.gather_for_generation:
        out.append(Component("gathered model (ds3_gather_for_generation)", _gib(t.weight_bytes * t.params),
                             f"{t.weight_bytes} B x {parameter_count(t.params)}"))
    return out


@dataclass(frozen=True)
class _VllmShare:
    components: tuple[Component, ...]
    kv_cache: KvCache
    problems: tuple[str, ...]
    weights_gib: float          # per GPU: what sleep level 1 copies to CPU memory


def _vllm_share(config: Config, plan: Plan, shape: ModelShape) -> _VllmShare:
    v = plan.vllm
    tp, utilization = v.tensor_parallel_size, v.gpu_memory_utilization
    max_len = v.max_model_len or shape.context
    gpu = config.cluster.gpu_memory_gib
    vb = DTYPE_BYTES[config.model.dtype]
    batched, sequences = v.max_num_batched_tokens, v.max_num_seqs
    weights = _gib(vb * shape.parameters / tp)
    parts = [Component("vLLM weights", weights, f"{vb} B x {parameter_count(shape.parameters)} / TP {tp}")]
    if v.replicas is not None:
        slots = v.replicas.lora
        lora = slots.max_loras * shape.lora_parameters(slots.max_lora_rank, config.lora.target_modules)
        parts.append(Component("vLLM LoRA slots", _gib(vb * lora / tp),
                               f"{slots.max_loras} adapters of rank {slots.max_lora_rank}"))
    # vLLM's profiled peak: one forward over max_num_batched_tokens (residual and hidden state, the qkv and MLP
    # outputs of its TP shard) and the sampler's fp32 logits of max_num_seqs sequences.
    per_token = 2 * shape.hidden + (shape.q_dim + 2 * shape.kv_dim + 3 * shape.intermediate) / tp
    activations = batched * vb * per_token + sequences * shape.vocab * 4
    parts.append(Component("vLLM activations", _gib(activations),
                           f"{batched} batched tokens, {sequences} sequences' logits"))
    if not config.vllm.enforce_eager:
        parts.append(Component("vLLM CUDA graphs", VLLM_CUDA_GRAPHS_GIB, "captured decode graphs"))
    kv = utilization * gpu - sum(c.gib for c in parts)
    # K and V of each layer; a TP rank holds its share of the KV heads (every rank one head when TP > heads).
    heads_per_rank = max(1, shape.kv_heads // tp)
    per_token_bytes = 2 * shape.layers * heads_per_rank * shape.head_dim * vb
    cache = KvCache(tokens=max(0, int(kv * GIB // per_token_bytes)), bytes_per_token=per_token_bytes,
                    max_model_len=max_len, max_num_seqs=sequences)
    parts.append(Component("vLLM KV cache", max(kv, 0.0), f"the rest of {utilization:g} x {gpu:g} GiB"))
    problems = ()
    if cache.sequences < 1:
        problems = (f"vLLM cannot start: gpu_memory_utilization {utilization:g} x {gpu:g} GiB leaves {kv:.1f} GiB "
                    f"for the KV cache after weights and activations; one sequence of max_model_len {max_len} needs "
                    f"{_gib(max_len * per_token_bytes):.1f} GiB",)
    return _VllmShare(tuple(parts), cache, problems, weights)


def _gpu_budgets(config: Config, plan: Plan, holdings: list[_Held], t: _Trainer,
                 vllm: _VllmShare | None) -> tuple[Budget, ...]:
    trainer_gpus = {(p.node, g) for p in plan.processes if p.role == Role.TRAINER for g in p.gpus}
    vllm_gpus = {(e.node, g) for e in plan.engines for g in e.gpus}
    members: dict[str, list[tuple[int, int]]] = {}
    for where in sorted(trainer_gpus | vllm_gpus):
        role = "trainer + vLLM" if where in trainer_gpus and where in vllm_gpus else \
            "trainer" if where in trainer_gpus else "vLLM"
        members.setdefault(role, []).append(where)

    training = tuple(h.component for h in holdings if not h.on_host)
    resident = tuple(h.component for h in holdings if not h.on_host and h.persistent)
    if vllm is None:
        resident += tuple(_transformers_generation(t))
    phases: dict[str, tuple[MemoryPhase, ...]] = {"trainer": (MemoryPhase("training", training),
                                                            MemoryPhase("generation", resident))}
    if vllm is not None:
        asleep = plan.vllm.sleep_level > 0  # colocated: one process, vLLM asleep or not while training
        phases["trainer + vLLM"] = (MemoryPhase("training", training + (() if asleep else vllm.components)),
                                    MemoryPhase("generation", resident + vllm.components))
        alone = vllm.components + (_OVERHEAD,)
        phases["vLLM"] = (MemoryPhase("training", alone), MemoryPhase("generation", alone))
    return tuple(Budget(role=role, members=tuple(where), capacity_gib=config.cluster.gpu_memory_gib,
                        phases=phases[role], kv_cache=vllm.kv_cache if "vLLM" in role else None,
                        problems=vllm.problems if "vLLM" in role else ())
                 for role, where in members.items())


def _host_budgets(config: Config, plan: Plan, holdings: list[_Held], t: _Trainer,
                  vllm: _VllmShare | None) -> tuple[Budget, ...]:
    per_process = t.device.host_process_gib
    groups: dict[tuple[str, tuple[MemoryPhase, ...]], list[tuple[int]]] = {}
    for node in range(plan.nodes):
        ranks = sum(len(p.ranks) for p in plan.processes if p.role == Role.TRAINER and p.node == node)
        vllm_gpus = sum(len(e.gpus) for e in plan.engines if e.node == node)
        # vLLM in processes of its own (servers, replicas), or inside the trainer ranks (colocated)
        vllm_processes = sum(len(e.gpus) for e in plan.engines if e.node == node and e.process is not None)
        if not ranks + vllm_processes:
            continue
        if t.device.gpus:
            processes = ranks + vllm_processes
            base = (Component("processes", processes * per_process, f"{processes} x {per_process:g} GiB"),)
        else:  # a CPU's vLLM engines live in host memory, whole: the engine and its KV cache
            engines = sum(1 for e in plan.engines if e.node == node)
            kv = config.vllm.cpu_kvcache_space_gib
            base = (Component("processes", ranks * per_process, f"{ranks} x {per_process:g} GiB"),) + ((Component(
                "vLLM engines", engines * (VLLM_CPU_ENGINE_GIB + kv),
                f"{engines} x ({VLLM_CPU_ENGINE_GIB:g} GiB + KV cache {kv} GiB)"),) if engines else ())
        if not ranks:  # a node that only serves vLLM holds none of the trainer's states
            train = []
        elif t.device.gpus:
            train = [Component(f"offloaded {h.component.name}", ranks * h.component.gib,
                               f"{ranks} ranks x {h.component.detail}") for h in holdings if h.on_host]
        else:  # CPU ranks: everything a rank holds is in host memory
            train = [Component(h.component.name, ranks * h.component.gib, f"{ranks} ranks") for h in holdings]
        if vllm is not None and plan.vllm.sleep_level == 1:
            train.append(Component("vLLM weights asleep (level 1)", vllm_gpus * vllm.weights_gib,
                                   f"{vllm_gpus} GPUs x {vllm.weights_gib:.1f} GiB"))
        # Every rank builds its copy in CPU memory, in model.dtype, before it moves to the GPU; ZeRO-3's zero.Init
        # materialises one module at a time and partitions it (DeepSpeed's estimators assume the same).
        built, what = (t.shape.largest_layer_parameters, "largest module") if t.stage == 3 else (t.params, "model")
        load = Component("model loading", _gib(ranks * t.dtype_bytes * built),
                         f"{ranks} ranks x {t.dtype_bytes} B x {what} {parameter_count(built)}")
        phases = (MemoryPhase("load", (*base, load) if ranks else base),
                  MemoryPhase("training", (*base, *train)))
        role = "trainer + vLLM" if ranks and vllm_gpus else "trainer" if ranks else "vLLM"
        groups.setdefault((role, phases), []).append((node,))
    return tuple(Budget(role=role, members=tuple(nodes), capacity_gib=config.cluster.host_memory_gib,
                        phases=phases) for (role, phases), nodes in groups.items())


def estimate(config: Config, plan: Plan, workloads: Workloads,
             resolved: catalog.ResolvedModel | None) -> MemoryEstimate:
    """The memory every GPU and node of `plan` needs, per phase; empty (with a note) for a model it cannot size.
    `resolved` is the model's shape, which the planner resolves once for the estimate and the step-time prediction
    (`plan.model`)."""
    name = config.model.name_or_path
    if resolved is None:
        return MemoryEstimate(model=name, source="", parameters=0, trainable_parameters=0, gpus=(), hosts=(),
                              notes=(f"memory not estimated: '{name}' is not in the catalog and has no local "
                                     f"config.json of a dense Llama/Qwen-style model",))
    t = _trainer(config, plan, resolved.shape, workloads)
    holdings = _model_states(t) + _activations(t) + _buffers(t)
    vllm = _vllm_share(config, plan, resolved.shape) if plan.engines else None
    notes = () if t.device.gpus else (f"cluster.accelerator={t.device.name}: trainer ranks are {t.device.slot}es, "
                                      f"counted in host memory",)
    return MemoryEstimate(model=name, source=resolved.source, parameters=t.params, trainable_parameters=t.trainable,
                          gpus=_gpu_budgets(config, plan, holdings, t, vllm) if t.device.gpus else (),
                          hosts=_host_budgets(config, plan, holdings, t, vllm), notes=notes)
