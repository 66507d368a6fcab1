"""Tree attention for TRL's AsyncGRPOTrainer without downloading a kernel.

AsyncGRPOTrainer packs rollouts into "tree" rows (samples sharing a prompt reuse its keys) and always runs its
`tree_fa3` attention, which fetches FlashAttention-3 from the Hugging Face hub through the `kernels` package on the
first forward (Hopper GPUs only, and a download). With `model.attn_implementation=sdpa`, grpo-launch instead hands
TRL's tree attention a varlen kernel built on torch's scaled_dot_product_attention: same inputs, same outputs, no
download, any device. TRL's wrapper (dtype, layout, the packed key index) is kept; only the kernel is replaced.
"""

from __future__ import annotations

from types import SimpleNamespace


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, **_):
    """FlashAttention's varlen interface: q [total_q, heads, dim], k/v [total_k, kv_heads, dim], sequences delimited
    by the cumulative lengths; causal masks align to the bottom-right corner when a query segment is shorter than its
    key segment (the tree's shared prompt keys precede the sample's own queries)."""
    import torch
    import torch.nn.functional as F

    if softcap:
        raise NotImplementedError("logit soft-capping (softcap) needs the FlashAttention kernel: leave "
                                  "model.attn_implementation unset for this model")
    left = window_size[0] if window_size is not None else -1
    outputs = []
    for i in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        k0, k1 = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (q[q0:q1], k[k0:k1], v[k0:k1]))  # [1, heads, len, dim]
        mask = None
        if causal or left >= 0:
            rows = torch.arange(q1 - q0, device=q.device).unsqueeze(1) + (k1 - k0) - (q1 - q0)
            cols = torch.arange(k1 - k0, device=q.device).unsqueeze(0)
            mask = cols <= rows if causal else torch.ones_like(cols <= rows)
            if left >= 0:
                mask = mask & (cols >= rows - left)
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=softmax_scale,
                                             enable_gqa=qs.shape[1] != ks.shape[1])
        outputs.append(out[0].transpose(0, 1))  # [len, heads, dim]
    return torch.cat(outputs, dim=0)


SDPA_KERNEL = SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


def use_sdpa_tree_attention() -> None:
    """Make TRL's `tree_fa3` attention use the SDPA kernel instead of downloading FlashAttention-3."""
    from trl.experimental.async_grpo import packing

    packing._flash_attn = lambda: SDPA_KERNEL
