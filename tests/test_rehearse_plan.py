"""The rehearsal's plan, derived from a recipe's: the shape kept, the sizes shrunk, what a CPU cannot do said so.
Pure planning, no process started (tests/test_rehearse.py runs rehearsals for real)."""

import json
from dataclasses import replace

import pytest

from grpo_launch.compose import anchored, compose
from grpo_launch.plan import build_plan
from grpo_launch.plan.rehearse import COULD_NOT, KEPT, SHRUNK, STAND_IN_DATA, derive, processes_feature


def rehearse(recipe: str, *overrides: str, hub: str | None = "offline"):
    composed = compose([f"recipe={recipe}", *overrides])
    real = build_plan(composed)
    rehearsal = derive(composed.config, real, host_memory_gib=24.0, hub=hub)
    plan = build_plan(replace(composed, recipe=f"{recipe}-rehearsal", config=rehearsal.config))
    features = {f.name: f for f in (*rehearsal.features, processes_feature(real, plan))}
    return real, plan, features, rehearsal


def roles(plan) -> list[tuple[str, int]]:
    return [(p.role, p.node) for p in plan.processes]


def test_qwen72b_colocate_keeps_two_nodes_zero3_offload_and_colocated_vllm():
    real, plan, features, _ = rehearse("qwen72b-colocate")
    assert (plan.nodes, plan.accelerator, plan.world_size) == (2, "cpu", 2)
    assert roles(plan) == [("trainer", 0), ("trainer", 1)]
    assert [len(e.ranks) for e in plan.engines] == [1, 1]  # a colocated engine in each rank, TP 1
    assert plan.files["deepspeed.json"]["zero_optimization"]["stage"] == 3
    assert plan.files["deepspeed.json"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert plan.files["accelerate.yaml"]["distributed_type"] == "DEEPSPEED"
    assert features["ZeRO"].status == KEPT and features["launcher"].status == KEPT
    assert features["nodes"].status == SHRUNK and features["nodes"].rehearsal.startswith("2 ")
    assert features["vLLM sleep mode"].status == COULD_NOT and "no sleep mode on a CPU" in features[
        "vLLM sleep mode"].why
    assert features["weight sync"].status == COULD_NOT
    assert plan.memory.fits


def test_qwen72b_server_keeps_a_vllm_node_apart_from_the_trainer_node():
    _, plan, features, _ = rehearse("qwen72b-server")
    assert roles(plan) == [("vllm", 1), ("trainer", 0)]
    assert plan.process("vllm").argv[:2] == ("vllm", "serve")
    assert features["processes"].real == "vllm, trainer x4" and features["processes"].rehearsal == "vllm, trainer"


def test_qwen7b_server_shares_its_node():
    _, plan, _, _ = rehearse("qwen7b-server")
    assert roles(plan) == [("vllm", 0), ("trainer", 0)] and plan.world_size == 2


def test_qwen15b_async_lora_keeps_replicas_proxy_and_lora():
    _, plan, features, _ = rehearse("qwen1.5b-async-lora")
    assert [p.name for p in plan.processes] == ["vllm-0", "vllm-1", "proxy", "trainer"]
    assert plan.trainer_inputs.lora.r == 1 and plan.vllm.replicas.lora.max_lora_rank == 1
    assert features["vLLM servers"].real == "6" and features["vLLM servers"].rehearsal == "2"
    assert features["trainer"].status == COULD_NOT and "AsyncGRPOTrainer needs CUDA" in features["trainer"].why


@pytest.mark.parametrize("recipe", ["qwen72b-colocate", "qwen72b-server", "qwen7b-server", "qwen1.5b-async-lora",
                                    "qwen1.5b-colocate", "tiny-cpu", "tiny-cpu-server"])
def test_rehearsals_are_small_and_keep_trls_rules(recipe):
    real, plan, features, _ = rehearse(recipe)
    assert plan.trainer_args["max_steps"] == 2 and plan.trainer_args["max_completion_length"] <= 8
    assert plan.batch.num_generations == real.batch.num_generations  # kept, and the batch holds its groups
    assert plan.trainer_inputs.model == "model" and plan.nodes <= 2 and plan.memory.fits
    assert features["num_generations"].status == KEPT and features["rewards"].status == KEPT


def test_a_hub_dataset_out_of_reach_rehearses_with_rows_in_its_own_columns():
    _, plan, features, rehearsal = rehearse("qwen7b-server", hub="the hub is not reachable (offline)")
    assert features["data"].status == COULD_NOT and "offline" in features["data"].why
    assert plan.trainer_inputs.data.path == STAND_IN_DATA and plan.trainer_inputs.data.source == "files"
    row = json.loads(rehearsal.files[STAND_IN_DATA].splitlines()[0])
    assert set(row) == {"prompt", "reward_model"} and "ground_truth" in row["reward_model"]  # the recipe's mapping


def test_a_reachable_hub_dataset_is_loaded_for_real():
    _, plan, features, rehearsal = rehearse("qwen7b-server", hub=None)
    assert plan.trainer_inputs.data.path == "sail/Sanity-Test-R1D-1.5B" and plan.trainer_inputs.data.max_samples
    assert features["data"].status == SHRUNK and rehearsal.files == {}


def test_paths_are_anchored_where_grpo_runs(tmp_path):
    composed = compose(["data.source=files", "data.path=prompts/*.jsonl"])
    assert anchored(composed, tmp_path).config.data.path == f"{tmp_path}/prompts/*.jsonl"
    absolute = compose(["data.source=files", "data.path=/data/p.jsonl"])
    assert anchored(absolute, tmp_path) is absolute
    assert anchored(compose([]), tmp_path).config.data.path == "sevens"  # built-in data is no path


def test_a_rehearsal_keeps_its_files_and_caches_in_its_run_directory():
    _, plan, features, _ = rehearse("qwen72b-colocate", "trainer.output_dir=/shared/ckpt")
    assert plan.trainer_args["output_dir"] == "checkpoints" and features["output_dir"].real == "/shared/ckpt"
    env = plan.processes[0].env
    assert env["HF_HOME"] == "cache/huggingface" and env["VLLM_CACHE_ROOT"] == "cache/vllm"  # relative: the run dir
    composed = compose(["recipe=qwen72b-colocate"])
    kept = derive(composed.config, build_plan(composed), host_memory_gib=24.0, hub=None,
                  environment=("TORCH_EXTENSIONS_DIR",))
    assert "TORCH_EXTENSIONS_DIR" not in kept.config.env.set  # the caller's own choice stays where it points


def test_a_scheduler_that_cannot_run_here_is_rehearsed_locally():
    _, plan, features, _ = rehearse("qwen72b-server", "scheduler=slurm")
    assert plan.scheduler.kind == "local" and features["scheduler"].status == COULD_NOT
    composed = compose(["recipe=qwen72b-server", "scheduler=slurm"])
    kept = derive(composed.config, build_plan(composed), host_memory_gib=24.0, hub=None, schedulers=("local", "slurm"))
    assert kept.config.scheduler.kind == "slurm" and kept.config.cluster.hosts == []
