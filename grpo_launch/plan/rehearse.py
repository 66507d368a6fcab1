"""A rehearsal: the recipe's whole process graph, small, on this CPU machine, before the GPUs are paid for.

`derive` turns a recipe's typed config (and its real plan) into a rehearsal config that keeps the recipe's shape
and shrinks only its sizes, and lists each feature of the real recipe with what the rehearsal does with it: kept
as is, shrunk (from -> to), or could not (why). Pure, like all of planning: what the machine offers (its memory,
whether the hub answers) comes in as arguments. docs/rehearse.md says what is kept, shrunk and impossible on a CPU.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_launch.compose import trl_fields
from grpo_launch.compose.schema import Config, Model, TinyModel
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.vllm import VLLM_LORA_RANKS
from grpo_launch.plan.placements import placement_of
from grpo_launch.plan.schedulers import SCHEDULERS

KEPT, SHRUNK, COULD_NOT = "kept", "shrunk", "could not"
MAX_NODES = 2
MAX_REPLICAS = 2
STEPS = 2
COMPLETION_TOKENS = 8
CONTEXT = 1024           # character tokens: a real dataset's prompts, one token a character, must fit
DATA_ROWS = 64           # the first rows of a files or hub dataset
STAND_IN_DATA = "rehearsal-prompts.jsonl"  # written into the rehearsal's run directory when the hub is out of reach
TINY = "builtin:tiny"
TINY_FAMILY_NAME = "qwen"  # the built-in model is Qwen2-shaped (contracts.tiny): Qwen models rehearse as their kin
# The CPU's attention kernels: the tiny model runs these (FlashAttention and the like need a GPU).
CPU_ATTENTION = (None, "sdpa", "eager")
# Caches the processes would write under ~ (Hugging Face, vLLM, torch's extensions, Triton, XDG's): inside the
# rehearsal's run directory (relative: every process runs there), unless the caller's environment sets them.
CACHES = {"XDG_CACHE_HOME": "cache", "HF_HOME": "cache/huggingface", "VLLM_CACHE_ROOT": "cache/vllm",
          "VLLM_CONFIG_ROOT": "cache/vllm-config", "TORCH_EXTENSIONS_DIR": "cache/torch_extensions",
          "TRITON_CACHE_DIR": "cache/triton"}


@dataclass(frozen=True)
class Feature:
    name: str
    real: str
    rehearsal: str
    status: str          # KEPT, SHRUNK or COULD_NOT
    why: str = ""


@dataclass(frozen=True)
class Rehearsal:
    config: Config
    features: tuple[Feature, ...]
    files: dict[str, str] = field(default_factory=dict)  # extra run-directory files (a stand-in dataset)


def _feature(name: str, real: Any, rehearsal: Any, why: str = "", *, impossible: bool = False) -> Feature:
    real_text, rehearsal_text = str(real), str(rehearsal)
    status = COULD_NOT if impossible else KEPT if real_text == rehearsal_text else SHRUNK
    return Feature(name, real_text, rehearsal_text, status, why)


def processes_feature(real: Plan, rehearsal: Plan) -> Feature:
    """The kinds of process and their order, real against rehearsed (known once the rehearsal is planned)."""
    return _feature("processes", _processes(real), _processes(rehearsal), "counts shrunk, kinds and order kept")


def _processes(plan: Plan) -> str:
    """The kinds of process in start order, with counts: 'vllm x6, proxy, trainer x1'."""
    out: list[list] = []
    for p in plan.processes:
        kind = "replica" if p.role == "vllm" and len([q for q in plan.processes if q.role == "vllm"]) > 1 else p.role
        if out and out[-1][0] == kind:
            out[-1][1] += 1
        else:
            out.append([kind, 1])
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in out)


def _stand_in_rows(config: Config) -> str:
    """Built-in sums in the recipe's own columns: the prompt column as chat messages (as the hub's RL datasets and
    TRL's own reward functions have them), and the answer column's nested path, so the column mapping runs as it
    would on the real rows."""
    d = config.data
    rows = []
    for i in range(DATA_ROWS):
        a, b = (i * 7) % 50, (i * 13) % 50
        row: dict[str, Any] = {d.prompt_column: [{"role": "user", "content": f"{a}+{b}="}]}
        if d.answer_column is not None:
            node = row
            *parents, last = d.answer_column.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = str(a + b)
        rows.append(json.dumps(row))
    return "\n".join(rows) + "\n"


def derive(config: Config, plan: Plan, *, host_memory_gib: float, hub: str | None,
           schedulers: Collection[str] = ("local",), environment: Collection[str] = ()) -> Rehearsal:
    """The rehearsal of `config` (planned as `plan`) on this machine. `hub`: None when the hub answers, else why it
    does not (the rehearsal then uses stand-in rows in the dataset's columns). `schedulers`: those that can run
    a job here (a Slurm cluster answering `sbatch`); another is rehearsed by `grpo run` itself. `environment`: the
    names the caller's environment sets (a cache it sets stays where it points)."""
    c, v = config.cluster, config.vllm
    placement = placement_of(config)
    features: list[Feature] = []
    files: dict[str, str] = {}

    # -- where things run ---------------------------------------------------------------------------------------
    nodes = min(c.nodes, MAX_NODES)
    trainer_nodes = sorted({p.node for p in plan.processes if p.role == "trainer"})
    dedicated = [e for e in plan.engines if e.process is not None]
    engine_nodes = sorted({e.node for e in dedicated})
    replicas = min(len(dedicated), MAX_REPLICAS) if dedicated else 0
    # An engine node of its own stays one (a vLLM node and trainer nodes); otherwise engines share the node.
    engines_apart = bool(dedicated) and nodes == MAX_NODES and not set(engine_nodes) & set(trainer_nodes)
    ranks = placement.cpu_trainer_ranks or (2 if nodes == 1 or engines_apart else 1)
    if engines_apart:
        slots, rehearsal_trainer_nodes = max(ranks, replicas), 1
    else:
        slots, rehearsal_trainer_nodes = ranks + replicas, None
    features += [
        _feature("placement", config.placement.kind, config.placement.kind),
        _feature("nodes", f"{c.nodes} ({', '.join(plan.hosts)})",
                 f"{nodes} ({', '.join(['127.0.0.1'] * nodes)})",
                 "capped at 2, every one on this machine's loopback"),
        _feature("devices", f"{c.gpus_per_node} x {c.gpu_type} per node", f"{slots} CPU process slot(s) per node",
                 "GPUs become CPU processes"),
        _feature("launcher", config.launcher, config.launcher),
    ]
    scheduler = config.scheduler
    if scheduler.kind not in schedulers:
        features.append(_feature("scheduler", scheduler.kind, "local", f"no {scheduler.kind} here: `grpo run` starts "
                                 f"every node itself (`grpo plan --dry-run` shows the job file)", impossible=True))
        scheduler = replace(scheduler, kind="local")
    else:
        features.append(_feature("scheduler", scheduler.kind, scheduler.kind))

    # -- the model ----------------------------------------------------------------------------------------------
    shape = TinyModel(max_position_embeddings=CONTEXT)
    model = Model(name_or_path=TINY, dtype="float32", tiny=shape, trust_remote_code=False,
                  attn_implementation=config.model.attn_implementation
                  if config.model.attn_implementation in CPU_ATTENTION else None)
    same_family = TINY_FAMILY_NAME in config.model.name_or_path.lower() or config.model.name_or_path == TINY
    features.append(_feature("model", config.model.name_or_path, f"{TINY} (Qwen2-shaped, hidden {shape.hidden_size}, "
                             f"{shape.num_layers} layers)", "a tiny random model of the same family that vLLM's CPU "
                             "build serves" if same_family else "the built-in tiny model is Qwen2-shaped; this "
                             "model's family has no tiny stand-in", impossible=not same_family))
    features.append(_feature("dtype", config.model.dtype, "float32", "CPU runs compute in float32"))
    if config.model.attn_implementation != model.attn_implementation:
        features.append(_feature("attention kernel", config.model.attn_implementation, model.attn_implementation,
                                 "a GPU kernel; the CPU runs the default", impossible=True))

    # -- vLLM -----------------------------------------------------------------------------------------------------
    vllm = replace(v, tensor_parallel_size=1, sleep_level=0,
                   data_parallel_size=None if v.data_parallel_size is None else min(v.data_parallel_size, MAX_REPLICAS),
                   max_model_len=CONTEXT, block_size=32, enforce_eager=True, stagger_s=0.0,
                   health_timeout_s=min(v.health_timeout_s, 600.0))
    if v.enabled:
        features.append(_feature("vLLM tensor parallel size", v.tensor_parallel_size, 1))
        if dedicated:
            features.append(_feature("vLLM servers", len(dedicated), replicas, "replicas capped at 2"))
        features.append(_feature("context (max_model_len)", v.max_model_len or "the model's", CONTEXT,
                                 "one token a character with the built-in tokenizer"))
        if v.sleep_level:
            features.append(_feature("vLLM sleep mode", f"level {v.sleep_level}", "off (level 0)",
                                     "vLLM has no sleep mode on a CPU (CUDA, ROCm and XPU only)", impossible=True))
    features += [_feature(*gpu_only, impossible=True) for gpu_only in placement.needs_cuda(plan)]

    # -- training -------------------------------------------------------------------------------------------------
    z = config.zero
    zero = f"stage {z.stage}" + (" + optimizer offload" if z.offload_optimizer else "") + \
           (" + parameter offload" if z.offload_param else "")
    features.append(_feature("ZeRO", zero if z.stage else "off", zero if z.stage else "off"))
    lora = config.lora
    rank = lora.r if lora.r <= max(VLLM_LORA_RANKS) else max(VLLM_LORA_RANKS)
    features.append(_feature("LoRA", f"r={lora.r}" if lora.enabled else "off", f"r={rank}" if lora.enabled else "off"))
    features.append(_feature("rewards", ", ".join(r.fn for r in config.rewards),
                             ", ".join(r.fn for r in config.rewards), "called on real completions"))
    trainer = _trainer_args(config, plan, placement.trainer_class)
    get = lambda name: trl_fields.effective(config.trainer, placement.trainer_class, name)  # noqa: E731
    features += [
        _feature("num_generations", get("num_generations"), trainer["num_generations"]),
        _feature("steps", get("max_steps"), STEPS),
        _feature("completion length", get("max_completion_length"), trainer["max_completion_length"]),
        _feature("batch", f"{plan.batch['per_device_train_batch_size']} per device x "
                          f"{plan.batch['gradient_accumulation_steps']} accumulation",
                 f"{trainer['per_device_train_batch_size']} per device x 1 accumulation",
                 "chosen so that TRL's batch rules hold at the rehearsal's world size"),
    ]
    if get("report_to") not in ("none", None, [], ["none"]):
        features.append(_feature("reporting", get("report_to"), "none", "no tracker is reached from a rehearsal",
                                 impossible=True))

    # -- data -----------------------------------------------------------------------------------------------------
    d = config.data
    data = d
    source = f"{d.source} {d.path}"
    if d.source == "builtin":
        data = replace(d, num_samples=DATA_ROWS)
        features.append(_feature("data", source, source, "built-in rows"))
    elif d.source == "files" or hub is None:
        data = replace(d, max_samples=min(d.max_samples or DATA_ROWS, DATA_ROWS))
        features.append(_feature("data", f"{source} (columns {_columns(d)})", f"the first {data.max_samples} "
                                 f"rows, columns {_columns(d)}"))
    else:
        files[STAND_IN_DATA] = _stand_in_rows(config)
        data = replace(d, source="files", path=STAND_IN_DATA, config=None, max_samples=None)
        features.append(_feature("data", f"{source} (columns {_columns(d)})",
                                 f"{DATA_ROWS} stand-in rows in the same columns (chat prompts)",
                                 f"the hub is out of reach: {hub}", impossible=True))

    output_dir = str(config.trainer.get("output_dir", "checkpoints"))
    if output_dir.startswith(("/", "~")):  # shared storage of the real cluster: the rehearsal keeps to its run dir
        trainer["output_dir"] = "checkpoints"
        features.append(_feature("output_dir", output_dir, "checkpoints (in the run directory)"))
    caches = {k: v for k, v in CACHES.items() if k not in environment and k not in config.env.set}
    rehearsal = replace(
        config, model=model, data=data, vllm=vllm, trainer=trainer,
        env=replace(config.env, set={**config.env.set, **caches}),
        lora=replace(lora, r=rank),
        cluster=replace(c, accelerator="cpu", nodes=nodes, gpus_per_node=slots, gpu_type="cpu",
                        gpu_memory_gib=host_memory_gib, host_memory_gib=host_memory_gib, hosts=[]),
        placement=replace(config.placement, trainer_nodes=rehearsal_trainer_nodes),
        scheduler=SCHEDULERS[scheduler.kind].on_cpu(scheduler),
        run=replace(config.run, dir=None))
    return Rehearsal(rehearsal, tuple(features), files)


def _columns(d) -> str:
    return d.prompt_column + (f", {d.answer_column}" if d.answer_column else "")


def _trainer_args(config: Config, plan: Plan, config_class: str) -> dict[str, Any]:
    """The recipe's TRL arguments with sizes shrunk: a few steps, short completions, one micro-batch a step holding
    whole prompt groups at any world size."""
    args = {k: v for k, v in config.trainer.items() if k not in ("generation_batch_size", "steps_per_generation",
                                                                  "eval_strategy", "eval_steps", "token_budget")}
    groups = trl_fields.effective(config.trainer, config_class, "num_generations")
    saves = trl_fields.effective(config.trainer, config_class, "save_strategy") != "no"
    args |= {"max_steps": STEPS, "num_generations": groups, "per_device_train_batch_size": groups,
             "gradient_accumulation_steps": 1, "logging_steps": 1, "report_to": "none",
             "max_completion_length": min(trl_fields.effective(config.trainer, config_class, "max_completion_length"),
                                          COMPLETION_TOKENS),
             "save_strategy": "steps" if saves else "no"}
    if saves:
        args["save_steps"] = STEPS
    for name, cap in (("max_inflight_tasks", 8), ("queue_maxsize", 16), ("request_timeout", 120)):
        if trl_fields.has_field(config_class, name):
            args[name] = min(trl_fields.effective(config.trainer, config_class, name), cap)
    return args
