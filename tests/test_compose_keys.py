"""Key overrides are applied to Hydra's composition of the group options the way Hydra applies them: the same
config, or the same error, as Hydra composing everything at once (the differential this path rests on)."""

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf, open_dict

from grpo_launch.compose import PRIMARY_DIR, Composer, _quoted, _translate_overrides, _typed, recipes
from grpo_launch.compose.hydra_errors import user_error
from grpo_launch.compose.origins import Origins

CASES = [
    [], ["seed=3"], ["recipe=qwen72b-colocate", "zero.stage=2", "vllm.tensor_parallel_size=4"],
    ["rewards=[{fn:accuracy},{fn:length_penalty,weight:0.1}]"], ["cluster.hosts=[a,b]"], ["env.set.FOO=bar"],
    ["trainer.beta=0.5"], ["++trainer.beta=0.5"], ["~trainer.beta"], ["~trainer.beta=0.0"], ["+trainer.top_k=3"],
    ["model.tiny={hidden_size:32}"], ["description='a b'"], ["vllm.max_model_len=null"],
    # mistakes
    ["vllm.tensor_parallel_sz=2"], ["clustr.nodes=2"], ["lora.rank=8"], ["model.tiny.hiden_size=8"],
    ["cluster.nodes=four"], ["vllm.gpu_memory_utilization=high"], ["lora.enabled=maybe"], ["vllm.extra_args=5"],
    ["description=[1,2]"], ["rewards=[{fn:sevens,wieght:2}]"], ["model.name_or_path=???"], ["+seed=3"],
    ["~trainer.beta=0.1"], ["cluster.nodes=null"],
]
# Hydra adds `+vllm.new_key=1` to the schema's section, where the typed config drops it, and `~nothing.here` fails
# only once it is applied: grpo-launch refuses both before composing (tests/test_bad_input.py).


def hydra_all_at_once(groups, keys):
    """The config Hydra composes with every override given to it, or its error as `_user_error` words it."""
    searchpath = f"hydra.searchpath=[{','.join(_quoted(d) for d in recipes.search_path())}]"
    lines = [o.input_line for o in keys]
    try:
        with initialize_config_dir(config_dir=str(PRIMARY_DIR), version_base=None):
            cfg = hydra_compose(recipes.PRIMARY, overrides=[*groups, *lines, searchpath, "hydra/job_logging=none",
                                                             "hydra/hydra_logging=none"], return_hydra_config=True)
        with open_dict(cfg):
            del cfg["hydra"]
        return OmegaConf.to_object(cfg)
    except Exception as e:  # noqa: BLE001  (any composition error, compared by its user-facing words)
        return user_error(e, lines).message


@pytest.mark.parametrize("overrides", CASES, ids=[" ".join(c) or "(none)" for c in CASES])
def test_key_overrides_compose_as_hydra_would(overrides):
    composer = Composer()
    groups, keys = _translate_overrides(overrides, composer.dirs)
    cfg, _ = composer._groups(groups, Origins(tuple(composer.dirs), None, tuple(overrides)))  # registers the schema
    try:
        got, _ = _typed(cfg, keys)
    except Exception as e:  # noqa: BLE001
        got = e.message
    assert got == hydra_all_at_once(groups, keys)
