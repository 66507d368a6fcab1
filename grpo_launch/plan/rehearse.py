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

from grpo_launch.compose.schema import Config, Model, TinyModel
from grpo_launch.contracts import trl_fields
from grpo_launch.contracts.devices import CPU
from grpo_launch.contracts.hosts import LOOPBACK
from grpo_launch.contracts.plan import Plan, Role
from grpo_launch.contracts.rundir import CHECKPOINTS_DIR
from grpo_launch.contracts.userdirs import XDG_CACHE_HOME
from grpo_launch.contracts.vllm import VLLM_LORA_RANKS
from grpo_launch.plan.placements import placement_of
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.schedulers import SCHEDULERS
from grpo_launch.plan.trainer_args import output_dir

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
CACHES = {XDG_CACHE_HOME: "cache", "HF_HOME": "cache/huggingface", "VLLM_CACHE_ROOT": "cache/vllm",
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
    servers = [p for p in plan.processes if p.role == Role.VLLM]
    for p in plan.processes:
        kind = "replica" if p.role == Role.VLLM and len(servers) > 1 else str(p.role)
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


@dataclass(frozen=True)
class Part:
    """What one feature group of the rehearsal keeps, shrinks or cannot do, and the config keys it sets."""

    features: tuple[Feature, ...]
    changes: dict[str, Any] = field(default_factory=dict)  # dotted key -> the rehearsal's value
    files: dict[str, str] = field(default_factory=dict)


def replaced(section: Any, changes: dict[str, Any]) -> Any:
    """A typed config section with the values at dotted keys replaced."""
    here = {k: v for k, v in changes.items() if "." not in k}
    below: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        if "." in key:
            head, _, rest = key.partition(".")
            below.setdefault(head, {})[rest] = value
    return replace(section, **here, **{k: replaced(getattr(section, k), v) for k, v in below.items()})


def derive(config: Config, plan: Plan, *, host_memory_gib: float, hub: str | None,
           schedulers: Collection[str] = ("local",), environment: Collection[str] = ()) -> Rehearsal:
    """The rehearsal of `config` (planned as `plan`) on this machine. `hub`: None when the hub answers, else why it
    does not (the rehearsal then uses stand-in rows in the dataset's columns). `schedulers`: those that can run
    a job here (a Slurm cluster answering `sbatch`); another is rehearsed by `grpo run` itself. `environment`: the
    names the caller's environment sets (a cache it sets stays where it points)."""
    placement = placement_of(config)
    parts = (_where(config, plan, placement, host_memory_gib), _scheduler(config, schedulers), _model(config),
             _vllm(config, plan, placement), _training(config, plan, placement), _data(config, hub),
             _caches(config, environment))
    changes = {k: v for part in parts for k, v in part.changes.items()}
    return Rehearsal(replaced(config, changes), tuple(f for part in parts for f in part.features),
                     {k: v for part in parts for k, v in part.files.items()})


def _where(config: Config, plan: Plan, placement: Placement, host_memory_gib: float) -> Part:
    """The nodes (at most MAX_NODES, on loopback) and their CPU process slots: trainer ranks and engines."""
    c = config.cluster
    nodes = min(c.nodes, MAX_NODES)
    dedicated = [e for e in plan.engines if e.process is not None]
    engine_nodes = sorted({e.node for e in dedicated})
    replicas = min(len(dedicated), MAX_REPLICAS) if dedicated else 0
    # An engine node of its own stays one (a vLLM node and trainer nodes); otherwise engines share the node.
    engines_apart = bool(dedicated) and nodes == MAX_NODES and not set(engine_nodes) & set(plan.trainer_nodes)
    ranks = placement.trainer_ranks_on(CPU) or (2 if nodes == 1 or engines_apart else 1)
    if engines_apart:
        slots, rehearsal_trainer_nodes = max(ranks, replicas), 1
    else:
        slots, rehearsal_trainer_nodes = ranks + replicas, None
    features = (
        _feature("placement", config.placement.kind, config.placement.kind),
        _feature("nodes", f"{c.nodes} ({', '.join(plan.hosts)})", f"{nodes} ({', '.join([LOOPBACK] * nodes)})",
                 "capped at 2, every one on this machine's loopback"),
        _feature("devices", f"{c.gpus_per_node} x {c.gpu_type} per node", f"{slots} {CPU.slot} slot(s) per node",
                 "GPUs become CPU processes"),
        _feature("launcher", config.launcher, config.launcher),
    )
    return Part(features, {"cluster": replace(c, accelerator=CPU.name, nodes=nodes, gpus_per_node=slots,
                                              gpu_type=CPU.name, gpu_memory_gib=host_memory_gib,
                                              host_memory_gib=host_memory_gib, hosts=[]),
                           "placement.trainer_nodes": rehearsal_trainer_nodes, "run.dir": None})


def _scheduler(config: Config, schedulers: Collection[str]) -> Part:
    """The scheduler where it can run a job here, else `grpo run` itself; the job asks for no GPUs."""
    s = config.scheduler
    on_cpu = SCHEDULERS[s.kind].on_cpu(s)
    if s.kind in schedulers:
        return Part((_feature("scheduler", s.kind, s.kind),), {"scheduler": on_cpu})
    return Part((_feature("scheduler", s.kind, "local", f"no {s.kind} here: `grpo run` starts every node itself "
                          f"(`grpo plan --dry-run` shows the job file)", impossible=True),),
                {"scheduler": replace(on_cpu, kind="local")})


def _model(config: Config) -> Part:
    """The built-in tiny model, of the recipe's family where it is Qwen-shaped, in float32."""
    m = config.model
    shape = TinyModel(max_position_embeddings=CONTEXT)
    model = Model(name_or_path=TINY, dtype="float32", tiny=shape, trust_remote_code=False,
                  attn_implementation=m.attn_implementation if m.attn_implementation in CPU_ATTENTION else None)
    same_family = TINY_FAMILY_NAME in m.name_or_path.lower() or m.name_or_path == TINY
    features = [
        _feature("model", m.name_or_path, f"{TINY} (Qwen2-shaped, hidden {shape.hidden_size}, {shape.num_layers} "
                 f"layers)", "a tiny random model of the same family that vLLM's CPU build serves" if same_family
                 else "the built-in tiny model is Qwen2-shaped; this model's family has no tiny stand-in",
                 impossible=not same_family),
        _feature("dtype", m.dtype, "float32", "CPU runs compute in float32"),
    ]
    if m.attn_implementation != model.attn_implementation:
        features.append(_feature("attention kernel", m.attn_implementation, model.attn_implementation,
                                 "a GPU kernel; the CPU runs the default", impossible=True))
    return Part(tuple(features), {"model": model})


def _vllm(config: Config, plan: Plan, placement: Placement) -> Part:
    """vLLM at TP 1, at most MAX_REPLICAS replicas, a context a character tokenizer's prompts fit, CPU blocks."""
    v, a = config.vllm, config.placement.async_lora
    changes = {"vllm": replace(v, tensor_parallel_size=1, max_model_len=CONTEXT, block_size=CPU.block_multiple,
                               enforce_eager=True, health_timeout_s=min(v.health_timeout_s, 600.0)),
               "placement.colocate.sleep_level": 0, "placement.async_lora.replicas": min(a.replicas, MAX_REPLICAS),
               "placement.async_lora.stagger_s": 0.0}
    features: list[Feature] = []
    dedicated = [e for e in plan.engines if e.process is not None]
    if v.enabled:
        features.append(_feature("vLLM tensor parallel size", v.tensor_parallel_size, 1))
        if dedicated:
            features.append(_feature("vLLM servers", len(dedicated), min(len(dedicated), MAX_REPLICAS),
                                     "replicas capped at 2"))
        features.append(_feature("context (max_model_len)", v.max_model_len or "the model's", CONTEXT,
                                 "one token a character with the built-in tokenizer"))
        if plan.vllm.sleep_level and not CPU.sleep_mode:
            features.append(_feature("vLLM sleep mode", f"level {plan.vllm.sleep_level}", "off (level 0)",
                                     "vLLM has no sleep mode on a CPU (CUDA, ROCm and XPU only)", impossible=True))
    features += [_feature(*gpu_only, impossible=True) for gpu_only in placement.needs_cuda(plan)]
    return Part(tuple(features), changes)


def _training(config: Config, plan: Plan, placement: Placement) -> Part:
    """ZeRO and LoRA as they are (the rank within vLLM's), the rewards, and TRL's sizes shrunk."""
    z, lora = config.zero, config.lora
    zero = f"stage {z.stage}" + (" + optimizer offload" if z.offload_optimizer else "") + \
           (" + parameter offload" if z.offload_param else "")
    rank = lora.r if lora.r <= max(VLLM_LORA_RANKS) else max(VLLM_LORA_RANKS)
    rewards = ", ".join(r.fn for r in config.rewards)
    trainer = _trainer_args(config, placement.trainer_class)
    get = lambda name: trl_fields.effective(config.trainer, placement.trainer_class, name)  # noqa: E731
    b = plan.batch
    features = [
        _feature("ZeRO", zero if z.stage else "off", zero if z.stage else "off"),
        _feature("LoRA", f"r={lora.r}" if lora.enabled else "off", f"r={rank}" if lora.enabled else "off"),
        _feature("rewards", rewards, rewards, "called on real completions"),
        _feature("num_generations", get("num_generations"), trainer["num_generations"]),
        _feature("steps", get("max_steps"), STEPS),
        _feature("completion length", get("max_completion_length"), trainer["max_completion_length"]),
        _feature("batch", f"{b.per_device_train_batch_size} per device x {b.gradient_accumulation_steps} "
                          f"accumulation", f"{trainer['per_device_train_batch_size']} per device x 1 accumulation",
                 "chosen so that TRL's batch rules hold at the rehearsal's world size"),
    ]
    if get("report_to") not in ("none", None, [], ["none"]):
        features.append(_feature("reporting", get("report_to"), "none", "no tracker is reached from a rehearsal",
                                 impossible=True))
    real_output = output_dir(config)
    if real_output.startswith(("/", "~")):  # shared storage of the real cluster: the rehearsal keeps to its run dir
        trainer["output_dir"] = CHECKPOINTS_DIR
        features.append(_feature("output_dir", real_output, f"{CHECKPOINTS_DIR} (in the run directory)"))
    return Part(tuple(features), {"trainer": trainer, "lora.r": rank})


def _data(config: Config, hub: str | None) -> Part:
    """The recipe's own rows where they can be read (the first DATA_ROWS), else stand-in rows in its columns."""
    d = config.data
    source = f"{d.source} {d.path}"
    if d.source == "builtin":
        return Part((_feature("data", source, source, "built-in rows"),), {"data.num_samples": DATA_ROWS})
    if d.source == "files" or hub is None:
        rows = min(d.max_samples or DATA_ROWS, DATA_ROWS)
        return Part((_feature("data", f"{source} (columns {_columns(d)})",
                              f"the first {rows} rows, columns {_columns(d)}"),), {"data.max_samples": rows})
    return Part((_feature("data", f"{source} (columns {_columns(d)})",
                          f"{DATA_ROWS} stand-in rows in the same columns (chat prompts)",
                          f"the hub is out of reach: {hub}", impossible=True),),
                {"data": replace(d, source="files", path=STAND_IN_DATA, config=None, max_samples=None)},
                {STAND_IN_DATA: _stand_in_rows(config)})


def _caches(config: Config, environment: Collection[str]) -> Part:
    """The caches the processes write under ~, inside the run directory unless the environment points them."""
    caches = {k: v for k, v in CACHES.items() if k not in environment and k not in config.env.set}
    return Part((), {"env.set": {**config.env.set, **caches}})


def _columns(d) -> str:
    return d.prompt_column + (f", {d.answer_column}" if d.answer_column else "")


def _trainer_args(config: Config, config_class: str) -> dict[str, Any]:
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
