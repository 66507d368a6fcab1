"""The built-in tiny model (model.name_or_path=builtin:tiny): a random Qwen2-shaped model and a character-level
tokenizer, made offline in about a second, saved like any hub checkpoint so every tool loads it from its directory.

The tokenizer is one token per character, written as Qwen2's byte-level tokenizer pipeline (NFC, Qwen2's split
pattern, byte-level symbols: a space is "Ġ"). transformers 5 loads any qwen2 checkpoint's tokenizer as
Qwen2Tokenizer and rebuilds exactly that pipeline; a plain character vocabulary would then lose every space. So
transformers, vLLM and the routing proxy (which reads tokenizer.json with `tokenizers`) give the same token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_launch.contracts import tiny

# Qwen2Tokenizer's split pattern (transformers/models/qwen2/tokenization_qwen2.py), which it applies before the
# byte-level mapping.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def build(out_dir: str | Path, shape: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Write config, weights and tokenizer to `out_dir`; returns a summary (parameters, vocabulary size)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbol = {c: byte_level.pre_tokenize_str(c)[0][0] for c in tiny.CHARACTERS}
    vocab = {symbol.get(token, token): i for i, token in enumerate(tiny.VOCABULARY)}  # ids as contracts.tiny says
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # BPE without merges: one char, one id
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False), byte_level])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(tiny.SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        bos_token="<bos>", unk_token="<unk>", padding_side="left")
    tokenizer.chat_template = tiny.CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    fields = tiny.config_json(**shape)
    del fields["model_type"]  # Qwen2Config's own
    config = Qwen2Config(**fields)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out)
    summary = {"parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(vocab)}
    (out / "grpo_launch_tiny.json").write_text(json.dumps({**summary, "shape": shape, "seed": seed}, indent=1))
    return summary


def main() -> None:
    import argparse
    import os
    import shutil

    parser = argparse.ArgumentParser(description="Write the built-in tiny model and tokenizer to a directory.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden-size", type=int, required=True)
    parser.add_argument("--num-layers", type=int, required=True)
    parser.add_argument("--num-heads", type=int, required=True)
    parser.add_argument("--num-kv-heads", type=int, required=True)
    parser.add_argument("--max-position-embeddings", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = {k: getattr(args, k) for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                           "max_position_embeddings")}
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    summary = build(tmp, shape, seed=args.seed)
    os.rename(tmp, out)  # atomic: a half-written model directory never exists under its real name
    print(json.dumps({"out": str(out), **summary}))


if __name__ == "__main__":
    main()
