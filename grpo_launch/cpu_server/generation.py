"""The decode loop: one batch of rows (prompt copies) decoded together with a KV cache, each row sampled from its own
seeded generator so a request with a seed is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_launch.cpu_server.sampling import SamplingParams, process_logits, sample

# (input_ids, attention_mask, position_ids, past key values or None) -> (logits at the last position, new cache)
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any]]
# Called before every decode step, outside the model lock; may block (pause with mode=keep); True means abort.
Checkpoint = Callable[[], bool]


@dataclass
class SequenceOutput:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # one per token when logprobs were asked for
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # sampled token first, then the likeliest
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | None = None  # the stop_token_ids entry that ended it; None for EOS

    @classmethod
    def aborted(cls) -> SequenceOutput:
        return cls(finish_reason="abort")


def _left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def _top_logprobs(row_logprobs: torch.Tensor, token: int, k: int) -> dict[int, float]:
    top = {token: float(row_logprobs[token])}
    count = row_logprobs.shape[-1] if k < 0 else min(k, row_logprobs.shape[-1])
    if count:
        values, ids = torch.topk(row_logprobs, count)
        top.update({int(i): float(v) for i, v in zip(ids, values, strict=True) if int(i) != token})
    return top


def generate(forward: Forward, prompts: list[list[int]], seeds: list[int], params: SamplingParams, *,
             eos_ids: frozenset[int], pad_id: int, processed_logprobs: bool,
             checkpoint: Checkpoint) -> list[SequenceOutput]:
    """Decode every row of `prompts` up to `params.max_tokens` tokens; EOS and stop tokens end a row (and are kept in
    its token ids, as vLLM returns them)."""
    ids, mask = _left_padded(prompts, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    outputs = [SequenceOutput() for _ in prompts]
    stop_ids = frozenset(params.stop_token_ids)
    end_ids = stop_ids if params.ignore_eos else stop_ids | eos_ids
    # no_grad, not inference_mode: an adapter (re)loaded inside a forward must not become an inference tensor, which
    # peft could no longer touch when it loads or deletes another adapter.
    with torch.no_grad():
        logits, cache = forward(ids, mask, positions, None)
        seen = torch.zeros(logits.shape, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            seen[row, prompt] = True
        for _ in range(params.max_tokens):
            if checkpoint():
                for out in outputs:
                    out.finish_reason = out.finish_reason or "abort"
                break
            processed = process_logits(logits, seen, params)
            tokens = sample(processed, params, generators).tolist()
            logprobs = (processed if processed_logprobs else logits.float()).log_softmax(dim=-1)
            for row, (out, token) in enumerate(zip(outputs, tokens, strict=True)):
                if out.finish_reason:
                    continue
                out.token_ids.append(token)
                seen[row, token] = True
                if params.logprobs is not None:
                    out.logprobs.append(float(logprobs[row, token]))
                    out.top_logprobs.append(_top_logprobs(logprobs[row], token, params.logprobs))
                if token in end_ids:
                    out.finish_reason, out.stop_reason = "stop", token if token in stop_ids else None
                elif len(out.token_ids) == params.max_tokens:
                    out.finish_reason = "length"
            if all(out.finish_reason for out in outputs):
                break
            # Finished rows keep decoding padding: the batch stays rectangular and their outputs no longer change.
            step = torch.tensor([[pad_id if out.finish_reason else t] for out, t in zip(outputs, tokens, strict=True)])
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=torch.long)], dim=-1)
            positions = positions[:, -1:] + 1
            logits, cache = forward(step, mask, positions, cache)
    return outputs
