"""Runtime LoRA adapters, kept the way vLLM keeps them.

A name, once registered by /v1/load_lora_adapter, stays servable until /v1/unload_lora_adapter. The weights of at most
`capacity` adapters (vLLM's --max-cpu-loras, default --max-loras) stay loaded in the peft model; loading one more evicts
the least recently used, and a request naming an evicted adapter reloads it from its path. Every adapter is loaded
under a fresh peft slot name, so an in-place reload never serves a half-replaced adapter and names with dots work.
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# peft's name for "no adapter" in a mixed-adapter forward.
BASE_SLOT = "__base__"


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    slot: str  # the peft adapter name holding its weights


class AdapterNotFound(Exception):
    """No adapter at the path (vLLM: LoRAAdapterNotFoundError, HTTP 404)."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(f"Loading lora {name} failed: No adapter found for {path}")


class AdapterRejected(Exception):
    """An adapter peft can read but this server was not started to serve (rank above --max-lora-rank, not LoRA)."""


class LoraAdapters:
    """Registered adapter names and the adapters resident in the model.

    `model` is a peft model while an adapter is resident and the plain transformers model otherwise; `lock` is the model
    lock the decode loop holds around each forward, so weights never change under a running step.
    """

    def __init__(self, model: torch.nn.Module, lock: threading.Lock, *, capacity: int, max_rank: int) -> None:
        self.model = model
        self._lock = lock
        self._capacity = capacity
        self._max_rank = max_rank
        self._registered: dict[str, Adapter] = {}
        self._resident: OrderedDict[str, None] = OrderedDict()  # slots, least recently used first
        self._slot_ids = itertools.count(1)

    def get(self, name: str) -> Adapter | None:
        return self._registered.get(name)

    def registered(self) -> list[Adapter]:
        return list(self._registered.values())

    def load(self, name: str, path: str) -> Adapter:
        """Read the adapter from disk now (as vLLM does, so a bad path fails the load, not a later request) and
        register it under `name`, replacing an adapter of that name. Blocking: call it from a worker thread."""
        adapter = Adapter(name=name, path=path, slot=f"slot{next(self._slot_ids)}")
        with self._lock:
            self._make_resident(adapter)
            previous = self._registered.get(name)
            if previous is not None:
                self._evict(previous.slot)
        self._registered[name] = adapter
        return adapter

    def unload(self, name: str) -> None:
        adapter = self._registered.pop(name)
        with self._lock:
            self._evict(adapter.slot)

    def forward_slots(self, adapter: Adapter | None, rows: int) -> dict[str, list[str]]:
        """Keyword arguments selecting the adapter for a forward; call with the model lock held.

        An adapter evicted since its request was queued (or unloaded while the request ran) is reloaded from its path;
        an unloaded one then stays resident, unnamed, until it is the least recently used.
        """
        if adapter is None:
            return {"adapter_names": [BASE_SLOT] * rows} if self._resident else {}
        self._make_resident(adapter)
        return {"adapter_names": [adapter.slot] * rows}

    def _make_resident(self, adapter: Adapter) -> None:
        if adapter.slot in self._resident:
            self._resident.move_to_end(adapter.slot)
            return
        self._read(adapter)
        self._resident[adapter.slot] = None
        while len(self._resident) > self._capacity:
            oldest = next(iter(self._resident))
            logger.info("evicting LoRA slot %s (least recently used; capacity %d)", oldest, self._capacity)
            self._evict(oldest)

    def _read(self, adapter: Adapter) -> None:
        from peft import LoraConfig, PeftConfig, PeftModel

        if not (Path(adapter.path) / "adapter_config.json").is_file():
            raise AdapterNotFound(adapter.name, adapter.path)
        config = PeftConfig.from_pretrained(adapter.path)
        if not isinstance(config, LoraConfig):
            raise AdapterRejected(f"{adapter.name} is a {type(config).__name__} adapter; only LoRA is served")
        rank = max([config.r, *config.rank_pattern.values()])
        if rank > self._max_rank:
            raise AdapterRejected(f"LoRA rank {rank} is greater than max_lora_rank {self._max_rank}.")
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(adapter.path, adapter_name=adapter.slot, is_trainable=False)
        else:
            self.model = PeftModel.from_pretrained(self.model, adapter.path, adapter_name=adapter.slot,
                                                   is_trainable=False)
        self.model.eval()  # adapters saved mid-training carry lora_dropout; serving must not apply it
        logger.info("loaded LoRA adapter %s from %s into slot %s", adapter.name, adapter.path, adapter.slot)

    def _evict(self, slot: str) -> None:
        if slot not in self._resident:
            return
        del self._resident[slot]
        with warnings.catch_warnings():
            # peft warns when the adapter it last activated goes; requests here name theirs on every forward.
            warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted")
            self.model.delete_adapter(slot)
        if not self._resident:
            # A peft model without adapters cannot even run a base forward (it looks up its deleted active adapter):
            # back to the plain model until the next load.
            self.model = self.model.unload()
