"""Plan: a composed config -> a `Plan`. Pure: no I/O, no clock, no environment, no torch.

Every rule that makes a layout valid lives here: the checks no placement owns (`checks`), the placement's own
(`placements/`), TRL's rules at the plan's world size (`trl_rules`), GPU and port assignment (`layout`, `ports`),
the generated files (`documents`, `launch_script`). The memory estimate sizes the plan and `step_time` predicts
its optimizer step, each placement combining the phases its own way. `build_plan` twice on the same config gives
equal plans.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from grpo_launch.compose import trl_fields
from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Engine, Plan, ProcessSpec
from grpo_launch.contracts.rundir import ACCELERATE_FILE, DEEPSPEED_FILE, LAUNCH_FILE
from grpo_launch.errors import UserError
from grpo_launch.memory import catalog
from grpo_launch.memory.estimate import estimate as estimate_memory
from grpo_launch.plan.checks import (
    builtin_model,
    check_context,
    check_data,
    check_hosts,
    check_model_shape,
    check_recipe_name,
    check_tensor_parallel,
    exposed_dev_mode,
)
from grpo_launch.plan.context import Context
from grpo_launch.plan.documents import accelerate_config, check_zero, deepspeed_config
from grpo_launch.plan.launch_script import launch_script
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.placements import placement_of
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.processes import prepare_steps, trainer_processes, watched
from grpo_launch.plan.schedulers import scheduler_of
from grpo_launch.plan.secrets import check_secrets
from grpo_launch.plan.step_time import predict as predict_step_time
from grpo_launch.plan.trainer_args import build_trainer_args, build_trainer_inputs

if TYPE_CHECKING:
    from grpo_launch.compose import Composed

__all__ = ["Plan", "ProcessSpec", "build_plan"]


def _gpu_map(config: Config, layout: Layout, engines: list[Engine], placement: Placement,
             unused: str) -> tuple[tuple[str, ...], ...]:
    c = config.cluster
    grid = [[unused] * c.gpus_per_node for _ in range(c.nodes)]
    for rank in range(layout.world_size):
        node, gpu = layout.rank_location(rank)
        grid[node][gpu] = f"train {rank}"
    for e in engines:
        for shard, gpu in enumerate(e.gpus):
            tag = f"{placement.engine_label} {e.index}" + (f" tp{shard}" if len(e.gpus) > 1 else "")
            grid[e.node][gpu] = f"{grid[e.node][gpu]} + {tag}" if e.ranks else tag
    return tuple(tuple(row) for row in grid)


def _idle_warning(layout: Layout, config: Config, sized_machines: bool) -> list[str]:
    idle = layout.idle(config.cluster.nodes, config.cluster.gpus_per_node)
    if not idle or config.cluster.accelerator == "cpu" or sized_machines:
        return []
    where = ", ".join(f"node {n} GPU {g}" for n, g in idle)
    return [f"{len(idle)} GPU(s) idle: {where}"]


def build_plan(composed: Composed) -> Plan:
    """The plan of a composed recipe; a `UserError` about a key says where the key's value came from."""
    try:
        return _planned(composed)
    except UserError as e:
        raise composed.origins.locate(e, composed.config) from None


def _planned(composed: Composed) -> Plan:
    config = composed.config
    check_recipe_name(composed.recipe)
    check_hosts(config)
    check_secrets(config)
    check_zero(config)
    builtin_model(config.model.name_or_path)
    check_model_shape(config)
    check_data(config)
    scheduler = scheduler_of(config)
    scheduler.check(config)
    placement = placement_of(config)
    trl_fields.check_trainer_args(config.trainer, placement.trainer_class)
    check_context(config, placement.trainer_class)
    config, engines_apart = scheduler.shape(config, lambda c: placement.plan(Context(c)).layout)

    ctx = Context(config, engines_apart=engines_apart)
    result = placement.plan(ctx)
    check_tensor_parallel(config)  # after the layout's own TP rules: a size that cannot be laid out says so first
    layout = result.layout
    world = layout.world_size

    args = build_trainer_args(config, placement, result.trainer_args,
                              ddp=world > 1 and not (config.zero.stage or result.fsdp2))
    inputs = build_trainer_inputs(config, placement, result.weight_sync, result.server_key_env)
    files: dict = {}
    if config.zero.stage:
        files[DEEPSPEED_FILE] = deepspeed_config(config)
        if config.launcher == "torchrun":
            args["deepspeed"] = DEEPSPEED_FILE  # accelerate reads it from accelerate.yaml instead
    files[ACCELERATE_FILE] = accelerate_config(config, machines=len(layout.trainer_nodes), processes=world,
                                               main_ip=ctx.host(layout.trainer_nodes[0]), fsdp2=result.fsdp2)
    batch = placement.batch(args, world, result)

    secrets = (result.server_key_env,) if result.server_key_env else ()
    trainers = trainer_processes(ctx, layout, result.trainer_depends_on, result.trainer_env, secrets)
    processes = watched(config, (*result.services, *trainers))
    prepare = prepare_steps(config)
    files[LAUNCH_FILE] = launch_script(composed.recipe, config.placement.kind, prepare, processes)
    scheduled, job_files = scheduler.job(config, composed.recipe, processes, prepare)
    files.update(job_files)
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
        vllm=placement.sized_vllm(result, batch),
        zero_stage=config.zero.stage,
        engines=tuple(result.engines),
        processes=processes,
        gpu_map=_gpu_map(config, layout, result.engines, placement, "-" if scheduler.sized_machines else "idle"),
        ports=ctx.ports.claims(),
        files=files,
        prepare=prepare,
        trainer_class=placement.trainer_class,
        trainer_args=args,
        trainer_inputs=inputs,
        batch=batch,
        scheduler=scheduled,
        warnings=tuple(ctx.warnings + _idle_warning(layout, config, scheduler.sized_machines)
                       + scheduler.warnings(config, scheduled) + exposed_dev_mode(processes)),
    )
    model = catalog.resolve(config.model)  # the one read planning may do: a local model's config.json
    plan = replace(plan, memory=estimate_memory(config, plan, placement, model))  # the CLI decides if a misfit is fatal
    return replace(plan, prediction=predict_step_time(config, plan, placement, model))
