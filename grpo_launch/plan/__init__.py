"""Plan: a composed config -> a `Plan`. Pure but for one read: no clock, no environment, no torch, and no file
but a local model's config.json, read once (`plan.model.resolve_model`).

Every rule that makes a layout valid lives here: the checks no placement owns (`checks`), the placement's own
(`placements/`), TRL's rules at the plan's world size (`trl_rules`), GPU and port assignment (`layout`, `ports`),
the processes (`serving`, `trainer_launch`), the generated files (`documents`, `launch_script`). Independent rules
are checked together and their mistakes reported at once. The memory estimate sizes the plan and `step_time`
predicts its optimizer step, each placement combining the phases its own way. `build_plan` twice on the same
config gives equal plans.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from grpo_launch.compose import trl_checks
from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Engine, Plan, ProcessSpec, Reward
from grpo_launch.contracts.rundir import ACCELERATE_FILE, DEEPSPEED_FILE, LAUNCH_FILE
from grpo_launch.contracts.schedulers import settings_in
from grpo_launch.contracts.trl_fields import trainer_facts
from grpo_launch.errors import UserError, collect
from grpo_launch.estimate.memory import estimate as estimate_memory
from grpo_launch.estimate.step_time import predict as predict_step_time
from grpo_launch.plan.checks import (
    check_context,
    check_data,
    check_hosts,
    check_model_shape,
    check_recipe_name,
    check_tensor_parallel,
)
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.documents import accelerate_config, check_zero, deepspeed_config, sharding
from grpo_launch.plan.launch_script import launch_script
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.model import ModelSource, resolve_model
from grpo_launch.plan.placements import placement_of
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.schedulers import scheduler_of
from grpo_launch.plan.secrets import check_secrets
from grpo_launch.plan.serving import watched
from grpo_launch.plan.trainer_args import (
    build_trainer_args,
    build_trainer_inputs,
    check_checkpoint_storage,
    check_evaluation,
    check_rewards,
    check_unmanaged,
)
from grpo_launch.plan.trainer_launch import trainer_processes

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


def _idle_warning(ctx: Context, layout: Layout) -> list[str]:
    """GPUs held and left idle are paid for; an idle CPU process slot costs nothing, and a scheduler whose machines
    are sized to what they run holds no GPU that none uses."""
    c = ctx.config.cluster
    idle = layout.idle(c.nodes, c.gpus_per_node)
    if not idle or not ctx.device.gpus or ctx.scheduler.sized_machines:
        return []
    where = ", ".join(f"node {n} GPU {g}" for n, g in idle)
    return [f"{len(idle)} GPU(s) idle: {where}"]


def build_plan(composed: Composed) -> Plan:
    """The plan of a composed recipe; a `UserError` about a key says where the key's value came from."""
    try:
        return _planned(composed)
    except UserError as e:
        raise composed.origins.locate(e, composed.config) from None


def _checked(composed: Composed, ctx: Context, placement: Placement) -> tuple[PlacementResult, tuple[Reward, ...]]:
    """Every rule of the recipe, the independent ones together: the placement's result and the rewards."""
    config = ctx.config
    found: dict = {}
    collect(lambda: check_recipe_name(composed.recipe), lambda: check_hosts(config),
            lambda: check_secrets(config), lambda: check_zero(config),
            lambda: check_model_shape(config, ctx.model, ctx.device), lambda: check_data(config),
            lambda: check_context(config, placement.trainer_class, ctx.model), lambda: ctx.scheduler.check(config),
            lambda: trl_checks.check_trainer_args(config.trainer, placement.trainer_class),
            lambda: check_unmanaged(config.trainer), lambda: check_evaluation(config, placement),
            lambda: found.update(rewards=check_rewards(config)),
            lambda: found.update(result=placement.plan(ctx)))
    check_tensor_parallel(config, ctx.model)  # after the layout's own TP rules: a size that cannot be laid out first
    return found["result"], found["rewards"]


def _shaped(config: Config, placement: Placement, model: ModelSource) -> tuple[Config, int | None]:
    """The cluster as the scheduler gets its machines (`Scheduler.shape`), and the trainer nodes' GPUs when each vLLM
    engine gets a machine of its own. A recipe the scheduler or the placement refuses keeps its cluster: its mistakes
    are reported with every other (`_checked`)."""
    scheduler = scheduler_of(config)
    try:
        scheduler.check(config)
        return scheduler.shape(config, lambda c: placement.plan(Context(c, model=model)).layout)
    except UserError:
        return config, None


def _planned(composed: Composed) -> Plan:
    config = composed.config
    placement = placement_of(config)
    model = resolve_model(config)
    config, engines_apart = _shaped(config, placement, model)
    ctx = Context(config, model=model, engines_apart=engines_apart)
    result, rewards = _checked(composed, ctx, placement)
    layout = result.layout
    world = layout.world_size

    shared = sharding(config, fsdp2=result.fsdp2, processes=world)
    files: dict = {DEEPSPEED_FILE: deepspeed_config(config, ctx.device)} if config.zero.stage else {}
    files[ACCELERATE_FILE] = accelerate_config(config, ctx.device, machines=len(layout.trainer_nodes),
                                               processes=world, main_ip=ctx.hosts[layout.trainer_nodes[0]],
                                               shared=shared)
    args = build_trainer_args(ctx, placement, result.trainer_args, shared)
    check_checkpoint_storage(ctx, layout.trainer_nodes, args, placement.trainer_class)
    inputs = build_trainer_inputs(ctx, placement, result, args, rewards)
    batch = placement.batch(args, world, result)

    secrets = (result.server_key_env,) if result.server_key_env else ()
    trainers = trainer_processes(ctx, layout, result.trainer_depends_on, result.trainer_env, secrets)
    processes = watched(config, (*result.services, *trainers))
    plan = Plan(
        recipe=composed.recipe,
        placement=config.placement.kind,
        accelerator=config.cluster.accelerator,
        nodes=config.cluster.nodes,
        gpus_per_node=config.cluster.gpus_per_node,
        gpu_type=config.cluster.gpu_type,
        gpu_memory_gib=config.cluster.gpu_memory_gib,
        hosts=ctx.hosts,
        launcher=config.launcher,
        world_size=world,
        vllm=placement.sized_vllm(result, batch),
        zero_stage=config.zero.stage,
        engines=tuple(result.engines),
        processes=processes,
        gpu_map=_gpu_map(config, layout, result.engines, placement,
                         "-" if ctx.scheduler.sized_machines else "idle"),
        ports=ctx.ports.claims(),
        files=files,
        prepare=ctx.model.prepare,
        trainer_class=placement.trainer_class,
        trainer_args=args,
        trainer_inputs=inputs,
        trainer_facts=trainer_facts(args, placement.trainer_class),
        batch=batch,
        sharding=shared,
        trainer_nodes=layout.trainer_nodes,
    )
    scheduled, job_files = ctx.scheduler.job(config, plan)
    plan = replace(plan, files={**files, LAUNCH_FILE: launch_script(plan), **job_files},
                   scheduler=replace(scheduled, settings=settings_in(config.scheduler, scheduled.kind),
                                     control_plane_timeout_s=config.scheduler.control_plane_timeout_s),
                   warnings=tuple(ctx.warnings + _idle_warning(ctx, layout)
                                  + ctx.scheduler.warnings(config, scheduled)))
    plan = replace(plan, memory=estimate_memory(config, plan, placement, ctx.model.resolved))  # the CLI decides
    return replace(plan, prediction=predict_step_time(config, plan, placement, ctx.model.resolved))
