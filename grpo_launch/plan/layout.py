"""GPU assignment: which GPU of which node holds which trainer rank and which vLLM engine.

This module is the one place GPUs are handed out. Trainer ranks fill nodes from node 0, GPU 0 upwards, the same
number of ranks on every trainer node (accelerate and torchrun start an equal count per node). Dedicated vLLM
engines (server, async-lora) fill nodes from the last node's last GPU downwards, an engine never spanning nodes,
so trainer and vLLM GPUs are disjoint by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_launch.compose.schema import Config
from grpo_launch.errors import UserError


@dataclass(frozen=True)
class Layout:
    trainer_nodes: tuple[int, ...]
    trainer_gpus: tuple[int, ...]                 # local indices, the same on every trainer node
    engine_gpus: tuple[tuple[int, tuple[int, ...]], ...]   # (node, local GPUs) per dedicated engine

    @property
    def world_size(self) -> int:
        return len(self.trainer_nodes) * len(self.trainer_gpus)

    def rank_location(self, rank: int) -> tuple[int, int]:
        per_node = len(self.trainer_gpus)
        return self.trainer_nodes[rank // per_node], self.trainer_gpus[rank % per_node]

    def ranks_on(self, node: int) -> tuple[int, ...]:
        if node not in self.trainer_nodes:
            return ()
        per_node = len(self.trainer_gpus)
        first = self.trainer_nodes.index(node) * per_node
        return tuple(range(first, first + per_node))

    def idle(self, nodes: int, gpus_per_node: int) -> list[tuple[int, int]]:
        used = {(n, g) for n in self.trainer_nodes for g in self.trainer_gpus}
        used |= {(n, g) for n, gpus in self.engine_gpus for g in gpus}
        return [(n, g) for n in range(nodes) for g in range(gpus_per_node) if (n, g) not in used]


def shared_layout(config: Config) -> Layout:
    """Every GPU trains (colocate: vLLM lives inside the trainer ranks)."""
    c = config.cluster
    nodes = config.placement.trainer_nodes or c.nodes
    if nodes > c.nodes:
        raise UserError(f"placement.trainer_nodes={nodes} but the cluster has {c.nodes} node(s)",
                        key="placement.trainer_nodes", hint=f"set it to at most cluster.nodes={c.nodes}")
    return Layout(tuple(range(nodes)), tuple(range(c.gpus_per_node)), ())


def dedicated_layout(config: Config, engines: int, gpus_per_engine: int, engines_key: str | None = None,
                     apart: int | None = None) -> Layout:
    """`engines` vLLM engines of `gpus_per_engine` GPUs each on their own GPUs; the trainer on the rest.
    `engines_key`: the recipe key that sets how many engines (None: one, always). `apart`: each engine on a machine of
    its own (GPUs from 0), the trainer nodes first with `apart` GPUs each (a scheduler whose machines are sized to
    what they run: one Hugging Face Job each)."""
    c = config.cluster
    if apart is not None:
        trainer_nodes = c.nodes - engines
        if trainer_nodes < 1 or gpus_per_engine > c.gpus_per_node or apart > c.gpus_per_node:
            raise UserError(f"{engines} vLLM engine(s), each on a machine of its own, and the trainer need more than "
                            f"the {c.nodes} node(s) x {c.gpus_per_node} GPU(s) planned", key="cluster.nodes",
                            hint="the scheduler shapes the nodes itself: leave cluster.nodes as the recipe sets it")
        engine_gpus = tuple((trainer_nodes + i, tuple(range(gpus_per_engine))) for i in range(engines))
        return Layout(tuple(range(trainer_nodes)), tuple(range(apart)), engine_gpus)
    if gpus_per_engine > c.gpus_per_node:
        raise UserError(f"a vLLM engine needs vllm.tensor_parallel_size={gpus_per_engine} GPUs but a node has "
                        f"{c.gpus_per_node}", key="vllm.tensor_parallel_size",
                        hint="tensor parallelism stays inside one node; lower vllm.tensor_parallel_size")
    free = {n: list(range(c.gpus_per_node)) for n in range(c.nodes)}
    engine_gpus: list[tuple[int, tuple[int, ...]]] = []
    for node in reversed(range(c.nodes)):
        while len(engine_gpus) < engines and len(free[node]) >= gpus_per_engine:
            taken = free[node][-gpus_per_engine:]
            del free[node][-gpus_per_engine:]
            engine_gpus.append((node, tuple(taken)))
        if len(engine_gpus) == engines:
            break
    if len(engine_gpus) < engines:
        per_node = c.gpus_per_node // gpus_per_engine
        fewer = f"lower {engines_key} or vllm.tensor_parallel_size" if engines_key else \
            "lower vllm.tensor_parallel_size"
        raise UserError(f"{engines} vLLM engine(s) of {gpus_per_engine} GPU(s) do not fit: the cluster holds "
                        f"{per_node * c.nodes} ({per_node} per node)", key=engines_key or "vllm.tensor_parallel_size",
                        hint=f"add nodes (cluster.nodes), or {fewer}")
    engine_gpus.sort()  # engine 0 on the lowest node and GPUs

    whole = [n for n in range(c.nodes) if len(free[n]) == c.gpus_per_node]
    wanted = config.placement.trainer_nodes or (len(whole) if whole else c.nodes)
    if wanted > c.nodes:
        raise UserError(f"placement.trainer_nodes={wanted} but the cluster has {c.nodes} node(s)",
                        key="placement.trainer_nodes", hint=f"set it to at most cluster.nodes={c.nodes}")
    trainer_nodes = tuple(range(wanted))
    per_node = min(len(free[n]) for n in trainer_nodes)
    if per_node == 0:
        raise UserError(f"no GPU is left for the trainer on node(s) {list(trainer_nodes)}: vLLM takes "
                        f"{engines * gpus_per_engine} of {c.nodes * c.gpus_per_node} GPUs",
                        key="placement.trainer_nodes",
                        hint="add a node (cluster.nodes) or give vLLM fewer GPUs")
    return Layout(trainer_nodes, tuple(range(per_node)), tuple(engine_gpus))
