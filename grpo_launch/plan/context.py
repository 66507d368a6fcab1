"""The state one plan is built in, and what a placement hands back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.hosts import is_loopback
from grpo_launch.contracts.plan import Engine, ProcessSpec, VllmSettings
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.ports import PortBook
from grpo_launch.plan.schedulers import Scheduler, scheduler_of


@dataclass
class Context:
    """Shared, per-plan state a placement reads and adds to."""

    config: Config
    # Each vLLM engine on a machine of its own, the trainer nodes keeping this many GPUs each (a scheduler whose
    # machines are sized to what they run); None: engines share nodes, from the last one down.
    engines_apart: int | None = None
    ports: PortBook = field(init=False)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = PortBook(self.host)  # two nodes on one machine share its ports

    @property
    def scheduler(self) -> Scheduler:
        return scheduler_of(self.config)

    def host(self, node: int) -> str:
        """Node `node`'s address: from cluster.hosts, else as the scheduler gives it (loopback, or GRPO_HOST_K)."""
        hosts = self.config.cluster.hosts
        return hosts[node] if hosts else self.scheduler.host(self.config, node)

    def bind_address(self) -> str:
        """Servers listen on loopback when every node is this machine, on every interface otherwise."""
        every = [self.host(n) for n in range(self.config.cluster.nodes)]
        return "127.0.0.1" if all(is_loopback(h) for h in every) else "0.0.0.0"


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
    server_key_env: str | None = None    # the variable holding the key the trainer's server requires
