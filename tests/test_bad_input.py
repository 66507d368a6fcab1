"""Every user mistake gets a clear error naming the key, exit code 2, no traceback, and nothing written."""

import pytest
from conftest import grpo

from grpo_launch.cli import main

BAD_PLAN_INPUTS = [
    # typos at every level, with a suggestion
    (["trainer.learnig_rate=1e-6"], "unknown key 'trainer.learnig_rate'; did you mean 'trainer.learning_rate'?"),
    (["vllm.tensor_parallel_sz=2"], "did you mean 'vllm.tensor_parallel_size'?"),
    (["clustr.nodes=2"], "did you mean 'cluster.nodes'?"),
    (["zero.stag=3"], "did you mean 'zero.stage'?"),
    (["model.name=foo"], "did you mean 'model.name_or_path'?"),
    (["lora.rank=8"], "unknown key 'lora.rank'"),
    (["model.tiny.hiden_size=8"], "did you mean 'model.tiny.hidden_size'?"),
    (["trainer.a.b=1"], "one level deep"),
    # unknown recipe or group option
    (["recipe=qwen72b-colocat"], "unknown recipe 'qwen72b-colocat'; did you mean 'qwen72b-colocate'?"),
    (["zero=4"], "unknown zero option '4'"),
    (["placement=servr"], "unknown placement option 'servr'; did you mean 'server'?"),
    (["cluster=8x-h100"], "unknown cluster option '8x-h100'"),
    (["model=qwen-72b"], "unknown model option 'qwen-72b'"),
    (["data=gsm8k"], "unknown data option 'gsm8k'"),
    # wrong types
    (["cluster.nodes=four"], "'cluster.nodes' must be an integer, got 'four'"),
    (["vllm.gpu_memory_utilization=high"], "'vllm.gpu_memory_utilization' must be a number"),
    (["lora.enabled=maybe"], "'lora.enabled' must be true or false"),
    (["trainer.learning_rate=fast"], "'trainer.learning_rate' must be float"),
    (["trainer.max_steps=1.5"], "'trainer.max_steps' must be int"),
    (["vllm.extra_args=5"], "'vllm.extra_args' must be a list"),
    (["description=[1,2]"], "'description' must be a string"),
    # out of range / not a choice
    (["vllm.gpu_memory_utilization=1.5"], "'vllm.gpu_memory_utilization' must be <= 1.0"),
    (["cluster.nodes=0"], "'cluster.nodes' must be >= 1"),
    (["vllm.sleep_level=3"], "'vllm.sleep_level' must be one of 0, 1, 2"),
    (["launcher=torchrn"], "'launcher' must be one of accelerate, torchrun; got 'torchrn'; did you mean 'torchrun'?"),
    (["trainer.lr_scheduler_type=cosin"], "did you mean 'cosine'?"),
    (["trainer.max_prompt_length=512"], "removed in TRL 0.28"),
    (["vllm.port=70000"], "'vllm.port' must be <= 65535"),
    # impossible layouts
    (["recipe=qwen72b-colocate", "vllm.sleep_level=1"], "TRL 1.16's colocate sleep mode always uses level 2"),
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=3"], "must divide the 8 trainer ranks of a node"),
    (["recipe=qwen7b-colocate", "vllm.data_parallel_size=3"], "one engine per TP group"),
    (["recipe=qwen7b-server", "vllm.data_parallel_size=2"], "talks to one server"),
    (["recipe=qwen7b-server", "vllm.sleep_level=2"], "only applies to placement=colocate"),
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=16"], "needs vllm.tensor_parallel_size=16 GPUs"),
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=8"], "no GPU is left for the trainer"),
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=8"], "does not split Qwen/Qwen2.5-Math-7B's 28 attention"),
    (["recipe=qwen7b-server", "placement.trainer_nodes=5"], "the cluster has 1 node"),
    (["recipe=qwen1.5b-async-lora", "lora.enabled=false"], "placement async-lora syncs a LoRA adapter"),
    (["recipe=qwen1.5b-async-lora", "zero=3"], "FSDP2 only"),
    (["recipe=qwen1.5b-async-lora", "launcher=torchrun"], "async-lora needs launcher=accelerate"),
    (["recipe=qwen1.5b-async-lora", "vllm.max_loras=4"], "must be at least trainer.max_staleness + 2 = 6"),
    (["recipe=qwen1.5b-async-lora", "vllm.max_lora_rank=4"], "not a rank vLLM accepts"),
    (["recipe=qwen1.5b-async-lora", "lora.r=16", "vllm.max_lora_rank=8"], "is below lora.r=16"),
    (["recipe=qwen1.5b-async-lora", "vllm.data_parallel_size=9"], "do not fit"),
    (["recipe=qwen1.5b-async-lora", "lora.target_modules=[lm_head]"], "cannot serve adapters on the output head"),
    (["recipe=qwen1.5b-async-lora", "proxy.port=8000"], "port 8000 on node 0 is wanted by both"),
    (["recipe=qwen7b-server", "run.main_process_port=8000"], "port 8000 on node 0 is wanted by both"),
    (["placement=server"], "vllm.enabled=false"),
    (["recipe=tiny-cpu-colocate", "vllm.sleep_level=2"], "vLLM has no sleep mode on a CPU"),
    (["recipe=tiny-cpu-async-lora", "vllm.block_size=16"], "takes KV-cache blocks of a multiple of 32 tokens"),
    (["recipe=tiny-cpu-async-lora", "cluster.gpus_per_node=4"], "async-lora on a CPU trains in 1 process"),
    # evaluation (data.eval)
    (["recipe=tiny-cpu-async-lora", "data.eval=held-out"], "placement async-lora cannot evaluate"),
    (["data.eval=test"], "a built-in task's held-out rows are 'held-out'"),
    (["data.eval=null"], "data.eval_samples is set but data.eval is not"),
    (["data.eval=null", "data.eval_samples=null", "trainer.eval_strategy=steps"],
     "evaluates, but data.eval names no held-out prompts"),
    (["data.source=files", "data.path=train.jsonl", "data.eval=test.txt"], "data.eval 'test.txt' is not a"),
    (["recipe=qwen1.5b-colocate", "data.eval_samples=64"], "data.eval_samples is set but data.eval is not"),
    (["zero.offload_param=true"], "zero.offload_param needs ZeRO stage 3"),
    (["zero.offload_optimizer=true"], "zero.offload_optimizer needs DeepSpeed"),
    (["cluster.hosts=[a,b]"], "lists 2 address(es) for 1 node(s)"),
    # scale-out: schedulers and machines
    (["scheduler=slurn"], "unknown scheduler option 'slurn'; did you mean 'slurm'?"),
    (["scheduler.kind=pbs"], "'scheduler.kind' must be one of local, slurm, skypilot"),
    (["scheduler=slurm", "cluster.nodes=2", "cluster.hosts=[a,b]"], "scheduler=slurm picks the machines"),
    (["scheduler=skypilot", "cluster.hosts=[a]"], "scheduler=skypilot picks the machines"),
    (["recipe=qwen72b-colocate", "cluster.hosts=[h0,h1,h1,h3]"], "gives nodes 1 and 2 the same machine h1"),
    (["recipe=qwen72b-colocate", "scheduler=slurm", "scheduler.slurm.gpus_per_node=4"],
     "the plan places work on cluster.gpus_per_node=8 GPUs"),
    (["scheduler=slurm", "scheduler.slurm.gres=gpu:2", "scheduler.slurm.gpus_per_node=2"], "both request GPUs"),
    (["cluster.nodes=2", "run.rendezvous_timeout_s=0"], "'run.rendezvous_timeout_s' must be > 0"),
    # two nodes on one machine share its ports
    (["recipe=tiny-cpu-async-lora", "cluster.nodes=2", "cluster.gpus_per_node=1", "vllm.data_parallel_size=1",
      "proxy.port=8000"],
     "port 8000 on nodes 1 and 0 (both 127.0.0.1) is wanted by both vLLM replica 0 and the routing proxy"),
    # TRL's batch rules with the plan's world size
    (["trainer.per_device_train_batch_size=3"], "must be divisible by trainer.num_generations=4"),
    (["trainer.num_generations=1"], "it needs >= 2"),
    (["trainer.generation_batch_size=64", "trainer.steps_per_generation=2"], "can not both be set"),
    (["trainer.generation_batch_size=40"], "must be divisible by the global batch"),
    (["trainer.eval_strategy=steps", "trainer.per_device_eval_batch_size=3"],
     "must be divisible by the 4 generations per prompt used for evaluation"),
    (["trainer.auto_find_batch_size=true"], "trainer.auto_find_batch_size is not supported by GRPO"),
    (["trainer.log_completions_hub_repo=me/completions"], "trainer.log_completions is false"),
    (["trainer.vllm_importance_sampling_clip_min=3.0"], "must be below trainer.vllm_importance_sampling_clip_max=3.0"),
    (["trainer.vllm_tensor_parallel_size=2"], "'trainer.vllm_tensor_parallel_size' is set by grpo-launch"),
    (["trainer.deepspeed=ds.json"], "'trainer.deepspeed' is set by grpo-launch from zero"),
    (["trainer.seed=3"], "'trainer.seed' is set by grpo-launch from seed"),
    # rewards, data, model, secrets
    (["rewards=[{fn:acuracy}]"], "unknown built-in reward 'acuracy'; did you mean 'accuracy'?"),
    (["rewards=[]"], "the recipe has no reward function"),
    (["rewards=[{fn:'my.mod:'}]"], "is not 'module:function'"),
    (["rewards=[{fn:sevens,wieght:2}]"], "unknown key 'rewards[0].wieght'; did you mean 'rewards[0].weight'?"),
    (["data.path=sevn"], "unknown built-in task 'sevn'; did you mean 'sevens'?"),
    (["data.source=files", "data.path=prompts.txt"], "is not a .jsonl/.json/.parquet/.csv file"),
    (["model.name_or_path=builtin:tinny"], "did you mean 'builtin:tiny'?"),
    (["env.set.HF_TOKEN=abc"], "looks like a secret"),
    # missing required values
    (["model.name_or_path=???"], "missing required value 'model.name_or_path'"),
    (["data.path=???"], "missing required value 'data.path'"),
    # malformed override syntax
    (["foo"], "malformed override 'foo'"),
    (["trainer.learning_rate=[1"], "malformed override"),
    (["zero=2,3"], "sweeps"),
    (["~model"], "the model group always has one option"),
    (["+zero=2"], "the zero group always has one option"),
    (["hydra.run.dir=x"], "hydra.* settings are managed by grpo-launch"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_PLAN_INPUTS, ids=[" ".join(o) for o, _ in BAD_PLAN_INPUTS])
def test_bad_plan_input(overrides, message, capsys):
    assert main(["plan", *overrides]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""


def test_bad_input_through_the_real_entry_point(tmp_path):
    result = grpo("plan", "trainer.learnig_rate=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "did you mean 'trainer.learning_rate'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_unknown_cli_option_is_a_usage_error(capsys):
    assert main(["plan", "--bogus-flag"]) == 2
    assert "No such option" in capsys.readouterr().err


def _user_recipe(tmp_path, name: str, body: str):
    d = tmp_path / "mine"
    (d / "recipe").mkdir(parents=True)
    (d / "recipe" / f"{name}.yaml").write_text(body)
    return d


BAD_RECIPE_FILES = [
    ("# @package _global_\ntrainer:\n  learnig_rate: 1.0\n", "did you mean 'trainer.learning_rate'?"),
    ("# @package _global_\nvllm:\n  sleep_levl: 2\n", "did you mean 'vllm.sleep_level'?"),
    ("# @package _global_\ncluster:\n  nodes: many\n", "'cluster.nodes' must be an integer"),
    ("# @package _global_\ndefaults:\n  - override /zero: '9'\n", "cannot compose the recipe"),
    ("# @package _global_\ntrainer: [unclosed\n", "cannot compose the recipe"),
    ("# @package _global_\ndescription: ${nowhere}\n", "cannot compose the recipe"),
]


@pytest.mark.parametrize(("body", "message"), BAD_RECIPE_FILES)
def test_bad_user_recipe_file(tmp_path, body, message, capsys):
    d = _user_recipe(tmp_path, "broken", body)
    assert main(["plan", "recipe=broken", "--recipes-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_missing_recipes_dir(tmp_path, capsys):
    assert main(["plan", "--recipes-dir", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_bad_recipes_path_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_RECIPES_PATH", str(tmp_path / "nope"))
    assert main(["recipes"]) == 2
    assert "GRPO_RECIPES_PATH names" in capsys.readouterr().err


def test_recipes_new_refuses_to_overwrite(tmp_path, capsys):
    assert main(["recipes", "new", "mine", "--from", "tiny-cpu", "--to", str(tmp_path)]) == 0
    before = (tmp_path / "recipe" / "mine.yaml").read_text()
    assert main(["recipes", "new", "mine", "--from", "qwen7b-server", "--to", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "recipe" / "mine.yaml").read_text() == before


def test_recipes_new_from_unknown(tmp_path, capsys):
    assert main(["recipes", "new", "mine", "--from", "qwen7b-sever", "--to", str(tmp_path)]) == 2
    assert "did you mean 'qwen7b-server'?" in capsys.readouterr().err
    assert not (tmp_path / "recipe").exists()


def test_recipes_show_unknown(capsys):
    assert main(["recipes", "show", "tiny-cpuu"]) == 2
    assert "did you mean 'tiny-cpu'?" in capsys.readouterr().err
