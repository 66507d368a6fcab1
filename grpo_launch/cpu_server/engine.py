"""The model behind the server: a transformers causal LM on CPU, its tokenizer, and its runtime LoRA adapters."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

import torch

from grpo_launch.cpu_server.generation import Checkpoint, Forward, SequenceOutput, generate
from grpo_launch.cpu_server.lora import Adapter, LoraAdapters
from grpo_launch.cpu_server.sampling import SamplingParams
from grpo_launch.cpu_server.settings import ServerSettings


@dataclass(frozen=True)
class GenerationJob:
    """One completion request, validated: `n` samples of each prompt."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    seed: int | None
    adapter: Adapter | None


class Engine:
    def __init__(self, settings: ServerSettings) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(settings.model, trust_remote_code=settings.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(settings.model, dtype=getattr(torch, settings.dtype),
                                                     trust_remote_code=settings.trust_remote_code).eval()
        self.vocab_size: int = model.config.vocab_size
        configured_eos = model.generation_config.eos_token_id
        eos = configured_eos if isinstance(configured_eos, list) else [configured_eos]
        self.eos_ids = frozenset(i for i in [*eos, self.tokenizer.eos_token_id] if i is not None)
        self.pad_id: int = next(i for i in (self.tokenizer.pad_token_id, *sorted(self.eos_ids), 0) if i is not None)
        # Held around every forward and every adapter load or eviction; released between decode steps, so an adapter
        # can load while a request is frozen by pause(mode=keep).
        self._lock = threading.Lock()
        self._model = model
        self.lora = (LoraAdapters(model, self._lock, capacity=settings.max_cpu_loras, max_rank=settings.max_lora_rank)
                     if settings.enable_lora else None)
        # Unseeded requests draw their seeds here, so a restarted server with the same --seed repeats itself (vLLM).
        self._seeds = random.Random(settings.seed)
        self._processed_logprobs = settings.logprobs_mode == "processed_logprobs"

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token as the logprobs block names it (special tokens included, as vLLM does)."""
        return self.tokenizer.decode([token_id])

    def generate(self, job: GenerationJob, checkpoint: Checkpoint) -> list[list[SequenceOutput]]:
        """`n` outputs per prompt. Sample j of a seeded request uses seed + j, so the n samples differ and the same
        request with the same seed gives the same outputs. Blocking: runs in the generation thread."""
        rows = [prompt for prompt in job.prompts for _ in range(job.n)]
        if job.seed is None:
            seeds = [self._seeds.getrandbits(63) for _ in rows]
        else:
            seeds = [job.seed + j for _ in job.prompts for j in range(job.n)]
        outputs = generate(self._forward(job.adapter), rows, seeds, job.params,
                           eos_ids=self.eos_ids, pad_id=self.pad_id, processed_logprobs=self._processed_logprobs,
                           checkpoint=checkpoint)
        return [outputs[i * job.n:(i + 1) * job.n] for i in range(len(job.prompts))]

    def _forward(self, adapter: Adapter | None) -> Forward:
        def forward(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                    cache: Any) -> tuple[torch.Tensor, Any]:
            with self._lock:
                slots = self.lora.forward_slots(adapter, ids.shape[0]) if self.lora else {}
                model = self.lora.model if self.lora else self._model  # after the slots: a load may wrap it in peft
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True, **slots)
            return out.logits[:, -1, :], out.past_key_values

        return forward
