"""The model a plan trains and serves, resolved once per plan (`resolve_model`): whether it is a built-in one (and
which), what every process loads, its shape, and the prepare step that builds a built-in model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from grpo_launch.compose.schema import Config
from grpo_launch.contracts import tiny
from grpo_launch.contracts.builtins import BUILTIN_MODEL_DIR, BUILTIN_MODEL_PREFIX, MODELS
from grpo_launch.contracts.plan import PrepareStep
from grpo_launch.errors import UserError, did_you_mean
from grpo_launch.estimate import catalog


@dataclass(frozen=True)
class ModelSource:
    name_or_path: str                  # as the recipe gives it
    builtin: str | None                # the built-in model's name (model.name_or_path=builtin:NAME), else None
    resolved: catalog.ResolvedModel | None  # its shape, None when neither the catalog nor a config.json knows it
    prepare: tuple[PrepareStep, ...]   # what builds it before any process starts (a built-in model), else ()

    @property
    def path(self) -> str:
        """What every process loads: the built-in model's directory in the run, or the hub id / local path."""
        return BUILTIN_MODEL_DIR if self.builtin else self.name_or_path

    @property
    def offline(self) -> bool:
        """Everything is local: nothing may reach for the hub."""
        return self.builtin is not None

    @property
    def context(self) -> int | None:
        """The model's context length (vLLM's max_model_len when the recipe leaves it unset), None where unknown."""
        return self.resolved.shape.context if self.resolved else None

    @property
    def context_key(self) -> str:
        """What sets the context, in words: the tiny model's knob, or the model's own."""
        return "model.tiny.max_position_embeddings" if self.builtin else f"{self.name_or_path}'s context"


def builtin_name(name_or_path: str) -> str | None:
    """The built-in model's name if `name_or_path` names one, else None; unknown built-ins are an error."""
    if not name_or_path.startswith(BUILTIN_MODEL_PREFIX):
        return None
    name = name_or_path[len(BUILTIN_MODEL_PREFIX):]
    if name not in MODELS:
        known = [BUILTIN_MODEL_PREFIX + m for m in MODELS]
        raise UserError(f"unknown built-in model '{name}'{did_you_mean(name, MODELS, prefix=BUILTIN_MODEL_PREFIX)}",
                        key="model.name_or_path", hint=f"built-ins: {', '.join(known)}")
    return name


def resolve_model(config: Config) -> ModelSource:
    """The recipe's model, resolved: a local model directory's config.json is read here, the one file planning
    reads besides the recipes (`estimate.catalog.local_config`)."""
    m = config.model
    builtin = builtin_name(m.name_or_path)
    local = None if builtin else catalog.local_config(m.name_or_path)
    return ModelSource(m.name_or_path, builtin, catalog.resolve(m, local), _prepare_steps(config, builtin))


def _prepare_steps(config: Config, builtin: str | None) -> tuple[PrepareStep, ...]:
    """Work done once before any process starts: building a built-in model (it needs torch, so not in-process)."""
    if builtin is None:
        return ()
    t = config.model.tiny
    argv = ("python", "-m", MODELS[builtin], "--out", BUILTIN_MODEL_DIR, "--hidden-size",
            str(t.hidden_size), "--num-layers", str(t.num_layers), "--num-heads", str(t.num_heads),
            "--num-kv-heads", str(t.num_kv_heads), "--max-position-embeddings", str(t.max_position_embeddings),
            "--seed", str(config.seed))
    # The build is a function of its arguments and of the model description: built once, kept between runs.
    what = json.dumps([argv, tiny.BUILD_FORMAT, tiny.MODEL_TYPE, tiny.VOCABULARY, tiny.CHAT_TEMPLATE])
    return (PrepareStep(name=f"{builtin}-model", argv=argv, creates=BUILTIN_MODEL_DIR,
                        cache_key=f"{builtin}-{hashlib.sha256(what.encode()).hexdigest()[:16]}"),)
