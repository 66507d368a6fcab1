"""The SDPA kernel behind TRL's tree attention (model.attn_implementation=sdpa for async-lora) computes what
FlashAttention's varlen kernel computes."""

import copy

import pytest
import torch

from grpo_launch.trainer.tree_attention import flash_attn_varlen_func


def naive_segment_attention(q, k, v, scale, causal, left):
    """[len_q, heads, dim] attention of one segment, by definition, in float64; GQA by repeating kv heads."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    offset = k.shape[0] - q.shape[0]
    rows = torch.arange(q.shape[0]).unsqueeze(1) + offset
    cols = torch.arange(k.shape[0]).unsqueeze(0)
    allowed = (cols <= rows) if causal else torch.ones_like(cols <= rows)
    if left >= 0:
        allowed &= cols >= rows - left
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def twin_models(seed: int):
    """The same tiny Qwen2 twice: with plain SDPA attention, and with TRL's tree attention on the SDPA kernel."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, register_tree_attention

    from grpo_launch.trainer.tree_attention import use_sdpa_tree_attention

    register_tree_attention()
    use_sdpa_tree_attention()
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    plain = Qwen2ForCausalLM(config).eval()
    tree = Qwen2ForCausalLM(copy.deepcopy(config)).eval()  # its own config: the attention setting lives there
    tree.load_state_dict(plain.state_dict())
    tree.config._attn_implementation = TREE_ATTENTION
    return plain, tree


@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(4, 4, -1), (4, 2, -1), (6, 2, 3)])
def test_varlen_matches_the_definition(heads, kv_heads, window):
    torch.manual_seed(0)
    q_lens, k_lens = [5, 3, 7], [9, 3, 12]  # queries at the end of longer key segments (a shared prompt before them)
    dim, scale = 8, 8 ** -0.5
    q = torch.randn(sum(q_lens), heads, dim)
    k, v = torch.randn(sum(k_lens), kv_heads, dim), torch.randn(sum(k_lens), kv_heads, dim)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()])
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), softmax_scale=scale, causal=True,
                                 window_size=(window, 0))
    expected = torch.cat([naive_segment_attention(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]],
                                                  v[cu_k[i]:cu_k[i + 1]], scale, True, window) for i in range(3)])
    assert out.shape == (sum(q_lens), heads, dim)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_packed_rows_through_trl_match_a_plain_forward():
    """A tiny Qwen2 model run through TRL's tree attention (with this kernel) on two packed samples gives the same
    logits as plain SDPA attention on each sample alone."""
    plain, tree = twin_models(seed=0)
    a, b = torch.randint(0, 50, (7,)), torch.randint(0, 50, (5,))
    lens = torch.tensor([0, 7, 12], dtype=torch.int32)
    with torch.no_grad():
        positions = torch.cat([torch.arange(7), torch.arange(5)])[None]
        packed = tree(input_ids=torch.cat([a, b])[None], position_ids=positions, tree_kv_index=torch.arange(12),
                      tree_cu_seqlens_q=lens, tree_cu_seqlens_k=lens, tree_max_seqlen_q=7,
                      tree_max_seqlen_k=7).logits[0]
        alone = torch.cat([plain(input_ids=a[None]).logits[0], plain(input_ids=b[None]).logits[0]])
    torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)


def test_shared_prompt_tree_matches_plain_forwards():
    """One prompt, two completions, packed as a tree (the second completion reuses the prompt's keys)."""
    plain, tree = twin_models(seed=1)
    prompt, first, second = torch.randint(0, 50, (4,)), torch.randint(0, 50, (3,)), torch.randint(0, 50, (2,))
    with torch.no_grad():
        packed = tree(input_ids=torch.cat([prompt, first, second])[None],
                      position_ids=torch.tensor([[0, 1, 2, 3, 4, 5, 6, 4, 5]]),
                      tree_kv_index=torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 7, 8]),
                      tree_cu_seqlens_q=torch.tensor([0, 7, 9], dtype=torch.int32),
                      tree_cu_seqlens_k=torch.tensor([0, 7, 13], dtype=torch.int32),
                      tree_max_seqlen_q=7, tree_max_seqlen_k=7).logits[0]
        one = plain(input_ids=torch.cat([prompt, first])[None]).logits[0]
        two = plain(input_ids=torch.cat([prompt, second])[None]).logits[0]
    torch.testing.assert_close(packed[:7], one, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed[7:], two[4:], atol=1e-4, rtol=1e-4)
