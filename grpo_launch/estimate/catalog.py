"""Model shapes without a download: a catalog of common models, a local `config.json`, or the built-in tiny model.

A shape is what the memory estimate needs: parameter count (from the layer shapes, not a rounded label), the
largest single module (DeepSpeed's ZeRO-3 gather buffer), KV-cache bytes per token and LoRA adapter sizes. The
catalog's numbers are the models' `config.json` values on the hub; tests check the counts against the published
sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from grpo_launch.compose.schema import Model
from grpo_launch.contracts import tiny
from grpo_launch.contracts.builtins import BUILTIN_MODEL_PREFIX

# The linear layers of one decoder layer, by their transformers/PEFT names ('all-linear' adapts all of them).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer (Llama/Qwen2/Qwen3 family): RMSNorm, RoPE, GQA attention, SwiGLU MLP."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    context: int                 # max_position_embeddings: vLLM's max_model_len when the recipe leaves it unset
    qkv_bias: bool = False       # Qwen2/Qwen2.5 put biases on q, k and v
    qk_norm: bool = False        # Qwen3 normalises q and k per head (two RMSNorm weights of head_dim)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def _linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer."""
        h = self.hidden
        return {"q_proj": (h, self.q_dim), "k_proj": (h, self.kv_dim), "v_proj": (h, self.kv_dim),
                "o_proj": (self.q_dim, h), "gate_proj": (h, self.intermediate), "up_proj": (h, self.intermediate),
                "down_proj": (self.intermediate, h)}

    @property
    def layer_parameters(self) -> int:
        weights = sum(i * o for i, o in self._linear_shapes().values())
        biases = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return weights + biases + norms

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_parameters
        return self.embedding_parameters + self.layers * self.layer_parameters + self.hidden + head

    @property
    def non_embedding_parameters(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_parameters
        return self.parameters - self.embedding_parameters - head

    @property
    def largest_layer_parameters(self) -> int:
        """The most parameters one module holds itself (DeepSpeed's `model_to_params`): usually the embedding."""
        projections = [i * o for i, o in self._linear_shapes().values()]
        q_bias = self.q_dim if self.qkv_bias else 0
        return max(self.embedding_parameters, self.hidden * self.q_dim + q_bias, *projections)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token (vLLM's page size per token, summed over the TP group)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def lora_parameters(self, rank: int, target_modules: list[str]) -> int:
        """Trainable parameters of a LoRA adapter: r x (in + out) for each adapted linear layer of every layer."""
        shapes = self._linear_shapes()
        names = LINEAR_MODULES if ALL_LINEAR in target_modules else [m for m in target_modules if m in shapes]
        return self.layers * sum(rank * (shapes[n][0] + shapes[n][1]) for n in names)


@dataclass(frozen=True)
class ResolvedModel:
    shape: ModelShape
    source: str                  # where the shape came from, shown in the plan


def _qwen25(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int, tied: bool,
            context: int) -> ModelShape:
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=hidden // heads,
                      intermediate=intermediate, vocab=vocab, tied_embeddings=tied, context=context, qkv_bias=True)


def _qwen3(layers: int, hidden: int, heads: int, intermediate: int, tied: bool) -> ModelShape:
    # Every Qwen3 dense model: 8 KV heads of 128, vocabulary 151936, 40960 positions.
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=8, head_dim=128, intermediate=intermediate,
                      vocab=151936, tied_embeddings=tied, context=40960, qk_norm=True)


def _llama3(layers: int, hidden: int, heads: int, head_dim: int, intermediate: int, tied: bool,
            context: int) -> ModelShape:
    # Every Llama 3.x: 8 KV heads, vocabulary 128256, no biases.
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=8, head_dim=head_dim,
                      intermediate=intermediate, vocab=128256, tied_embeddings=tied, context=context)


# Values from each model's config.json on the Hugging Face hub. Qwen2.5 base models of 1.5B, 7B and up declare
# 131072 positions, their -Instruct versions 32768; Qwen2.5-Math models 4096.
_QWEN25 = {
    "0.5B": _qwen25(24, 896, 14, 2, 4864, 151936, True, 32768),
    "1.5B": _qwen25(28, 1536, 12, 2, 8960, 151936, True, 131072),
    "3B": _qwen25(36, 2048, 16, 2, 11008, 151936, True, 32768),
    "7B": _qwen25(28, 3584, 28, 4, 18944, 152064, False, 131072),
    "14B": _qwen25(48, 5120, 40, 8, 13824, 152064, False, 131072),
    "32B": _qwen25(64, 5120, 40, 8, 27648, 152064, False, 131072),
    "72B": _qwen25(80, 8192, 64, 8, 29568, 152064, False, 131072),
}
_QWEN3 = {
    "0.6B": _qwen3(28, 1024, 16, 3072, tied=True),
    "1.7B": _qwen3(28, 2048, 16, 6144, tied=True),
    "4B": _qwen3(36, 2560, 32, 9728, tied=True),
    "8B": _qwen3(36, 4096, 32, 12288, tied=False),
    "14B": _qwen3(40, 5120, 40, 17408, tied=False),
    "32B": _qwen3(64, 5120, 64, 25600, tied=False),
}
_LLAMA_8B = _llama3(32, 4096, 32, 128, 14336, tied=False, context=131072)
_LLAMA_70B = _llama3(80, 8192, 64, 128, 28672, tied=False, context=131072)


def _catalog() -> dict[str, ModelShape]:
    shapes: dict[str, ModelShape] = {}
    for size, shape in _QWEN25.items():
        shapes[f"Qwen/Qwen2.5-{size}"] = shape
        shapes[f"Qwen/Qwen2.5-{size}-Instruct"] = replace(shape, context=32768)
    for size in ("1.5B", "7B", "72B"):
        for suffix in ("", "-Instruct"):
            shapes[f"Qwen/Qwen2.5-Math-{size}{suffix}"] = replace(_QWEN25[size], context=4096)
    for size, shape in _QWEN3.items():
        shapes[f"Qwen/Qwen3-{size}"] = shape
        shapes[f"Qwen/Qwen3-{size}-Base"] = shape
    llamas = {
        "meta-llama/Llama-3.2-1B": _llama3(16, 2048, 32, 64, 8192, tied=True, context=131072),
        "meta-llama/Llama-3.2-3B": _llama3(28, 3072, 24, 128, 8192, tied=True, context=131072),
        "meta-llama/Meta-Llama-3-8B": replace(_LLAMA_8B, context=8192),
        "meta-llama/Llama-3.1-8B": _LLAMA_8B,
        "meta-llama/Meta-Llama-3-70B": replace(_LLAMA_70B, context=8192),
        "meta-llama/Llama-3.1-70B": _LLAMA_70B,
        "meta-llama/Llama-3.3-70B": _LLAMA_70B,
    }
    for name, shape in llamas.items():
        shapes[name] = shape
        shapes[f"{name}-Instruct"] = shape
    return shapes


CATALOG = _catalog()
# Fine-tunes and mirrors keep their base model's repository name under another owner: match on the name alone.
_BY_NAME = {name.rsplit("/", 1)[-1].lower(): shape for name, shape in CATALOG.items()}


def shape_from_config(cfg: dict) -> ModelShape | None:
    """A shape from a transformers `config.json` of a dense Llama/Qwen-style model; None for other kinds."""
    model_type = cfg.get("model_type", "")
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    if any(k not in cfg for k in needed) or "num_experts" in cfg or "num_local_experts" in cfg:
        return None
    heads = cfg["num_attention_heads"]
    return ModelShape(
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        # transformers' PretrainedConfig ties by default; Llama and Qwen configs always say which.
        tied_embeddings=cfg.get("tie_word_embeddings", True),
        context=cfg.get("max_position_embeddings", 4096),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=model_type == "qwen3")


def _tiny_shape(model: Model) -> ModelShape:
    t = model.tiny
    config = tiny.config_json(hidden_size=t.hidden_size, num_layers=t.num_layers, num_heads=t.num_heads,
                              num_kv_heads=t.num_kv_heads, max_position_embeddings=t.max_position_embeddings)
    shape = shape_from_config(config)
    assert shape is not None
    return shape


def local_config(name_or_path: str) -> tuple[dict, str] | None:
    """A local model directory's config.json and its path, or None: the one file planning reads besides the
    recipes (`plan.model.resolve_model` calls it once per plan). Everything else here is pure."""
    config_file = Path(name_or_path).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text()), str(config_file)


def resolve(model: Model, local: tuple[dict, str] | None) -> ResolvedModel | None:
    """The shape of the recipe's model, or None when neither the catalog nor `local` (the model directory's
    config.json and its path, `local_config`) knows it."""
    name = model.name_or_path
    if name.startswith(BUILTIN_MODEL_PREFIX):
        return ResolvedModel(_tiny_shape(model), "built-in")
    if local is not None:
        shape = shape_from_config(local[0])
        return ResolvedModel(shape, local[1]) if shape else None
    shape = CATALOG.get(name) or _BY_NAME.get(name.rstrip("/").rsplit("/", 1)[-1].lower())
    return ResolvedModel(shape, "catalog") if shape else None
