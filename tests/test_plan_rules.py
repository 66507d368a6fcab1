"""Layout rules, commands and generated files of the plan."""

import json
import subprocess
import sys

import pytest
from conftest import grpo, plan_json

from grpo_launch.plan.placements.async_lora import _lora_rank_slot


def _procs(plan, role):
    return [p for p in plan["processes"] if p["role"] == role]


def test_qwen72b_server_uses_a_fifth_node_for_vllm():
    plan = plan_json("recipe=qwen72b-server")
    (vllm,) = _procs(plan, "vllm")
    assert (vllm["node"], vllm["gpus"]) == (4, [4, 5, 6, 7])
    assert vllm["argv"][vllm["argv"].index("--host") + 1] == "0.0.0.0"
    trainers = _procs(plan, "trainer")
    assert [t["node"] for t in trainers] == [0, 1, 2, 3] and plan["world_size"] == 32
    # No cluster.hosts on GPUs: each node's address is read where the job runs (GRPO_HOST_K).
    assert plan["trainer_args"]["vllm_server_base_url"] == "http://${GRPO_HOST_4}:8000"
    assert plan["trainer_args"]["vllm_group_port"] == 51216
    assert any("4 GPU(s) idle: node 4 GPU 0" in w for w in plan["warnings"])
    assert [t["argv"][t["argv"].index("--machine_rank") + 1] for t in trainers] == ["0", "1", "2", "3"]
    acc = plan["files"]["accelerate.yaml"]
    assert (acc["num_machines"], acc["num_processes"], acc["main_process_ip"]) == (4, 32, "${GRPO_HOST_0}")
    assert [t["argv"][t["argv"].index("--main_process_ip") + 1] for t in trainers] == ["${GRPO_HOST_0}"] * 4


def test_cluster_hosts_are_used_in_urls_and_rendezvous():
    hosts = "cluster.hosts=[10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5]"
    plan = plan_json("recipe=qwen72b-server", hosts)
    assert plan["trainer_args"]["vllm_server_base_url"] == "http://10.0.0.5:8000"
    assert plan["files"]["accelerate.yaml"]["main_process_ip"] == "10.0.0.1"


def test_async_lora_replicas_proxy_and_trainer():
    plan = plan_json("recipe=qwen1.5b-async-lora")
    replicas = _procs(plan, "vllm")
    assert len(replicas) == 6 and len({r["port"] for r in replicas}) == 6
    assert sorted(g for r in replicas for g in r["gpus"]) == [2, 3, 4, 5, 6, 7]
    for r in replicas:
        argv = r["argv"]
        assert "--data-parallel-size" not in argv
        assert "--enable-lora" in argv
        assert argv[argv.index("--max-loras") + 1] == "6"
        assert argv[argv.index("--max-lora-rank") + 1] == "1"
        assert argv[argv.index("--served-model-name") + 1] == "Qwen/Qwen2.5-Math-1.5B"
        assert r["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert [r["start_delay_s"] for r in replicas] == [0.0] + [10.0] * 5
    (proxy,) = _procs(plan, "proxy")
    assert proxy["depends_on"] == [r["name"] for r in replicas]
    urls = [proxy["argv"][i + 1] for i, a in enumerate(proxy["argv"]) if a == "--replica"]
    assert urls == [f"http://127.0.0.1:{r['port']}" for r in replicas]
    (trainer,) = _procs(plan, "trainer")
    assert trainer["depends_on"] == ["proxy"] and trainer["gpus"] == [0, 1]
    assert plan["trainer_class"] == "AsyncGRPOConfig"
    assert plan["trainer_args"]["vllm_server_base_url"] == f"http://127.0.0.1:{proxy['port']}"
    for key, value in {"token_budget": 16384, "gradient_checkpointing": False, "max_inflight_tasks": 384,
                       "max_staleness": 4}.items():
        assert plan["trainer_args"][key] == value
    acc = plan["files"]["accelerate.yaml"]
    assert acc["distributed_type"] == "FSDP" and acc["fsdp_config"]["fsdp_version"] == 2
    assert "deepspeed.json" not in plan["files"]


@pytest.mark.parametrize(("r", "slot"), [(1, 1), (2, 8), (8, 8), (9, 16), (300, 320), (512, 512)])
def test_smallest_vllm_lora_rank(r, slot):
    from grpo_launch.compose import compose

    config = compose(["recipe=qwen1.5b-async-lora", f"lora.r={r}"]).config
    assert _lora_rank_slot(config) == slot


def test_colocate_tp_groups_follow_trl():
    plan = plan_json("recipe=qwen7b-colocate")
    assert [e["ranks"] for e in plan["engines"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan["gpu_map"][0][3] == "train 3 + vllm 1 tp1"
    assert plan["vllm"]["max_num_seqs"] == 4 * 2 * 2  # P x TP x steps_per_generation (TRL's sizing)


def test_torchrun_launcher_passes_deepspeed_json_to_trl():
    plan = plan_json("recipe=qwen7b-server", "launcher=torchrun")
    (trainer,) = _procs(plan, "trainer")
    argv = trainer["argv"]
    assert argv[0] == "torchrun" and argv[argv.index("--nproc_per_node") + 1] == "6"
    assert argv[-4:] == ["-m", "grpo_launch.trainer", "--run-dir", "."]
    assert plan["trainer_args"]["deepspeed"] == "deepspeed.json"
    assert "deepspeed" not in plan_json("recipe=qwen7b-server")["trainer_args"]  # accelerate reads its config


def test_cpu_processes_use_multi_gpu_launch_not_cpu_flag():
    acc = plan_json()["files"]["accelerate.yaml"]
    # accelerate's --cpu / MULTI_CPU start ONE process on a CPU-only machine; MULTI_GPU starts them all.
    assert (acc["distributed_type"], acc["use_cpu"], acc["num_processes"]) == ("MULTI_GPU", False, 2)
    assert plan_json("cluster.gpus_per_node=1")["files"]["accelerate.yaml"]["distributed_type"] == "NO"
    (trainer,) = _procs(plan_json(), "trainer")
    assert trainer["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert plan_json()["trainer_args"]["use_cpu"] is True


def test_zero_stages_on_cpu():
    for option, stage in (("2", 2), ("3", 3), ("3-offload", 3)):
        plan = plan_json(f"zero={option}")
        ds = plan["files"]["deepspeed.json"]
        assert ds["zero_optimization"]["stage"] == stage
        assert ds["train_micro_batch_size_per_gpu"] == "auto"
        assert plan["files"]["accelerate.yaml"]["deepspeed_config"]["deepspeed_config_file"] == "deepspeed.json"
        if option == "3-offload":
            assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}


def test_reward_weights_and_seed():
    plan = plan_json("rewards=[{fn:sevens,weight:2.0},{fn:length_penalty,weight:0.5}]", "seed=7")
    assert plan["trainer_args"]["reward_weights"] == [2.0, 0.5]
    assert plan["trainer_args"]["seed"] == 7


def test_secrets_pass_by_name_only(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    plan = plan_json("recipe=qwen7b-server")
    assert "hf_secret_value_123" not in json.dumps(plan)
    assert all("HF_TOKEN" in p["pass_env"] for p in plan["processes"])
    assert "HF_TOKEN" in plan["files"]["launch.sh"] and "hf_secret" not in plan["files"]["launch.sh"]


@pytest.mark.parametrize("recipe", ["qwen1.5b-async-lora", "qwen72b-colocate"])
def test_plan_is_deterministic(recipe):
    """The same recipe gives the same plan in two processes with different hash seeds (no set or dict order
    leaks into it)."""
    outputs = [grpo("plan", f"recipe={recipe}", "--json", env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["recipe"] == recipe


@pytest.mark.parametrize("recipe", ["tiny-cpu", "qwen72b-colocate", "qwen7b-server", "qwen1.5b-async-lora"])
def test_launch_script_is_valid_bash(recipe, tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text(plan_json(f"recipe={recipe}")["files"]["launch.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_plan_imports_no_torch_trl_or_vllm():
    """Planning, the memory estimate, the advisor's search and sweeps stay pure: no heavy import."""
    code = ("import sys; from grpo_launch.cli import main\n"
            "for r in ('tiny-cpu', 'qwen72b-colocate', 'qwen7b-server', 'qwen1.5b-async-lora'):\n"
            "    assert main(['plan', 'recipe=' + r, '--json']) == 0\n"
            "assert main(['plan', 'recipe=qwen72b-colocate', 'zero=2', '--suggest', '--json']) == 2\n"
            "assert main(['plan', '-m', 'recipe=qwen7b-server,qwen7b-colocate', 'zero=2,3', '--json']) == 0\n"
            "heavy = sorted(m for m in ('torch', 'trl', 'vllm', 'transformers', 'deepspeed', 'aiohttp') "
            "if m in sys.modules)\n"
            "print('HEAVY', heavy, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stderr


def test_json_contract_keys():
    plan = json.loads(grpo("plan", "recipe=qwen72b-colocate", "--json").stdout)
    for key in ("recipe", "placement", "nodes", "gpus_per_node", "vllm", "zero_stage", "processes", "files",
                "trainer_args", "warnings"):
        assert key in plan
    for key in ("tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "colocated"):
        assert key in plan["vllm"]
    assert plan["vllm"]["colocated"]["sleep_level"] == 2
    for key in ("num_generations", "per_device_train_batch_size", "rounds"):
        assert key in plan["batch"]
    assert plan["sharding"] == "zero" and plan["trainer_inputs"]["max_steps"] == 200
    for p in plan["processes"]:
        assert {"name", "role", "node", "gpus", "argv", "env", "port"} <= set(p)
        assert p["role"] in ("trainer", "vllm", "proxy")
    assert {"deepspeed.json", "accelerate.yaml"} <= set(plan["files"])


def test_rich_view_and_dry_run():
    result = grpo("plan", "recipe=qwen7b-server", "--dry-run", env={"COLUMNS": "200"})
    assert result.returncode == 0
    out = result.stdout
    assert "vllm 0 tp1" in out and "train 5" in out
    assert "VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen2.5-Math-7B" in out
    assert '"stage": 3' in out and "#!/usr/bin/env bash" in out and "distributed_type: DEEPSPEED" in out


@pytest.mark.parametrize(("overrides", "message"), [
    (["recipe=qwen7b-colocate", "vllm.tensor_parallel_size=8"], "does not split Qwen/Qwen2.5-Math-7B's 28 attention "
                                                                "heads"),
    (["recipe=qwen7b-server", "vllm.tensor_parallel_size=7"], "Qwen2.5-Math-7B's 4 KV heads"),
    (["recipe=qwen1.5b-colocate", "vllm.tensor_parallel_size=8"], "Qwen2.5-Math-1.5B's 12 attention heads"),
])
def test_a_tensor_parallel_size_vllm_refuses_is_refused_at_plan_time(overrides, message):
    """vLLM refuses a TP size that does not split the attention heads (or the KV heads) only when its engine
    starts on the GPUs; the plan knows the model's shape."""
    result = grpo("plan", *overrides)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "a size vLLM accepts for this model: 1, 2, 4" in result.stderr and "Traceback" not in result.stderr


def test_tensor_parallel_sizes_that_split_the_heads_plan():
    assert plan_json("recipe=qwen72b-colocate")["vllm"]["tensor_parallel_size"] == 8  # 64 heads, 8 KV heads
    assert plan_json("recipe=qwen7b-colocate", "vllm.tensor_parallel_size=4")["vllm"]["tensor_parallel_size"] == 4


@pytest.mark.parametrize("eager", [True, False])
def test_the_colocated_engine_gets_vllm_enforce_eager_which_trls_call_leaves_out(eager):
    """TRL's LLM(...) in each rank passes no enforce_eager, so the knob was ignored under colocate: vLLM captured CUDA
    graphs the memory estimate left out, and on this CPU compiled the model for about 20 s a start. The plan carries
    it to the trainer, which adds it (and, where weights sync by reload, the model's dtype)."""
    from types import SimpleNamespace

    from grpo_launch.compose import compose
    from grpo_launch.plan import build_plan
    from grpo_launch.trainer.main import colocated_engine_args

    plan = build_plan(compose(["recipe=tiny-cpu-colocate", f"vllm.enforce_eager={str(eager).lower()}"]))
    args = SimpleNamespace(model_init_kwargs={"dtype": "float32"})
    assert colocated_engine_args(plan, args) == ({"enforce_eager": True} if eager else {}) | {"dtype": "float32"}
