"""The seeds' recipes resolve to the layouts the issue asks for."""

from conftest import grpo, plan_json


def test_qwen72b_colocate_layout():
    plan = plan_json("recipe=qwen72b-colocate")
    assert (plan["nodes"], plan["gpus_per_node"], plan["placement"]) == (4, 8, "colocate")
    trainers = [p for p in plan["processes"] if p["role"] == "trainer"]
    assert [p["node"] for p in trainers] == [0, 1, 2, 3]
    assert sorted(r for p in trainers for r in p["ranks"]) == list(range(32))
    assert all(p["gpus"] == list(range(8)) for p in trainers)
    assert not [p for p in plan["processes"] if p["role"] == "vllm"]  # vLLM lives inside the ranks
    tp = plan["vllm"]["tensor_parallel_size"]
    assert 8 % tp == 0 and tp > 1
    assert plan["vllm"]["colocated"]["sleep_level"] == 2
    assert plan["trainer_args"]["vllm_enable_sleep_mode"] is True
    assert {g for e in plan["engines"] for g in e["gpus"]} == set(range(8))
    assert sorted(r for e in plan["engines"] for r in e["ranks"]) == list(range(32))
    ds = plan["files"]["deepspeed.json"]["zero_optimization"]
    assert plan["zero_stage"] == 3 and ds["stage"] == 3
    assert ds["offload_optimizer"]["device"] == "cpu"
    assert ds["contiguous_gradients"] is True and ds["overlap_comm"] is True


def test_qwen7b_server_disjoint_gpus_one_node():
    plan = plan_json("recipe=qwen7b-server")
    (vllm,) = [p for p in plan["processes"] if p["role"] == "vllm"]
    (trainer,) = [p for p in plan["processes"] if p["role"] == "trainer"]
    assert vllm["node"] == trainer["node"] == 0
    assert not set(vllm["gpus"]) & set(trainer["gpus"])
    assert vllm["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, vllm["gpus"]))
    assert vllm["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    argv = vllm["argv"]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Math-7B"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == str(len(vllm["gpus"]))
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--max-logprobs") + 1] == "-1"
    assert plan["trainer_args"]["vllm_server_base_url"] == f"http://127.0.0.1:{vllm['port']}"
    assert trainer["depends_on"] == ["vllm"]


def test_cli_lists_eight_recipes():
    out = grpo("recipes", env={"COLUMNS": "200"}).stdout
    names = ["qwen1.5b-colocate", "qwen1.5b-server", "qwen7b-colocate", "qwen7b-server", "qwen72b-colocate",
             "qwen72b-server", "qwen1.5b-async-lora", "tiny-cpu"]
    assert all(n in out for n in names)
