"""Model sizes without a download: the catalog's parameter counts match the published sizes."""

import json

import pytest

from grpo_launch.compose.schema import Model
from grpo_launch.estimate import catalog

# Published sizes: the Qwen2.5 and Qwen3 model cards ("Number of Parameters", "Number of Parameters
# (Non-Embedding)") and the hub's safetensors parameter counts for Llama (billions).
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B": (0.49, 0.36),
    "Qwen/Qwen2.5-1.5B": (1.54, 1.31),
    "Qwen/Qwen2.5-3B": (3.09, 2.77),
    "Qwen/Qwen2.5-7B": (7.61, 6.53),
    "Qwen/Qwen2.5-14B": (14.7, 13.1),
    "Qwen/Qwen2.5-32B": (32.5, 31.0),
    "Qwen/Qwen2.5-72B": (72.7, 70.0),
    "Qwen/Qwen2.5-Math-1.5B": (1.54, None),
    "Qwen/Qwen2.5-Math-7B": (7.62, None),
    "Qwen/Qwen2.5-Math-72B": (72.7, None),
    "Qwen/Qwen3-0.6B": (0.6, 0.44),
    "Qwen/Qwen3-4B": (4.0, 3.6),
    "Qwen/Qwen3-8B": (8.2, 6.95),
    "Qwen/Qwen3-14B": (14.8, 13.2),
    "Qwen/Qwen3-32B": (32.8, 31.2),
    "meta-llama/Llama-3.2-1B": (1.24, None),
    "meta-llama/Llama-3.2-3B": (3.21, None),
    "meta-llama/Llama-3.1-8B": (8.03, None),
    "meta-llama/Llama-3.1-70B": (70.6, None),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_parameter_count_matches_published_size_within_1_percent(name):
    shape = catalog.CATALOG[name]
    total, non_embedding = PUBLISHED[name]
    assert shape.parameters / 1e9 == pytest.approx(total, rel=0.01)
    if non_embedding is not None:
        assert shape.non_embedding_parameters / 1e9 == pytest.approx(non_embedding, rel=0.01)


def test_qwen3_1_7b_matches_its_card_at_the_card_precision():
    # The card gives two digits: "1.7B", non-embedding "1.4B"; the exact count (1.72B) is 1.2% above the label,
    # so check the label's rounding and the non-embedding count within 1%.
    shape = catalog.CATALOG["Qwen/Qwen3-1.7B"]
    assert round(shape.parameters / 1e9, 1) == 1.7
    assert shape.non_embedding_parameters / 1e9 == pytest.approx(1.4, rel=0.01)


def test_issue_examples_exact():
    assert round(catalog.CATALOG["Qwen/Qwen2.5-7B"].parameters / 1e9, 2) == 7.62
    assert round(catalog.CATALOG["Qwen/Qwen2.5-72B"].parameters / 1e9, 1) == 72.7


def test_kv_bytes_per_token_by_hand():
    # Qwen2.5-72B: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 B = 327,680 B per token.
    assert catalog.CATALOG["Qwen/Qwen2.5-72B"].kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2


def test_lora_parameters_by_hand():
    # Qwen2.5-1.5B, rank 1, all-linear: per layer r x (in + out) over q, k, v, o, gate, up, down.
    s = catalog.CATALOG["Qwen/Qwen2.5-1.5B"]
    per_layer = (1536 + 1536) + 2 * (1536 + 256) + (1536 + 1536) + 2 * (1536 + 8960) + (8960 + 1536)
    assert s.lora_parameters(1, ["all-linear"]) == 28 * per_layer
    assert s.lora_parameters(8, ["q_proj", "v_proj"]) == 28 * 8 * ((1536 + 1536) + (1536 + 256))


def test_resolve_catalog_builtin_and_mirror():
    assert catalog.resolve(Model(name_or_path="Qwen/Qwen2.5-Math-72B"), None).source == "catalog"
    mirror = catalog.resolve(Model(name_or_path="my-org/Qwen2.5-Math-7B"), None)  # a fine-tune keeps the repo's name
    assert mirror.shape == catalog.CATALOG["Qwen/Qwen2.5-Math-7B"]
    tiny = catalog.resolve(Model(name_or_path="builtin:tiny"), None)
    assert tiny.source == "built-in" and tiny.shape.hidden == 64
    assert catalog.resolve(Model(name_or_path="nobody/unknown-model"), None) is None


def test_local_config_json(tmp_path):
    cfg = {"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
           "tie_word_embeddings": True, "max_position_embeddings": 40960}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    resolved = catalog.resolve(Model(name_or_path=str(tmp_path)), catalog.local_config(str(tmp_path)))
    assert resolved.source.endswith("config.json")
    assert resolved.shape == catalog.CATALOG["Qwen/Qwen3-0.6B"]


def test_local_config_json_of_a_mixture_of_experts_is_not_sized(tmp_path):
    cfg = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
           "intermediate_size": 6144, "vocab_size": 151936, "num_experts": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert catalog.resolve(Model(name_or_path=str(tmp_path)), catalog.local_config(str(tmp_path))) is None
