"""The built-in tiny model's architecture (model.name_or_path=builtin:tiny), shared by the trainer side that writes
it (`trainer.tiny_model`) and the memory estimate that sizes it (`estimate.catalog`): one description, two readers.
"""

from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
CHARACTERS = "0123456789+-=*/.,:;?! abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
VOCABULARY = (*SPECIAL_TOKENS, *CHARACTERS)  # token id = position: one character, one token
# Plain concatenation of message contents: lets chat-formatted prompts work with a model that has no chat format.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
MODEL_TYPE = "qwen2"
BUILD_FORMAT = 1  # bump when what trainer.tiny_model writes changes: built models kept between runs are keyed by it


def config_json(*, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                max_position_embeddings: int) -> dict[str, Any]:
    """The model's config.json (transformers' Qwen2Config fields): a Qwen2 layout with a 4x MLP and an output head
    of its own. Untied, because vLLM's weight reload (`reload_weights`, how CPU runs push trained weights into a
    server or a colocated engine) does not refresh a head tied to the embeddings."""
    token = {name: VOCABULARY.index(name) for name in ("<pad>", "<eos>", "<bos>")}
    return {"model_type": MODEL_TYPE, "vocab_size": len(VOCABULARY), "hidden_size": hidden_size,
            "intermediate_size": 4 * hidden_size, "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": False,
            "pad_token_id": token["<pad>"], "eos_token_id": token["<eos>"], "bos_token_id": token["<bos>"]}
