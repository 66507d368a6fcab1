"""The step-time model: what one optimizer step of a plan takes on its GPUs, phase by phase. Pure arithmetic over the
plan, the model's shape (the memory catalog) and the accelerator table (`estimate.accelerators`); no I/O.

The phases' costs are computed here; how they combine is each placement's rule (`Placement.step_time`), and what one
trainer rank computes per optimizer step is its trainer's (`Placement.training_batch`). docs/performance-model.md
derives every formula, says where each constant comes from, and gives the seed cases it was fit on and checked on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.performance import PhaseTime, StepPrediction
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.plan import Plan
from grpo_launch.estimate import catalog
from grpo_launch.estimate.accelerators import Accelerator, accelerator, known_types
from grpo_launch.estimate.catalog import ModelShape
from grpo_launch.estimate.memory import DTYPE_BYTES

# The workload the seeds leave unstated, fixed once (docs/performance-model.md, "Assumptions").
PROMPT_TOKENS = 128            # the sanity set's chat-templated math problems: 100-140 tokens
COMPLETION_MEAN_SHARE = 1 / 3  # mean completion / max_completion_length: the async post's rows of ~1,110 tokens
ROW_FILL = 0.95                # share of a token-budget row that packing fills (the async post: 95%)
ADAPTER_SYNC_S = 6.2           # pause, save, load on every replica, resume: the async post's p50 through a mount

# Hardware efficiencies, not fitted (docs/performance-model.md, "Constants").
HBM_EFFICIENCY = 0.8           # share of peak memory bandwidth a decode step streams weights and KV cache at
ALLREDUCE_LATENCY_S = 10e-6    # one small all-reduce inside a node (tensor parallelism: two per layer per token)
ADAM_BYTES_PER_PARAMETER = 30  # fp32 weight, gradient, m, v read (16), weight, m, v written (12), bf16 copy (2)
HOST_MEMORY_GBS = 200          # CPU Adam's streaming rate over one node's memory (ZeRO optimizer offload)

# Fitted on four published numbers (benchmarks/fit_step_time.py prints the fit; tests hold it).
MATMUL_EFFICIENCY = 0.262      # share of peak bf16 the matmuls of a large micro-batch (or a prefill) reach
LAYER_PASS_S = 2.70e-3         # fixed cost of one decoder layer in one forward or backward pass (launches, hooks)
DECODE_STEP_S = 2.71e-3        # vLLM's fixed cost per decode step beyond reading weights and KV (scheduling, sampling)
DECODE_SEQUENCE_S = 19.2e-6    # and per running sequence per decode step

GB = 1e9


@dataclass(frozen=True)
class Lengths:
    """Token counts per sample. Completions are assumed uniform between 0 and twice their mean, which is
    COMPLETION_MEAN_SHARE of max_completion_length."""

    prompt: float
    max_completion: float
    mean_completion: float

    def longest(self, n: float) -> float:
        """The expected longest of n completions."""
        return min(self.max_completion, 2 * self.mean_completion * n / (n + 1))

    @property
    def sample(self) -> float:
        return self.prompt + self.mean_completion

    @property
    def decode_context(self) -> float:
        """The mean context a decoding sequence attends over: longer completions decode for more steps, so the
        token-weighted mean of prompt + position is prompt + 2/3 of the mean completion (uniform lengths)."""
        return self.prompt + 2 * self.mean_completion / 3

    def describe(self) -> str:
        return (f"prompts of {self.prompt:.0f} tokens, completions of {self.mean_completion:.0f} tokens on average "
                f"(uniform up to {2 * self.mean_completion:.0f}; max_completion_length {self.max_completion:.0f})")


@dataclass(frozen=True)
class TrainingBatch:
    """What one trainer rank computes per optimizer step, as its trainer batches it (a placement's
    `training_batch`)."""

    micro_batches: float         # per optimizer step
    tokens: float                # per micro-batch, through every layer (padding included)
    sequence: float              # the length attention runs over
    samples: float               # completions trained per optimizer step, all ranks
    no_grad_forwards: float      # per micro-batch: TRL's old-logprob scoring, a reference model
    generation_rounds: float     # synchronous trainers: generation batches per optimizer step
    detail: str


@dataclass(frozen=True)
class Training:
    """One rank's training phase per optimizer step."""

    seconds: float               # forward, backward and the optimizer step
    forward_backward_s: float
    detail: str


class Batches(Protocol):
    """A placement, as the model asks it what its trainer computes."""

    def training_batch(self, plan: Plan, lengths: Lengths) -> TrainingBatch: ...


class StepModel:
    """The phases' costs for one plan: the pieces a placement's `step_time` combines."""

    def __init__(self, config: Config, plan: Plan, shape: ModelShape, acc: Accelerator, placement: Batches,
                 lengths: Lengths | None = None):
        """`lengths`: measured token counts to predict with instead of the assumed ones (a GPU run's check)."""
        self.config, self.plan, self.shape, self.acc = config, plan, shape, acc
        self.dtype_bytes = DTYPE_BYTES[config.model.dtype]
        self.lengths = lengths or self._lengths()
        self.batch = placement.training_batch(plan, self.lengths)

    def _lengths(self) -> Lengths:
        longest_sample = self.plan.vllm.max_model_len or self.shape.context
        prompt = min(PROMPT_TOKENS, longest_sample / 2)
        completion = min(self.plan.trainer_facts.max_completion_length, longest_sample - prompt)
        return Lengths(prompt, completion, COMPLETION_MEAN_SHARE * completion)

    # ---- the model ----
    @cached_property
    def parameters(self) -> int:
        return self.shape.parameters

    @cached_property
    def matmul_parameters(self) -> int:
        """Weights every token multiplies by: the decoder layers and the output head (read even when tied)."""
        return self.shape.non_embedding_parameters + self.shape.vocab * self.shape.hidden

    def forward_flops(self, sequence: float) -> float:
        """One token's forward: 2 FLOPs per weight, plus causal attention over half the sequence on average."""
        s = self.shape
        return 2 * self.matmul_parameters + 4 * s.layers * s.q_dim * sequence / 2

    def model_flops(self, sequence: float) -> float:
        """Training FLOPs per token as MFU counts them (TRL's convention): 3 forwards, attention over the whole
        sequence; no recomputation, no extra forwards."""
        s = self.shape
        return 3 * (2 * self.matmul_parameters + 4 * s.layers * s.q_dim * sequence)

    def _peak(self) -> float:
        return self.acc.peak_bf16_tflops * 1e12

    # ---- training ----
    @property
    def trainer_nodes(self) -> int:
        return len(self.plan.trainer_nodes)

    def _trainer_link(self) -> float:
        """Bytes/s per GPU of the trainer ranks' collectives: a ring across nodes runs at the network's rate."""
        return (self.acc.intra_node_gbs if self.trainer_nodes == 1 else self.acc.node.inter_node_gbs) * GB

    @cached_property
    def trainable(self) -> int:
        lora = self.config.lora
        return self.shape.lora_parameters(lora.r, lora.target_modules) if lora.enabled else self.parameters

    @cached_property
    def training(self) -> Training:
        """One rank's forward, backward and optimizer step per optimizer step."""
        b, z, world = self.batch, self.config.zero, self.plan.world_size
        checkpointing = self.plan.trainer_facts.gradient_checkpointing
        passes = 3 + checkpointing + b.no_grad_forwards  # forward, backward (2 forwards' worth), recompute, extra
        compute = b.tokens * self.forward_flops(b.sequence) * passes / (self._peak() * MATMUL_EFFICIENCY) \
            + passes * self.shape.layers * LAYER_PASS_S
        link, share = self._trainer_link(), (world - 1) / world
        weights = 2 * self.parameters
        grads = 2 * self.trainable
        sharded = z.stage == 3 or self.plan.parallelism == "FSDP2"
        if world == 1:
            comm, overlap = 0.0, True
        elif sharded:  # every forward and the backward gather the weights; gradients are reduce-scattered
            comm = ((passes - 1) * weights + grads) * share / link
            overlap = z.overlap_comm if z.overlap_comm is not None and z.stage == 3 else True
        elif z.stage:  # ZeRO-1/2 reduce gradients in every backward
            comm, overlap = grads * share / link, bool(z.overlap_comm)
        else:  # DDP: one all-reduce per optimizer step (no_sync while accumulating)
            comm, overlap = 0.0, True
        micro = max(compute, comm) if overlap else compute + comm
        fwd_bwd = b.micro_batches * micro
        optimizer = self._optimizer(world, link, share, sharded, passes)
        how = (f"{b.micro_batches:g} micro-batch(es) of {b.tokens:,.0f} tokens x {passes:g} passes "
               f"({'checkpointed, ' if checkpointing else ''}{b.detail})")
        return Training(fwd_bwd + optimizer, fwd_bwd, how)

    def _optimizer(self, world: int, link: float, share: float, sharded: bool, passes: float) -> float:
        z = self.config.zero
        per_rank = self.trainable / (world if z.stage or sharded else 1)
        seconds = 0.0
        if z.stage in (1, 2) and world > 1:  # the updated partitions are all-gathered
            seconds += 2 * self.trainable * share / link
        elif not z.stage and not sharded and world > 1:  # DDP's all-reduce
            seconds += 2 * 2 * self.trainable * share / link
        if z.offload_optimizer:  # fp32 gradients down, bf16 weights up; CPU Adam over the node's partitions
            seconds += per_rank * 6 / (self.acc.node.host_link_gbs * GB)
            seconds += per_rank * world / self.trainer_nodes * ADAM_BYTES_PER_PARAMETER / (HOST_MEMORY_GBS * GB)
        else:
            seconds += per_rank * ADAM_BYTES_PER_PARAMETER / (self.acc.memory_bandwidth_gbs * GB * HBM_EFFICIENCY)
        if z.offload_param:  # the weights come up from host memory in every pass
            seconds += self.batch.micro_batches * (passes - 1) * 2 * self.parameters / world \
                / (self.acc.node.host_link_gbs * GB)
        return seconds

    # ---- generation ----
    def decode_step_s(self, tp: int, running: float) -> float:
        """One decode step of an engine of `tp` GPUs with `running` sequences: the larger of streaming weights and
        KV cache and the matmuls, two all-reduces per layer under TP, and vLLM's own cost per step and sequence."""
        s, b = self.shape, self.dtype_bytes
        weights = b * self.matmul_parameters / tp
        kv_per_token = 2 * s.layers * max(1, s.kv_heads // tp) * s.head_dim * b
        stream = (weights + running * self.lengths.decode_context * kv_per_token) \
            / (self.acc.memory_bandwidth_gbs * GB * HBM_EFFICIENCY)
        matmul = running * 2 * self.matmul_parameters / tp / (self._peak() * MATMUL_EFFICIENCY)
        activations = running * s.hidden * b  # what each all-reduce carries
        comm = 0.0 if tp == 1 else 2 * s.layers * (
            ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * activations / (self.acc.intra_node_gbs * GB))
        return max(stream, matmul) + comm + DECODE_STEP_S + running * DECODE_SEQUENCE_S

    def _prefill_s(self, prompts: float, tp: int) -> float:
        """Prompts are prefilled once per group: vLLM's prefix cache shares them between its completions."""
        return prompts * self.lengths.prompt * 2 * self.matmul_parameters / tp / (self._peak() * MATMUL_EFFICIENCY)

    def _concurrency(self, wanted: float) -> float:
        """Sequences an engine runs at once: what it is given, capped by max_num_seqs and by the KV cache."""
        v, cap = self.plan.vllm, wanted
        if v.max_num_seqs:
            cap = min(cap, v.max_num_seqs)
        memory = self.plan.memory
        caches = [b.kv_cache for b in memory.gpus if b.kv_cache] if memory is not None else []
        if caches:
            cap = min(cap, max(1.0, min(c.tokens for c in caches) / self.lengths.sample))
        return max(1.0, cap)

    def batch_generation(self) -> tuple[float, str]:
        """A synchronous trainer's generation batch, split over the plan's engines, per optimizer step: decoding
        runs until the longest completion ends, or at full concurrency when the engine cannot run them all."""
        v, lengths = self.plan.vllm, self.lengths
        engines = len(self.plan.engines)
        tp = v.tensor_parallel_size or 1
        sequences = self.plan.batch.rounds.generation_batch_size / engines
        running = self._concurrency(sequences)
        longest = lengths.longest(sequences)
        tail = longest * self.decode_step_s(tp, min(sequences, running) * lengths.mean_completion / longest)
        throughput = sequences * lengths.mean_completion * self.decode_step_s(tp, running) / running
        prompts = sequences / self.plan.batch.num_generations
        seconds = (max(tail, throughput) + self._prefill_s(prompts, tp)) * self.batch.generation_rounds
        how = (f"{sequences:g} completions per engine ({engines} engine(s) of TP {tp}), {running:g} at once, decoding "
               f"{longest:.0f} steps")
        return seconds, how

    def stream_generation(self, samples: float, in_flight: float) -> tuple[float, str]:
        """Replicas decoding continuously, `in_flight` requests spread over them: their busy time for `samples`
        completions."""
        v, lengths = self.plan.vllm, self.lengths
        replicas = len(self.plan.engines)
        tp = v.tensor_parallel_size or 1
        running = self._concurrency(in_flight / replicas)
        rate = replicas * running / self.decode_step_s(tp, running)  # tokens/s
        prompts = samples / self.plan.batch.num_generations
        seconds = samples * lengths.mean_completion / rate + self._prefill_s(prompts, tp) / replicas
        return seconds, f"{replicas} replica(s) of TP {tp}, {running:g} requests each, {rate:,.0f} tokens/s"

    # ---- weight sync ----
    def gather_s(self) -> float:
        """Sharded weights (ZeRO-3, FSDP2) gathered whole on every rank before they can be sent."""
        world = self.plan.world_size
        if world == 1 or not (self.config.zero.stage == 3 or self.plan.parallelism == "FSDP2"):
            return 0.0
        return 2 * self.parameters * (world - 1) / world / self._trainer_link()

    def load_s(self, tp: int) -> float:
        """Weights copied into a colocated engine's tensors on the same GPU."""
        return self.dtype_bytes * self.parameters / tp / (self.acc.memory_bandwidth_gbs * GB * HBM_EFFICIENCY)

    def broadcast_s(self, across_nodes: bool) -> float:
        """The whole model sent from trainer rank 0 to a server's GPUs over NCCL."""
        link = self.acc.node.inter_node_gbs if across_nodes else self.acc.intra_node_gbs
        return self.dtype_bytes * self.parameters / (link * GB)


@dataclass(frozen=True)
class StepSplit:
    """A placement's combination of the phases."""

    phases: tuple[PhaseTime, ...]
    step_s: float
    median_step_s: float
    bottleneck: str


def one_after_another(generation: tuple[float, str], sync: tuple[float, str], training: tuple[float, str],
                      why: str) -> StepSplit:
    """Generation, weight sync and training take turns on the trainer's clock; nothing waits beside them."""
    phases = (PhaseTime(Phase.GENERATE, generation[0], detail=generation[1]),
              PhaseTime(Phase.SYNC, sync[0], detail=sync[1]),
              PhaseTime(Phase.TRAIN, training[0], detail=training[1]),
              PhaseTime(Phase.WAIT, 0.0, detail="nothing overlaps: no rollout queue"))
    step = generation[0] + sync[0] + training[0]
    largest = max(phases[:3], key=lambda p: p.seconds)
    return StepSplit(phases, step, step, f"{largest.name.noun} ({largest.seconds / step:.0%} of the step); {why}")


class StepRules(Batches, Protocol):
    """A placement, as the model sees it: its trainer's batches and its rule for combining the phases."""

    def step_time(self, model: StepModel) -> StepSplit: ...


def _no_prediction(config: Config, plan: Plan, model: catalog.ResolvedModel | None) -> str | None:
    c = config.cluster
    if not plan.device.gpus:
        return ("no step-time prediction for CPUs: a CPU's throughput depends on its cores, vector units and clock, "
                "which a recipe does not state")
    if accelerator(c.gpu_type) is None:
        return (f"no step-time prediction: cluster.gpu_type '{c.gpu_type}' is not in the accelerator table (known: "
                f"{', '.join(known_types())})")
    if model is None:
        return "no step-time prediction: the model's size is unknown (see the memory note)"
    return None


def predict(config: Config, plan: Plan, placement: StepRules, model: catalog.ResolvedModel | None) -> StepPrediction:
    """The plan's step time, phase by phase, combined by its placement (`model`: the shape `catalog.resolve` found);
    a prediction with a note and no numbers when the tables cannot say (a CPU, an unknown GPU type or model), and
    the training phase alone when generation runs in transformers, which the model does not cover."""
    c = config.cluster
    held = c.nodes * c.gpus_per_node if plan.device.gpus else 0
    in_use = len({(p.node, g) for p in plan.processes for g in p.gpus})
    max_steps = plan.trainer_inputs.max_steps
    common = {"gpus_held": held, "gpus_in_use": in_use, "max_steps": max_steps if max_steps > 0 else None,
              "gpu_hour_price": c.gpu_hour_price}
    why_not = _no_prediction(config, plan, model)
    if why_not is not None:
        return StepPrediction(note=why_not, **common)
    acc = accelerator(c.gpu_type)
    steps = StepModel(config, plan, model.shape, acc, placement)
    b, training = steps.batch, steps.training
    flops = b.micro_batches * b.tokens * steps.model_flops(b.sequence)
    mfu = flops / (training.forward_backward_s * acc.peak_bf16_tflops * 1e12) if training.forward_backward_s else None
    known = {"accelerator": acc.name, "samples_per_step": b.samples, "mfu": mfu,
             "assumptions": (steps.lengths.describe(),)}
    if not plan.vllm.enabled:
        return StepPrediction(note="no step-time prediction: generation runs in transformers (vllm.enabled=false), "
                                   "which the model does not cover; the training phase alone is predicted",
                              phases=(PhaseTime(Phase.TRAIN, training.seconds, detail=training.detail),),
                              **known, **common)
    split = placement.step_time(steps)
    return StepPrediction(note="", phases=split.phases, step_s=split.step_s, median_step_s=split.median_step_s,
                          bottleneck=split.bottleneck, **known, **common)
