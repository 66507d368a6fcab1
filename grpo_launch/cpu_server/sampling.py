"""Sampling parameters and the logits processing that turns model output into the distribution sampled from.

The order follows vLLM's V1 sampler: repetition penalty, temperature, min-p, then top-k and top-p. vLLM's
`processed_logprobs` mode reports logprobs of that final distribution (masked tokens at -inf), which is what TRL's
async GRPO trains against as the old policy; `raw_logprobs` reports the model's own distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Below this temperature a request is greedy (vLLM's _SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: every token
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token and the k likeliest; -1: every token

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make tokens already in the prompt or output less likely (CTRL-style, as vLLM and transformers do)."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def _mask_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def _mask_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches p: a token goes once the mass before it already does.
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _mask_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p <= 0.0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def process_logits(logits: torch.Tensor, seen: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Float logits (batch, vocab) -> the logits of the distribution this request samples from.

    Greedy requests only get the repetition penalty: temperature, top-k, top-p and min-p cannot change an argmax.
    """
    logits = penalize_repetition(logits.float(), seen, params.repetition_penalty)
    if params.greedy:
        return logits
    logits = logits / params.temperature
    logits = _mask_min_p(logits, params.min_p)
    logits = _mask_top_k(logits, params.top_k)
    return _mask_top_p(logits, params.top_p)


def sample(processed: torch.Tensor, params: SamplingParams, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row: argmax when greedy, else a draw from each row's own seeded generator."""
    if params.greedy:
        return processed.argmax(dim=-1)
    probs = processed.softmax(dim=-1)
    return torch.cat([torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)])
