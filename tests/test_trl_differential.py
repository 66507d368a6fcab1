"""The plan's TRL rules against TRL's own: random batch layouts and settings, each judged by `grpo_batch` (what
`grpo plan` checks) and by TRL's GRPOConfig.__post_init__ at the same world size. A rule TRL adds or changes shows
here as a disagreement, with the arguments that found it."""

import random
from unittest import mock

import pytest

from grpo_launch.errors import UserError
from grpo_launch.plan.trl_rules import grpo_batch

trl = pytest.importorskip("trl")
CASES = 300
SEED = 20261201


def random_args(rng: random.Random) -> tuple[dict, int]:
    world = rng.choice([1, 2, 3, 4, 6, 8, 16])
    args = {"per_device_train_batch_size": rng.randint(1, 8), "gradient_accumulation_steps": rng.randint(1, 4),
            "num_generations": rng.randint(1, 9)}
    batching = rng.random()
    if batching < 0.3:
        args["generation_batch_size"] = rng.randint(1, 12) * rng.choice([1, 2, 4, 8])
    elif batching < 0.6:
        args["steps_per_generation"] = rng.randint(1, 4)
    elif batching < 0.65:
        args["generation_batch_size"], args["steps_per_generation"] = 16, 2
    if rng.random() < 0.3:
        args["eval_strategy"] = "steps"
        args["per_device_eval_batch_size"] = rng.randint(1, 8)
        if rng.random() < 0.5:
            args["num_generations_eval"] = rng.randint(2, 6)
    if rng.random() < 0.05:
        args["auto_find_batch_size"] = True
    if rng.random() < 0.1:
        args["log_completions_hub_repo"] = "me/completions"
        args["log_completions"] = rng.random() < 0.5
    if rng.random() < 0.2:
        args["vllm_importance_sampling_clip_min"] = rng.choice([None, 0.5, 2.0, 3.0])
        args["vllm_importance_sampling_clip_max"] = rng.choice([None, 1.0, 2.0, 3.0])
    if rng.random() < 0.1:
        args["vllm_importance_sampling_mode"] = rng.choice(["token_truncate", "sequence_mask"])
        args["vllm_importance_sampling_clip_min"] = None
        args["vllm_importance_sampling_clip_max"] = rng.choice([None, 3.0])
    return args, world


def trl_accepts(args: dict, world: int, tmp_path) -> bool:
    from transformers import TrainingArguments
    from trl import GRPOConfig

    with mock.patch.object(TrainingArguments, "world_size", new=property(lambda self: world)):
        try:
            GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **args)
        except ValueError:
            return False
    return True


def plan_accepts(args: dict, world: int) -> bool:
    try:
        grpo_batch(args, world, "GRPOConfig")
    except UserError:
        return False
    return True


def test_plan_and_trl_agree_on_random_layouts(tmp_path):
    rng = random.Random(SEED)
    disagreements = []
    verdicts = set()
    for _ in range(CASES):
        args, world = random_args(rng)
        ours, theirs = plan_accepts(args, world), trl_accepts(args, world, tmp_path)
        verdicts.add(theirs)
        if ours != theirs:
            disagreements.append((world, args, f"plan {'accepts' if ours else 'refuses'}, TRL "
                                               f"{'accepts' if theirs else 'refuses'}"))
    assert verdicts == {True, False}  # the random layouts reach both verdicts
    assert not disagreements, disagreements[:5]
