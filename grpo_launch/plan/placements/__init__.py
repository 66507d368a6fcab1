"""Placements: where generation runs. Each is one module declaring one `Placement`; `PLACEMENTS` lists them.

A placement decides the GPU layout, its services (vLLM servers, the proxy), the TRL arguments only it sets, TRL's
batch rules for its trainer and what its trainer computes per micro-batch (for the memory estimate). Everything
placement-specific lives in its module; the rest of grpo-launch asks the placement, never compares its name.
Defaults a user may override (vLLM's memory share, ...) live in its recipe group file, recipes/placement/NAME.yaml.

Adding a placement: a module here with a `Placement` subclass, an entry in `PLACEMENTS`, and its group file.
"""

from __future__ import annotations

from grpo_launch.compose.schema import Config
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.plan.placements.async_lora import AsyncLora
from grpo_launch.plan.placements.base import Placement
from grpo_launch.plan.placements.colocate import Colocate
from grpo_launch.plan.placements.server import Server

PLACEMENTS: dict[str, Placement] = {p.name: p for p in (Colocate(), Server(), AsyncLora())}


def placement_of(config: Config) -> Placement:
    kind = config.placement.kind
    if kind not in PLACEMENTS:
        raise UserError(f"'placement.kind' must be one of {', '.join(PLACEMENTS)}; got {kind!r}"
                        f"{did_you_mean(kind, PLACEMENTS)}", key="placement.kind",
                        hint="choose a placement with placement=NAME")
    return PLACEMENTS[kind]
