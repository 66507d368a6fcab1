"""The memory estimate's data: plain, frozen, JSON-renderable; built by `estimate.memory`, carried in the `Plan`
(and so in plan.json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024 ** 3


def parameter_count(n: float) -> str:
    """A parameter count in the unit that fits: '72.7B', '1.54B', '494M', '0.13M' (the tiny model)."""
    value, unit = (n / 1e9, "B") if n >= 1e9 else (n / 1e6, "M")
    return f"{value:.3g}{unit}" if value >= 1 else f"{value:.2f}{unit}"


@dataclass(frozen=True)
class Component:
    name: str
    gib: float
    detail: str = ""                          # how it was computed, e.g. "2 B x 72.7B params / 32 ranks"


@dataclass(frozen=True)
class MemoryPhase:
    """What a GPU or a node holds at once during one part of the run (not a step's phase: `contracts.phases`)."""

    name: str                                 # GPU: training | generation; host: load | training
    components: tuple[Component, ...]

    @property
    def total_gib(self) -> float:
        return sum(c.gib for c in self.components)


@dataclass(frozen=True)
class KvCache:
    """What vLLM's KV cache holds on each of its GPUs."""

    tokens: int
    bytes_per_token: int                      # per GPU: this TP rank's share of K and V of every layer
    max_model_len: int
    max_num_seqs: int                         # sequences vLLM schedules at once

    @property
    def sequences(self) -> int:
        return self.tokens // self.max_model_len

    @property
    def holds_batch(self) -> bool:
        """Every sequence vLLM may run at once fits at full length: no preemption."""
        return self.sequences >= self.max_num_seqs

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "bytes_per_token": self.bytes_per_token, "max_model_len": self.max_model_len,
                "sequences": self.sequences, "max_num_seqs": self.max_num_seqs, "holds_batch": self.holds_batch}


@dataclass(frozen=True)
class Budget:
    """The memory of a group of identical devices: GPUs (members are (node, gpu)) or hosts (members are (node,))."""

    role: str                                 # what runs there: "trainer + vLLM", "trainer", "vLLM", "node"
    members: tuple[tuple[int, ...], ...]
    capacity_gib: float
    phases: tuple[MemoryPhase, ...]
    kv_cache: KvCache | None = None           # GPUs that host vLLM
    problems: tuple[str, ...] = ()            # why it cannot run whatever the total (vLLM cannot hold a sequence)

    @property
    def binding(self) -> MemoryPhase:
        """The phase with the highest total, the later one on a tie: it decides whether the device fits."""
        return max(reversed(self.phases), key=lambda p: p.total_gib)

    @property
    def peak_gib(self) -> float:
        return self.binding.total_gib

    @property
    def headroom_gib(self) -> float:
        return self.capacity_gib - self.peak_gib

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= 0 and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "members": [list(m) for m in self.members], "capacity_gib": self.capacity_gib,
                "phases": [{"name": p.name, "total_gib": round(p.total_gib, 3),
                            "components": [{"name": c.name, "gib": round(c.gib, 3), "detail": c.detail}
                                           for c in p.components]} for p in self.phases],
                "binding_phase": self.binding.name, "peak_gib": round(self.peak_gib, 3),
                "headroom_gib": round(self.headroom_gib, 3), "fits": self.fits,
                "kv_cache": self.kv_cache.to_json() if self.kv_cache else None, "problems": list(self.problems)}


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    source: str                               # catalog, built-in, the config.json read; "" when unknown
    parameters: int
    trainable_parameters: int
    gpus: tuple[Budget, ...]
    hosts: tuple[Budget, ...]
    notes: tuple[str, ...] = ()

    @property
    def estimated(self) -> bool:
        return bool(self.gpus or self.hosts)

    @property
    def misfits(self) -> tuple[Budget, ...]:
        return tuple(b for b in self.gpus + self.hosts if not b.fits)

    @property
    def fits(self) -> bool:
        return not self.misfits

    def to_json(self) -> dict[str, Any]:
        return {"estimated": self.estimated, "fits": self.fits, "model": self.model, "source": self.source,
                "parameters": self.parameters, "trainable_parameters": self.trainable_parameters,
                "gpus": [b.to_json() for b in self.gpus], "hosts": [b.to_json() for b in self.hosts],
                "notes": list(self.notes)}
