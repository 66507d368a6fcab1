"""server: one `vllm serve` on GPUs of its own, the trainer on the rest (TRL's vllm_mode="server").

TRL's server mode talks to exactly one server (one base URL; weight sync over NCCL), so the server is one process
with tensor parallelism, never several replicas. It goes on the last GPUs of the last node; trainer rank 0 hosts
the NCCL rendezvous on `placement.server.group_port`, which must be free on its host. On a CPU there is no NCCL:
the trainer writes its weights into the run directory and the server reloads them (weight_sync "reload").
"""

from __future__ import annotations

from grpo_launch.contracts.devices import WeightSync
from grpo_launch.contracts.plan import Plan, ServerEndpoint, Trainer, VllmSettings
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV
from grpo_launch.estimate.step_time import StepModel, StepSplit, one_after_another
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import dedicated_layout
from grpo_launch.plan.placements.base import Placement, trl_weight_sync
from grpo_launch.plan.serving import check_servers_enabled, serve_batch_limits, served_engine


class Server(Placement):
    name = "server"
    trainer = Trainer.GRPO
    engine_label = "vllm"
    utilization_choices = (0.8, 0.9)  # the GPUs are vLLM's alone

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v = config.vllm
        check_servers_enabled(config, self.name)
        layout = dedicated_layout(config, engines=1, gpus_per_engine=v.tensor_parallel_size, apart=ctx.engines_apart)
        node, gpus = layout.engine_gpus[0]
        server, engine = served_engine(ctx, 0, "vllm", "the vLLM server", node, gpus)
        args = {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": engine.url}
        weight_sync = ctx.device.dense_weight_sync
        group_port = None
        if weight_sync == WeightSync.TRL:  # TRL's NCCL weight sync: trainer rank 0 hosts its rendezvous
            group_port = ctx.ports.claim(layout.trainer_nodes[0], config.placement.server.group_port,
                                         "the NCCL weight-sync rendezvous", "placement.server.group_port")
            args["vllm_group_port"] = group_port
        batched, seqs = serve_batch_limits(config)
        settings = VllmSettings(enabled=True, engine="vllm serve", tensor_parallel_size=v.tensor_parallel_size,
                                data_parallel_size=1, gpu_memory_utilization=v.gpu_memory_utilization,
                                max_model_len=v.max_model_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
                                server=ServerEndpoint(url=engine.url, group_port=group_port))
        return PlacementResult(layout=layout, engines=[engine], services=[server], trainer_args=args,
                               trainer_depends_on=("vllm",), vllm=settings, weight_sync=weight_sync,
                               server_key_env=REPLICA_KEY_ENV)

    def step_time(self, model: StepModel) -> StepSplit:
        """The trainer's ranks wait while the server generates, then the server waits while they train; the new
        weights go from trainer rank 0 to the server over NCCL in between."""
        plan = model.plan
        server = plan.engines[0]
        across = server.node not in plan.trainer_nodes
        gather = model.gather_s()
        sync = (gather + model.broadcast_s(across), ("weights gathered from their shards, " if gather else "")
                + f"broadcast to the server {'across nodes' if across else 'inside the node'}")
        training = model.training
        return one_after_another(model.batch_generation(), sync, (training.seconds, training.detail),
                                 why=f"the {plan.world_size} trainer GPUs wait while the server's {len(server.gpus)} "
                                     f"generate, and the server waits while they train")

    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        return trl_weight_sync(plan, "NCCL to the server")
