"""Every user mistake gets a clear error naming the key, exit code 2, no traceback, and nothing written."""

import json

import pytest
from conftest import free_port, grpo

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
    (["placement.colocate.sleep_level=3"], "'placement.colocate.sleep_level' must be one of 0, 1, 2"),
    (["launcher=torchrn"], "'launcher' must be one of accelerate, torchrun; got 'torchrn'; did you mean 'torchrun'?"),
    (["trainer.lr_scheduler_type=cosin"], "did you mean 'cosine'?"),
    (["trainer.max_prompt_length=512"], "removed in TRL 0.28"),
    (["vllm.port=70000"], "'vllm.port' must be <= 65535"),
    # impossible layouts
    (["recipe=qwen72b-colocate", "placement.colocate.sleep_level=1"], "'s colocate sleep mode always uses level 2"),
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=3"], "must divide the 8 trainer ranks of a node"),
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=16"], "needs vllm.tensor_parallel_size=16 GPUs"),
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=8"], "no GPU is left for the trainer"),
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=8"], "does not split Qwen/Qwen2.5-Math-7B's 28 attention"),
    (["recipe=qwen7b-server", "placement.trainer_nodes=5"], "the cluster has 1 node"),
    (["recipe=qwen1.5b-async-lora", "lora.enabled=false"], "placement async-lora syncs a LoRA adapter"),
    (["recipe=qwen1.5b-async-lora", "zero=3"], "FSDP2 only"),
    (["recipe=qwen1.5b-async-lora", "launcher=torchrun"], "async-lora needs launcher=accelerate"),
    (["recipe=qwen1.5b-async-lora", "placement.async_lora.max_loras=4"],
     "must be at least trainer.max_staleness + 2 = 6"),
    (["recipe=qwen1.5b-async-lora", "placement.async_lora.max_lora_rank=4"], "not a rank vLLM accepts"),
    (["recipe=qwen1.5b-async-lora", "lora.r=16", "placement.async_lora.max_lora_rank=8"], "is below lora.r=16"),
    (["recipe=qwen1.5b-async-lora", "placement.async_lora.replicas=9"], "do not fit"),
    (["recipe=qwen1.5b-async-lora", "lora.target_modules=[lm_head]"], "cannot serve adapters on the output head"),
    (["recipe=qwen1.5b-async-lora", "placement.async_lora.proxy.port=8000"], "port 8000 on node 0 is wanted by both"),
    (["recipe=qwen7b-server", "run.main_process_port=8000"], "port 8000 on node 0 is wanted by both"),
    (["placement=server"], "vllm.enabled=false"),
    (["recipe=tiny-cpu-colocate", "placement.colocate.sleep_level=2"],
     "vLLM has no sleep mode on cluster.accelerator=cpu"),
    (["recipe=tiny-cpu-async-lora", "vllm.block_size=16"], "takes KV-cache blocks of a multiple of 32 tokens"),
    (["recipe=tiny-cpu-async-lora", "cluster.gpus_per_node=4"],
     "async-lora on cluster.accelerator=cpu trains in 1 process"),
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
    (["recipe=tiny-cpu-async-lora", "cluster.nodes=2", "cluster.gpus_per_node=1", "placement.async_lora.replicas=1",
      "placement.async_lora.proxy.port=8000"],
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
    # numbers are finite; sizes are bounded by what exists
    (["cluster.gpu_memory_gib=inf"], "'cluster.gpu_memory_gib' must be a finite number, got inf"),
    (["recipe=qwen72b-colocate", "cluster.gpu_memory_gib=nan"], "must be a finite number, got nan"),
    (["cluster.gpus_per_node=100000"], "'cluster.gpus_per_node' must be <= 64"),
    (["cluster.nodes=1000000000000"], "'cluster.nodes' must be <= 1024"),
    (["seed=4294967296"], "'seed' must be <= 4294967295"),
    (["model.tiny.hidden_size=1000000"], "'model.tiny.hidden_size' must be <= 4096"),
    # TRL's values, where TRL (or torch, transformers, vLLM under it) refuses them or trains wrongly
    (["trainer.learning_rate=-1"], "'trainer.learning_rate' must be > 0, got -1: torch's optimizers refuse"),
    (["trainer.learning_rate=0"], "'trainer.learning_rate' must be > 0"),
    (["trainer.per_device_train_batch_size=0"], "'trainer.per_device_train_batch_size' must be >= 1, got 0"),
    (["trainer.max_steps=0"], "'trainer.max_steps' must be >= 1, got 0: or -1"),
    (["trainer.temperature=0"], "'trainer.temperature' must be > 0"),
    (["trainer.adam_beta2=1.0"], "'trainer.adam_beta2' must be < 1"),
    (["trainer.top_p=1.5"], "'trainer.top_p' must be <= 1"),
    (["trainer.beta=-0.1"], "'trainer.beta' must be >= 0"),
    (["trainer.learning_rate=nan"], "'trainer.learning_rate' must be a finite number, got nan"),
    (["trainer.vllm_importance_sampling_clip_max=inf"], "must be a finite number, got inf"),
    # a key added with + or ++ must exist (OmegaConf would add it, and the typed config drop it); only free-form
    # mappings lose keys
    (["+foo.bar=3"], "unknown key 'foo.bar'"),
    (["+vllm.tensor_paralel_size=2"], "unknown key 'vllm.tensor_paralel_size'; did you mean "
                                      "'vllm.tensor_parallel_size'?"),
    (["++lora.rnak=2"], "did you mean 'lora.r'?"),
    (["~vllm"], "'~vllm': vllm is a key of the schema, which cannot be removed"),
    (["~seed"], "cannot be removed"),
    # what vLLM serves holds a prompt and a completion; its CPU build has kernels for some head sizes only
    (["recipe=tiny-cpu-colocate", "vllm.max_model_len=16", "trainer.max_completion_length=64"],
     "trainer.max_completion_length=64 leaves no room for a prompt in vllm.max_model_len=16"),
    (["recipe=qwen7b-server", "trainer.max_completion_length=4096"],
     "leaves no room for a prompt in vllm.max_model_len=4096 (vllm.max_model_len=4096 is set by recipe "
     "qwen7b-server)"),
    (["recipe=qwen7b-server", "vllm.max_model_len=null", "trainer.max_completion_length=4096"],
     "leaves no room for a prompt in the model's context of 4096 tokens"),
    (["recipe=qwen7b-server", "vllm.max_model_len=100000"],
     "vllm.max_model_len=100000 (set on the command line) is beyond Qwen/Qwen2.5-Math-7B's context of 4096 tokens"),
    (["recipe=tiny-cpu-colocate", "vllm.max_model_len=200"], "beyond model.tiny.max_position_embeddings of 128"),
    (["recipe=tiny-cpu-colocate", "model.tiny.hidden_size=32"],
     "the tiny model's head size (hidden_size / num_heads = 32 / 2 = 16) is one vLLM's CPU attention cannot serve"),
    (["recipe=tiny-cpu-server", "model.tiny.num_heads=4"], "with hidden_size=64: num_heads=1 or 2"),
    (["model.tiny.num_heads=3"], "model.tiny.num_heads=3 (set on the command line) does not divide "
                                 "model.tiny.hidden_size=64"),
    (["model.tiny.num_heads=4", "model.tiny.num_kv_heads=3"], "does not divide model.tiny.num_heads=4"),
    # hosts are hostnames or addresses
    (["recipe=qwen72b-colocate", "cluster.hosts=[a b,h1,h2,h3]"], "cluster.hosts[0] 'a b' is neither a hostname "
                                                                 "nor an IP address"),
    (["recipe=qwen72b-colocate", "cluster.hosts=[h0:22,h1,h2,h3]"], "'h0:22' is neither"),
    (["recipe=qwen72b-colocate", "cluster.hosts=[h0,'',h2,h3]"], "cluster.hosts[1] '' is neither"),
    (["recipe=qwen72b-colocate", "cluster.hosts=[h0,h1,'$(reboot)',h3]"], "'$(reboot)' is neither"),
    # reward files are imported by their file name, from one folder
    (["rewards=[{fn:a/score.py:f},{fn:b/score.py:f}]"], "rewards[0].fn and rewards[1].fn are both files named "
                                                        "score.py"),
    (["rewards=[{fn:my-rewards.py:f}]"], "whose name 'my-rewards' is not a Python module name"),
    # malformed override syntax
    (["foo"], "malformed override 'foo'"),
    (["trainer.learning_rate=[1"], "malformed override"),
    (["zero=2,3"], "sweeps"),
    (["~model"], "the model group always has one option"),
    (["+zero=2"], "the zero group always has one option"),
    (["hydra.run.dir=x"], "hydra.* settings are managed by grpo-launch"),
    (["env.set.A=" + "[" * 5000 + "]" * 5000], "nests lists, mappings or calls 5000 deep; at most 32"),
    (["trainer.a=" + "{a:" * 40 + "1" + "}" * 40], "nests lists, mappings or calls 40 deep"),
    # user text is never rich markup: the brackets stay
    (["description=[bold]x"], "malformed override 'description=[bold]x'"),
    (["[/]"], "malformed override '[/]'"),
    (["recipe=qwen72b-colocate", "cluster.hosts=['[/]',h1,h2,h3]"], "(cluster.hosts=[[/],h1,h2,h3] is set on"),
    (["recipe=qwen72b-colocate", "cluster.hosts=[h0,[/],h2,h3]"], "'cluster.hosts[1]' must be a string, got ['/']"),
    (["env.passthrough=[A,[B]]"], "'env.passthrough[1]' must be a string, got ['B']"),
    (["env.set.A=[1]"], "'env.set.A' must be a string"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_PLAN_INPUTS, ids=[" ".join(o) for o, _ in BAD_PLAN_INPUTS])
def test_bad_plan_input(overrides, message, capsys):
    assert main(["plan", *overrides]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""


MOVED_KEYS = [("vllm.sleep_level=2", "placement.colocate.sleep_level"),
              ("vllm.group_port=5000", "placement.server.group_port"),
              ("vllm.data_parallel_size=4", "placement.async_lora.replicas"),
              ("vllm.max_loras=8", "placement.async_lora.max_loras"),
              ("proxy.port=9000", "placement.async_lora.proxy.port"),
              ("proxy.api_key_env=KEY", "placement.async_lora.proxy.api_key_env")]


@pytest.mark.parametrize(("override", "new"), MOVED_KEYS, ids=[o for o, _ in MOVED_KEYS])
def test_a_moved_key_names_its_new_place(override, new, capsys):
    assert main(["plan", override]) == 2
    err = capsys.readouterr().err
    assert f"unknown key '{override.partition('=')[0]}': it moved; did you mean '{new}'?" in err


def test_independent_mistakes_are_reported_together(capsys):
    """Five rules the tiny CPU recipe breaks as async-lora, each independent of the others: one round to fix them,
    not five."""
    assert main(["plan", "placement=async-lora"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 5
    for fragment in ("not a field of AsyncGRPOConfig", "placement async-lora cannot evaluate", "but vllm.enabled=false",
                     "but lora.enabled=false", "no GPU is left for the trainer"):
        assert fragment in err


def test_every_bound_and_trainer_field_is_checked_at_once(capsys):
    assert main(["plan", "cluster.nodes=0", "vllm.port=70000", "trainer.learning_rate=-1",
                 "trainer.learnig_rate=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 4
    for fragment in ("'cluster.nodes' must be >= 1", "'vllm.port' must be <= 65535", "'trainer.learning_rate' must "
                     "be > 0", "did you mean 'trainer.learning_rate'?"):
        assert fragment in err


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
    ("# @package _global_\nplacement:\n  colocate:\n    sleep_levl: 2\n",
     "did you mean 'placement.colocate.sleep_level'?"),
    ("# @package _global_\nvllm:\n  sleep_level: 2\n", "unknown key 'vllm.sleep_level': it moved; did you mean "
                                                       "'placement.colocate.sleep_level'?"),
    ("# @package _global_\nproxy:\n  port: 9000\n", "unknown key 'proxy': it moved; did you mean "
                                                    "'placement.async_lora.proxy'?"),
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


RECIPE_INCLUDES = {
    "itself": "defaults:\n  - /recipe/broken@_here_\n",
    "itself, relatively": "defaults:\n  - broken\n",
    "another recipe": "defaults:\n  - /recipe/tiny-cpu\n",
    "another recipe, relatively": "defaults:\n  - tiny-cpu\n",
    "the recipe group": "defaults:\n  - /recipe: tiny-cpu\n",
    "the recipe group, overridden": "defaults:\n  - override /recipe: tiny-cpu\n",
}


@pytest.mark.parametrize("defaults", RECIPE_INCLUDES.values(), ids=list(RECIPE_INCLUDES))
def test_a_recipe_includes_no_recipe(tmp_path, defaults, capsys):
    d = _user_recipe(tmp_path, "broken", "# @package _global_\n" + defaults)
    assert main(["plan", "recipe=broken", "--recipes-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert "includes a recipe in its defaults list" in err and "Traceback" not in err


def test_a_group_option_including_itself_is_an_error(tmp_path, capsys):
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "loop.yaml").write_text("defaults:\n  - loop\n")
    assert main(["plan", "cluster=loop", "--recipes-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Hydra recursed without end" in err and "Traceback" not in err


def test_a_sweep_is_bounded_before_it_is_listed(capsys):
    assert main(["plan", "-m", "seed=range(0,100000000000)"]) == 2
    assert "'seed=range(0,100000000000)' sweeps 100,000,000,000 values; a sweep plans at most 1000" in \
        capsys.readouterr().err
    assert main(["plan", "-m", "seed=shuffle(range(0,100000000000))"]) == 2
    assert main(["plan", "-m", "seed=range(0,40)", "trainer.learning_rate=range(1,40)"]) == 2
    assert "the sweep has 1,560 combinations (40 x 39); it plans at most 1,000" in capsys.readouterr().err
    assert main(["plan", "-m", "--json", "seed=range(0,3)", "--max-combinations", "2"]) == 2
    assert "--max-combinations" in capsys.readouterr().err
    assert main(["plan", "-m", "--json", "seed=range(0,3)", "--max-combinations", "3"]) == 0


@pytest.mark.parametrize("grace", ["-5", "nan", "inf", "601"])
@pytest.mark.parametrize("command", [["run", "--dry-run"], ["rehearse"]])
def test_grace_is_a_bounded_number_of_seconds(command, grace, capsys):
    assert main([*command, "--grace", grace]) == 2
    assert "Invalid value for '--grace'" in capsys.readouterr().err


def test_recipes_lists_refuse_an_unreadable_file_by_name(tmp_path, capsys):
    d = _user_recipe(tmp_path, "broken", "description: x\nfoo: [unclosed\n")
    assert main(["recipes", "--recipes-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"recipe file {d / 'recipe' / 'broken.yaml'} cannot be read: expected ',' or ']'" in err
    assert "line 3, column 1" in err and "Traceback" not in err
    (d / "recipe" / "broken.yaml").write_bytes(b"description: \xc3\x28\n")
    assert main(["recipes", "--recipes-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml cannot be read: " in err and "Traceback" not in err


def test_recipes_list_shows_descriptions_as_written(tmp_path, capsys):
    d = _user_recipe(tmp_path, "marked", "# @package _global_\ndescription: 'a [/] b [bold]c[/bold]'\n")
    assert main(["recipes", "--recipes-dir", str(d)]) == 0
    assert "a [/] b [bold]c[/bold]" in capsys.readouterr().out


def test_recipes_new_refuses_to_shadow_unless_forced(tmp_path, capsys):
    user = tmp_path / "xdg" / "grpo-launch" / "recipes"
    assert main(["recipes", "new", "tiny-cpu", "--from", "qwen7b-server"]) == 2
    err = capsys.readouterr().err
    assert "recipe 'tiny-cpu' exists already: the copy would shadow" in err and "the embedded default" in err
    assert not user.exists()
    assert main(["recipes", "new", "tiny-cpu", "--from", "qwen7b-server", "--force"]) == 0
    assert "note: the copy would shadow" in capsys.readouterr().out
    assert (user / "recipe" / "tiny-cpu.yaml").is_file()
    # a directory later on the search path: the copy would be shadowed by the user's recipe
    assert main(["recipes", "--recipes-dir", str(user), "new", "tiny-cpu", "--from", "qwen7b-server",
                 "--to", str(tmp_path / "later")]) == 2
    assert "already exists" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["[x]", "a b", ".x", "recipe=x", "a/b", ""])
def test_recipes_new_takes_names_recipe_can_select(tmp_path, name, capsys):
    assert main(["recipes", "new", name, "--from", "tiny-cpu", "--to", str(tmp_path)]) == 2
    assert "is not a usable recipe name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_run_directory_that_cannot_be_written_is_refused_before_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    for command in (["run", "--dry-run"], ["run"]):
        assert main([*command, f"run.root={tmp_path / 'afile'}"]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'afile'} is not a directory (run.root={tmp_path / 'afile'} is set on the command " \
               f"line)" in err
        assert main([*command, f"run.dir={tmp_path / 'afile' / 'run'}"]) == 2
        assert "hint: set run.dir to a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "xdg"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_failed_write_is_an_error_of_the_run_directory(tmp_path, monkeypatch):
    from grpo_launch.compose import compose
    from grpo_launch.errors import UserError
    from grpo_launch.materialize import materialize
    from grpo_launch.plan import build_plan

    composed = compose([f"run.dir={tmp_path / 'run'}"])

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("grpo_launch.materialize.write_files", full)
    with pytest.raises(UserError, match="cannot write the run directory .*: No space left on device"):
        materialize(composed, build_plan(composed), [])
    assert not (tmp_path / "run").exists()


def _written_run(tmp_path, *overrides):
    """A run directory as `grpo run` writes it, without starting anything."""
    from grpo_launch.compose import compose
    from grpo_launch.materialize import materialize
    from grpo_launch.plan import build_plan

    composed = compose([f"run.root={tmp_path / 'runs'}", f"run.main_process_port={free_port()}", *overrides])
    return materialize(composed, build_plan(composed), [])


@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: (d / "config.yaml").unlink(), "is not a grpo-launch run directory (no config.yaml)"),
    (lambda d: (d / "overrides.yaml").unlink(), "is not a grpo-launch run directory (no overrides.yaml)"),
    (lambda d: (d / "overrides.yaml").write_text("overrides: [\n"), "overrides.yaml cannot be read: expected"),
    (lambda d: (d / "overrides.yaml").write_text("42\n"), "overrides.yaml is not the overrides.yaml `grpo run` "
                                                           "writes"),
    (lambda d: (d / "overrides.yaml").write_text("recipe: x\noverrides: 3\nrecipes_dirs: []\n"), "is not the"),
    (lambda d: (d / "config.yaml").write_bytes(b"\xff"), "config.yaml cannot be read"),
])
def test_resume_refuses_a_damaged_run_directory(tmp_path, damage, message, capsys):
    run_dir = _written_run(tmp_path)
    damage(run_dir)
    assert main(["run", "--resume", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_resume_adds_overrides_to_the_stored_ones(tmp_path, capsys):
    run_dir = _written_run(tmp_path, "seed=7", "trainer.max_steps=16")
    assert main(["run", "--resume", str(run_dir), "--dry-run", "trainer.max_steps=20"]) == 2
    err = capsys.readouterr().err
    assert "the config changed since" in err and "trainer.max_steps: 16 -> 20" in err and "seed" not in err
    assert main(["run", "--resume", str(run_dir), "--dry-run", "--force", "trainer.max_steps=20",
                 "--from-scratch"]) == 0  # tiny-cpu saves no checkpoint
    out = capsys.readouterr().out
    assert "seed: 7" in out and "max_steps: 20" in out  # the stored seed=7 is kept
    assert "- seed=7\n- trainer.max_steps=16\n- trainer.max_steps=20" in out
    assert main(["run", "--resume", str(run_dir), "--dry-run", "seed=7", "--from-scratch"]) == 0  # no change


@pytest.mark.parametrize("override", ["recipe=qwen7b-server", "scheduler=slurm", "scheduler.kind=slurm",
                                      "run.dir=/tmp/elsewhere", "run.root=/tmp/elsewhere"])
def test_resume_keeps_the_recipe_scheduler_and_run_directory(tmp_path, override, capsys):
    run_dir = _written_run(tmp_path)
    assert main(["run", "--resume", str(run_dir), "--dry-run", "--force", override]) == 2
    err = capsys.readouterr().err
    assert f"--resume continues {run_dir} with {override.partition('=')[0]}=" in err
    assert "keeps its recipe, scheduler and run directory" in err


USER_FILE_INPUTS = [
    # (overrides, files to write first, what `grpo run` and `--dry-run` say)
    (["rewards=[{fn:missing.py:score}]"], {}, "rewards[0].fn names missing.py, which does not exist "
                                              "(rewards[0].fn=missing.py:score is set on the command line)"),
    (["rewards=[{fn:broken.py:score}]"], {"broken.py": "def score(:\n"}, "names broken.py, which does not compile "
                                                                          "at line 1"),
    (["rewards=[{fn:other.py:score}]"], {"other.py": "def scores(**k):\n    return []\n"},
     "names score in other.py, which defines no score"),
    (["rewards=[{fn:no_such_package.rewards:score}]"], {}, "names module no_such_package.rewards, which is not "
                                                           "installed here"),
    (["rewards=[{fn:grpo_launch.trainer.rewards:nothing}]"], {}, "which defines no nothing"),
    (["data.source=files", "data.path=missing.jsonl"], {}, "missing.jsonl matches no file"),
    (["data.source=files", "data.path=q.jsonl"], {"q.jsonl": '{"question": "1+1", "answer": "2"}\n'},
     "data.prompt_column 'prompt' is not a column of"),
    (["data.source=files", "data.path=q.csv", "data.prompt_column=question", "data.answer_column=solution"],
     {"q.csv": "question,answer\n1+1,2\n"}, "data.answer_column 'solution' is not a column of"),
    (["recipe=tiny-cpu-colocate", "data.source=files", "data.path=long.jsonl"],
     {"long.jsonl": json.dumps({"prompt": "1" * 200}) + "\n"},
     "the longest prompt of data.path (row 1 of"),
    (["model.name_or_path=./no-model"], {}, "no-model does not exist"),
    (["model.name_or_path=./empty"], {"empty/README": ""}, "empty holds no config.json"),
]


@pytest.mark.parametrize(("overrides", "files", "message"), USER_FILE_INPUTS,
                         ids=[" ".join(o) for o, _, _ in USER_FILE_INPUTS])
def test_user_files_are_checked_by_run_and_dry_run_and_left_by_plan(tmp_path, monkeypatch, overrides, files,
                                                                    message, capsys):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    before = sorted(tmp_path.rglob("*"))
    for command in (["run", "--dry-run"], ["run"], ["rehearse"]):
        assert main([*command, "run.root=runs", *overrides]) == 2, command
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert main(["plan", *overrides]) == 0
    assert "left to grpo run (it reads your files)" in capsys.readouterr().out
    assert main(["plan", "--json", *overrides]) == 0
    assert json.loads(capsys.readouterr().out)["left_to_run"]


def test_a_files_dataset_error_says_where_the_column_was_set(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    d = _user_recipe(tmp_path, "mine", "# @package _global_\ndefaults:\n  - override /placement: colocate\n"
                                       "data:\n  source: files\n  path: q.jsonl\n  prompt_column: problem\n"
                                       "rewards:\n  - fn: sevens\nvllm:\n  enabled: false\n")
    assert main(["run", "--dry-run", "recipe=mine", "--recipes-dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"data.prompt_column 'problem' is not a column of {tmp_path / 'q.jsonl'} (row 1 has question, answer)" \
           in err
    assert "(data.prompt_column=problem is set by recipe mine)" in err


def test_dry_run_prints_user_text_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "[/]x [bold]y"
    assert main(["run", "--dry-run", f"run.root='{root}'", "description='[/] [bold]z'",
                 "env.set.FOO='[red]v[/]'", f"run.main_process_port={free_port()}"]) == 0
    out = capsys.readouterr().out
    assert f"would write {root}/tiny-cpu/" in out and "FOO='[red]v[/]'" in out and "[/] [bold]z" in out
    assert not root.exists()


def test_the_run_summary_prints_paths_as_written(tmp_path):
    from rich.console import Console

    from grpo_launch.cli.launching import _finish

    console = Console(record=True, width=200)
    _finish(tmp_path / "[/]run [bold]x", 1, console, [])
    assert f"failed run directory: {tmp_path / '[/]run [bold]x'}" in console.export_text()


def test_dry_run_runs_the_checks_of_the_machine(tmp_path, monkeypatch, capsys):
    """What `grpo run` checks on this machine before it starts anything, `--dry-run` checks too."""
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["run", "--dry-run", f"run.main_process_port={port}"]) == 2
    assert f"port {port} (the trainer rendezvous) is already in use" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    assert main(["run", "--dry-run", f"run.main_process_port={free_port()}"]) == 2
    assert "grpo-launch is running as a torch worker" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [] or [p.name for p in tmp_path.iterdir()] == ["xdg"]


def test_a_local_tokenizer_counts_a_files_dataset_prompts(tmp_path, monkeypatch, capsys):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    from grpo_launch.contracts import tiny

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny.config_json(hidden_size=64, num_layers=1, num_heads=2,
                                                                   num_kv_heads=1, max_position_embeddings=128)))
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "word": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(model / "tokenizer.json"))
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": " ".join(["word"] * 60)}) + "\n")
    overrides = ["recipe=tiny-cpu-colocate", "model.name_or_path=./m", "data.source=files", "data.path=p.jsonl"]
    assert main(["run", "--dry-run", *overrides]) == 2  # 60 words, 60 tokens: 56 fit beside 8 in 64
    assert "takes 60 tokens, and vLLM serves only 56 beside the completion" in capsys.readouterr().err
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": " ".join(["word"] * 56)}) + "\n")
    assert main(["run", "--dry-run", *overrides, f"run.main_process_port={free_port()}"]) == 0


@pytest.mark.parametrize("overrides", [["recipe=qwen7b-server", "cluster.gpu_type='[/]x [bold]y'"],
                                       ["recipe=qwen7b-server", "trainer.run_name='[/]x [bold]y'"],
                                       ["recipe=qwen7b-server", "vllm.extra_args=['--x=[/]x [bold]y']"]])
def test_plan_prints_user_text_as_written(overrides, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # no cell wraps
    assert main(["plan", *overrides]) == 0
    assert "[/]x [bold]y" in capsys.readouterr().out
