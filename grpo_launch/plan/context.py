"""The state one plan is built in, and what a placement hands back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.plan import Engine, ProcessSpec, VllmSettings
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.ports import PortBook


@dataclass
class Context:
    """Shared, per-plan state a placement reads and adds to."""

    config: Config
    ports: PortBook = field(default_factory=PortBook)
    warnings: list[str] = field(default_factory=list)

    @property
    def single_node(self) -> bool:
        return self.config.cluster.nodes == 1

    def host(self, node: int) -> str:
        hosts = self.config.cluster.hosts
        if hosts:
            return hosts[node]
        return "127.0.0.1" if self.single_node else f"node{node}"

    def bind_address(self) -> str:
        """Servers listen on loopback when everything runs on one machine, on every interface otherwise."""
        return "127.0.0.1" if self.single_node else "0.0.0.0"


@dataclass
class PlacementResult:
    layout: Layout
    engines: list[Engine]
    services: list[ProcessSpec]          # vLLM servers and the proxy, in start order
    trainer_args: dict[str, Any]         # the TRL arguments this placement decides
    trainer_depends_on: tuple[str, ...]  # services the trainer waits for
    vllm: VllmSettings                   # resolved vLLM settings for the plan view, JSON and memory estimate
    fsdp2: bool = False                  # the trainer shards with FSDP2 (the accelerate config says so)
    trainer_env: dict[str, str] = field(default_factory=dict)  # what the trainer ranks need besides the base env
    weight_sync: str = "trl"             # how trained weights reach vLLM (contracts.plan.WEIGHT_SYNCS)
