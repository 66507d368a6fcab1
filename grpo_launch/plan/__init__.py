"""Plan: a composed config -> a `Plan`. Pure: no I/O, no clock, no environment, no torch.

Every rule that makes a layout valid lives here or in the placement modules (one per placement, same shape:
`plan(ctx) -> PlacementResult` and a `CONFIG_CLASS`). `build_plan` twice on the same config gives equal plans.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from grpo_launch import builtins
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.memory.estimate import estimate as estimate_memory
from grpo_launch.plan import async_lora, colocate, server
from grpo_launch.plan.common import (
    Context,
    check_env,
    check_hosts,
    model_path,
    prepare_steps,
    trainer_processes,
)
from grpo_launch.plan.documents import (
    ACCELERATE_FILE,
    DEEPSPEED_FILE,
    accelerate_config,
    check_zero,
    deepspeed_config,
)
from grpo_launch.plan.launch_script import launch_script
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.trainer_args import build_trainer_args, build_trainer_inputs, check_grpo_batch
from grpo_launch.plan.types import Engine, Plan, ProcessSpec
from grpo_launch.schema import Config

if TYPE_CHECKING:
    from grpo_launch.compose import Composed

PLACEMENTS: dict[str, ModuleType] = {"colocate": colocate, "server": server, "async-lora": async_lora}
LAUNCH_FILE = "launch.sh"
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")

__all__ = ["PLACEMENTS", "Plan", "ProcessSpec", "build_plan"]


def _check_data(config: Config) -> None:
    d = config.data
    if d.source == "builtin" and d.path not in builtins.TASKS:
        raise UserError(f"unknown built-in task '{d.path}'{did_you_mean(d.path, builtins.TASKS)}", key="data.path",
                        hint=f"built-in tasks: {', '.join(builtins.TASKS)}")
    if d.source == "files" and not d.path.endswith(DATA_SUFFIXES):
        raise UserError(f"data.path '{d.path}' is not a {'/'.join(DATA_SUFFIXES)} file or glob", key="data.path",
                        hint="use data.source=hub for a dataset on the hub")


def _gpu_map(config: Config, layout: Layout, engines: list[Engine], placement: str) -> tuple[tuple[str, ...], ...]:
    c = config.cluster
    grid = [["idle"] * c.gpus_per_node for _ in range(c.nodes)]
    for rank in range(layout.world_size):
        node, gpu = layout.rank_location(rank)
        grid[node][gpu] = f"train {rank}"
    label = "replica" if placement == "async-lora" else "vllm"
    for e in engines:
        for shard, gpu in enumerate(e.gpus):
            tag = f"{label} {e.index}" + (f" tp{shard}" if len(e.gpus) > 1 else "")
            grid[e.node][gpu] = f"{grid[e.node][gpu]} + {tag}" if e.ranks else tag
    return tuple(tuple(row) for row in grid)


def _idle_warning(layout: Layout, config: Config) -> list[str]:
    idle = layout.idle(config.cluster.nodes, config.cluster.gpus_per_node)
    if not idle or config.cluster.accelerator == "cpu":
        return []
    where = ", ".join(f"node {n} GPU {g}" for n, g in idle)
    return [f"{len(idle)} GPU(s) idle: {where}"]


def build_plan(composed: Composed) -> Plan:
    config = composed.config
    check_hosts(config)
    check_env(config)
    check_zero(config)
    builtins.builtin_model(config.model.name_or_path)
    _check_data(config)

    placement = PLACEMENTS[config.placement.kind]
    ctx = Context(config)
    result = placement.plan(ctx)
    layout = result.layout
    world = layout.world_size

    args = build_trainer_args(config, placement.CONFIG_CLASS, result.trainer_args)
    inputs = build_trainer_inputs(config, model_path(config))
    files: dict = {}
    if config.zero.stage:
        files[DEEPSPEED_FILE] = deepspeed_config(config)
        if config.launcher == "torchrun":
            args["deepspeed"] = DEEPSPEED_FILE  # accelerate reads it from accelerate.yaml instead
    files[ACCELERATE_FILE] = accelerate_config(config, machines=len(layout.trainer_nodes), processes=world,
                                               main_ip=ctx.host(layout.trainer_nodes[0]), fsdp2=result.fsdp2)
    batch = check_grpo_batch(args, world, placement.CONFIG_CLASS)
    if placement is colocate and config.vllm.enabled:  # TRL sizes the colocated engine from the batch
        batch["vllm_max_num_seqs"] = (batch["per_device_train_batch_size"] * config.vllm.tensor_parallel_size
                                      * batch["steps_per_generation"])

    processes = tuple(result.services) + tuple(trainer_processes(ctx, layout, result.trainer_depends_on))
    prepare = prepare_steps(config)
    files[LAUNCH_FILE] = launch_script(composed.recipe, config.placement.kind, prepare, processes,
                                       config.env.passthrough)
    plan = Plan(
        recipe=composed.recipe,
        placement=config.placement.kind,
        accelerator=config.cluster.accelerator,
        nodes=config.cluster.nodes,
        gpus_per_node=config.cluster.gpus_per_node,
        gpu_type=config.cluster.gpu_type,
        gpu_memory_gib=config.cluster.gpu_memory_gib,
        hosts=tuple(ctx.host(n) for n in range(config.cluster.nodes)),
        launcher=config.launcher,
        world_size=world,
        vllm=result.vllm,
        zero_stage=config.zero.stage,
        engines=tuple(result.engines),
        processes=processes,
        gpu_map=_gpu_map(config, layout, result.engines, config.placement.kind),
        ports=ctx.ports.claims(),
        files=files,
        prepare=prepare,
        trainer_class=placement.CONFIG_CLASS,
        trainer_args=args,
        trainer_inputs=inputs,
        batch=batch,
        warnings=tuple(ctx.warnings + _idle_warning(layout, config)),
    )
    return replace(plan, memory=estimate_memory(config, plan))  # the CLI decides whether a misfit is fatal
