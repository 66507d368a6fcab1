"""server: one `vllm serve` on GPUs of its own, the trainer on the rest (TRL's vllm_mode="server").

TRL 1.16's server mode talks to exactly one server (one base URL; weight sync over NCCL), so the server is one
process with tensor parallelism, never several replicas. It goes on the last GPUs of the last node; trainer
rank 0 hosts the NCCL rendezvous on `vllm.group_port`, which must be free on its host. On a CPU there is no NCCL:
the trainer writes its weights into the run directory and the server reloads them (weight_sync "reload").
"""

from __future__ import annotations

from grpo_launch.contracts.plan import Engine, Plan, ProcessSpec, VllmSettings
from grpo_launch.errors import UserError
from grpo_launch.plan.context import Context, PlacementResult
from grpo_launch.plan.layout import dedicated_layout
from grpo_launch.plan.placements.base import Placement, trl_weight_sync
from grpo_launch.plan.processes import base_env, require_servers, serve_batch_limits, vllm_env, vllm_serve_argv
from grpo_launch.plan.step_time import StepModel, StepSplit, one_after_another


class Server(Placement):
    name = "server"
    trainer_class = "GRPOConfig"
    trainer = "grpo"
    engine_label = "vllm"
    utilization_choices = (0.8, 0.9)  # the GPUs are vLLM's alone

    def plan(self, ctx: Context) -> PlacementResult:
        config = ctx.config
        v = config.vllm
        require_servers(config, self.name)
        if v.data_parallel_size not in (None, 1):
            raise UserError(f"vllm.data_parallel_size={v.data_parallel_size}: TRL 1.16's server mode talks to one "
                            f"server, and vLLM's --data-parallel-size does not take NCCL weight updates for dense "
                            f"models", key="vllm.data_parallel_size",
                            hint="use vllm.tensor_parallel_size for a bigger server, or placement=async-lora for "
                                 "several replicas")
        layout = dedicated_layout(config, engines=1, gpus_per_engine=v.tensor_parallel_size, apart=ctx.engines_apart)
        node, gpus = layout.engine_gpus[0]
        port = ctx.ports.next_free(node, v.port, "the vLLM server", "vllm.port")
        url = f"http://{ctx.host(node)}:{port}"
        # Weight transfer (NCCL) and weight reload (/collective_rpc) endpoints are dev-mode only.
        env = base_env(config, gpus) | vllm_env(config) | {"VLLM_SERVER_DEV_MODE": "1"}
        server = ProcessSpec(name="vllm", role="vllm", node=node, gpus=gpus,
                             argv=vllm_serve_argv(config, bind=ctx.bind_address(), port=port),
                             env=env, pass_env=tuple(config.env.passthrough), port=port, ready_url=f"{url}/health",
                             ready_timeout_s=v.health_timeout_s, metrics_url=f"{url}/metrics")
        args = {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": url}
        cuda = config.cluster.accelerator == "cuda"
        group_port = ctx.ports.claim(layout.trainer_nodes[0], v.group_port, "the NCCL weight-sync rendezvous",
                                     "vllm.group_port") if cuda else None
        if cuda:
            args["vllm_group_port"] = group_port
        batched, seqs = serve_batch_limits(config)
        settings = VllmSettings(enabled=True, engine="vllm serve", tensor_parallel_size=v.tensor_parallel_size,
                                data_parallel_size=1, gpu_memory_utilization=v.gpu_memory_utilization,
                                max_model_len=v.max_model_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
                                url=url, group_port=group_port)
        return PlacementResult(layout=layout, engines=[Engine(0, node, gpus, process="vllm", url=url)],
                               services=[server], trainer_args=args, trainer_depends_on=("vllm",), vllm=settings,
                               weight_sync="trl" if cuda else "reload")

    def step_time(self, model: StepModel) -> StepSplit:
        """The trainer's ranks wait while the server generates, then the server waits while they train; the new
        weights go from trainer rank 0 to the server over NCCL in between."""
        plan = model.plan
        server = plan.engines[0]
        across = server.node not in {p.node for p in plan.processes if p.role == "trainer"}
        gather = model.gather_s()
        sync = (gather + model.broadcast_s(across), ("weights gathered from their shards, " if gather else "")
                + f"broadcast to the server {'across nodes' if across else 'inside the node'}")
        training = model.training
        return one_after_another(model.batch_generation(), sync, (training.seconds, training.detail),
                                 why=f"the {plan.world_size} trainer GPUs wait while the server's {len(server.gpus)} "
                                     f"generate, and the server waits while they train")
    def needs_cuda(self, plan: Plan) -> list[tuple[str, str, str, str]]:
        return trl_weight_sync(plan, "NCCL to the server")
