"""The state one plan is built in, and what a placement hands back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_launch.compose.schema import Config
from grpo_launch.contracts.devices import Device, WeightSync, device_of
from grpo_launch.contracts.hosts import EVERY_INTERFACE, LOOPBACK, is_loopback
from grpo_launch.contracts.plan import Engine, ProcessSpec, VllmSettings
from grpo_launch.plan.layout import Layout
from grpo_launch.plan.model import ModelSource
from grpo_launch.plan.ports import PortBook
from grpo_launch.plan.schedulers import Scheduler, scheduler_of


@dataclass
class Context:
    """Shared, per-plan state a placement reads and adds to: the config, and what is resolved from it once (the
    device, the model, the scheduler)."""

    config: Config
    model: ModelSource
    # Each vLLM engine on a machine of its own, the trainer nodes keeping this many GPUs each (a scheduler whose
    # machines are sized to what they run); None: engines share nodes, from the last one down.
    engines_apart: int | None = None
    warnings: list[str] = field(default_factory=list)
    device: Device = field(init=False)
    scheduler: Scheduler = field(init=False)
    hosts: tuple[str, ...] = field(init=False)  # node K's address: cluster.hosts, else the scheduler's (loopback,
                                                # or GRPO_HOST_K)
    bind: str = field(init=False)               # what servers listen on: loopback when every node is this machine
    ports: PortBook = field(init=False)

    def __post_init__(self) -> None:
        c = self.config.cluster
        self.device = device_of(c.accelerator)
        self.scheduler = scheduler_of(self.config)
        self.hosts = tuple(c.hosts) or tuple(self.scheduler.host(self.config, n) for n in range(c.nodes))
        self.bind = LOOPBACK if all(is_loopback(h) for h in self.hosts) else EVERY_INTERFACE
        self.ports = PortBook(self.hosts)  # two nodes on one machine share its ports

    def env(self, gpus: tuple[int, ...]) -> dict[str, str]:
        """The literal environment of a process holding `gpus`: env.set, the device's visible GPUs, and offline
        switches when everything is local."""
        env = dict(self.config.env.set)
        env["CUDA_VISIBLE_DEVICES"] = self.device.visible_devices(gpus)
        if self.model.offline:
            env |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        return env


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
    weight_sync: WeightSync = WeightSync.TRL  # how trained weights reach vLLM
    server_key_env: str | None = None    # the variable holding the key the trainer's server requires
