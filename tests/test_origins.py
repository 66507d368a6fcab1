"""Errors about a key say where its value came from: the command line, the recipe, a group option file, or the
schema's default. The family this is for: a value a recipe set that an override made invalid."""

import pytest

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.errors import UserError
from grpo_launch.plan import build_plan

SET_BY_A_FILE_INVALID_AFTER_AN_OVERRIDE = [
    # the example: the default recipe tiny-cpu sets trainer.beta, which AsyncGRPOConfig lacks
    (["placement=async-lora"],
     "error: trainer.beta=0.0 (set by recipe tiny-cpu) is not a field of AsyncGRPOConfig: async GRPO has no KL term; "
     "remove it with ~trainer.beta"),
    (["recipe=tiny-cpu-async-lora", "placement=server"],
     "trainer.max_staleness=2 (set by recipe tiny-cpu-async-lora) is not a field of GRPOConfig"),
    (["recipe=qwen72b-colocate", "cluster.gpus_per_node=4"],
     "vllm.tensor_parallel_size=8 (set by recipe qwen72b-colocate) must divide the 4 trainer ranks of a node"),
    (["recipe=qwen72b-colocate", "cluster.accelerator=cpu"],
     "placement.colocate.sleep_level=2 (set by recipe qwen72b-colocate): vLLM has no sleep mode"),
    (["placement=server"], "but vllm.enabled=false (vllm.enabled=false is set by recipe tiny-cpu)"),
    # a group option file
    (["recipe=qwen1.5b-async-lora", "zero=3"], "zero.stage=3 (set by zero option 3): AsyncGRPOTrainer trains with"),
    # the schema's default
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=8"],
     "no GPU is left for the trainer on node(s) [0]: vLLM takes 8 of 8 GPUs (placement.trainer_nodes=null is the "
     "schema default)"),
    # the command line
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=3"],
     "vllm.tensor_parallel_size=3 (set on the command line) must divide the 8 trainer ranks"),
    (["cluster.nodes=four"], "'cluster.nodes' must be an integer, got 'four' (cluster.nodes=four is set on the "
                             "command line)"),
]


@pytest.mark.parametrize(("overrides", "message"), SET_BY_A_FILE_INVALID_AFTER_AN_OVERRIDE,
                         ids=[" ".join(o) for o, _ in SET_BY_A_FILE_INVALID_AFTER_AN_OVERRIDE])
def test_an_error_says_where_the_value_came_from(overrides, message, capsys):
    assert main(["plan", *overrides]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_the_fix_it_names_works():
    """`~trainer.beta` removes what the recipe set: the async-lora error is gone (the next one is another key's)."""
    with pytest.raises(UserError) as caught:
        build_plan(compose(["placement=async-lora", "~trainer.beta"]))
    assert caught.value.key == "data.eval"


def _user_recipes(tmp_path, files: dict[str, str]):
    d = tmp_path / "mine"
    for name, body in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(body)
    return d


def test_a_mistake_in_a_user_recipe_names_the_recipe(tmp_path, capsys):
    d = _user_recipes(tmp_path, {"recipe/broken.yaml": "# @package _global_\ntrainer:\n  learnig_rate: 1.0\n"})
    assert main(["plan", "recipe=broken", "--recipes-dir", str(d)]) == 2
    assert "(trainer.learnig_rate=1.0 is set by recipe broken)" in capsys.readouterr().err


def test_a_bound_broken_by_a_group_option_file_names_the_file(tmp_path, capsys):
    d = _user_recipes(tmp_path, {"zero/9.yaml": "stage: 9\n"})
    assert main(["plan", "zero=9", "--recipes-dir", str(d)]) == 2
    assert "'zero.stage' must be one of 0, 1, 2, 3; got 9 (zero.stage=9 is set by zero option 9)" in \
        capsys.readouterr().err


def test_origins_of_a_composition():
    origins = compose(["recipe=qwen7b-server", "trainer.learning_rate=3e-6", "zero=2"]).origins
    assert origins.of("trainer.learning_rate") == ("set on the command line", "3e-6")
    assert origins.of("trainer.max_steps") == ("set by recipe qwen7b-server", 500)
    assert origins.of("zero.stage") == ("set by zero option 2", 2)
    assert origins.of("cluster.gpus_per_node") == ("set by cluster option 1x8-h100-80gb", 8)
    assert origins.of("rewards[0].fn") == ("set by recipe qwen7b-server", [{"fn": "accuracy"}])
    assert origins.of("vllm.port") is None  # the schema's default
