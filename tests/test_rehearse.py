"""`grpo rehearse` / `grpo run --rehearse`, for real: the shipped GPU recipes' process graphs run small on this CPU
machine (real vLLM, real loopback nodes, real TRL), and a user's recipe whose reward function and dataset are
rehearsed on real completions, or fail the rehearsal naming the process, the rank and the step."""

import json
import os
import re
from pathlib import Path

import pytest
from conftest import RUN_ENV, free_ports, grpo
from engine import final_metrics, total

from grpo_launch.contracts.rundir import read_metrics

pytestmark = pytest.mark.slow
USER_RECIPE = """\
# @package _global_
# A user's recipe for 8 H100s: its own prompts file and reward function.
defaults:
  - override /cluster: 1x8-h100-80gb
  - override /model: qwen2.5-math-1.5b
  - override /placement: colocate
  - override /zero: "2"
description: my sums, exact-match reward
data:
  source: files
  path: sums.jsonl
  prompt_column: question
  answer_column: answer
rewards:
  - fn: my_rewards.py:exact
vllm:
  enabled: false
trainer:
  per_device_train_batch_size: 8
  num_generations: 8
  max_completion_length: 256
  max_steps: 300
  report_to: none
"""
REWARDS = """\
def exact(completions, solution, **kwargs):
    return [float(c.strip().startswith(s)) for c, s in zip(completions, solution)]
"""
BROKEN_REWARDS = """\
def exact(completions, solution, **kwargs):
    raise ValueError(f"cannot score {completions[0]!r}")
"""


def rehearse(tmp_path: Path, *args: str, env: dict | None = None, via_run: bool = False):
    command = ("run", "--rehearse") if via_run else ("rehearse",)
    result = grpo(*command, f"run.root={tmp_path / 'runs'}", *args, *free_ports(*args),
                  env={**RUN_ENV, "COLUMNS": "400", **(env or {})}, cwd=tmp_path, timeout=600)
    found = re.findall(r"run directory: (\S+)", result.stdout)
    return result, Path(found[-1]) if found else None


def report(out: str) -> dict[str, str]:
    """The report's rows: feature -> the rest of its first line."""
    rows = {}
    for line in out.split("rehearsal report:")[-1].splitlines()[2:]:
        found = re.match(r"^(\S.*?)\s{2,}(.*)$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_qwen72b_colocate_rehearses_on_two_loopback_nodes(tmp_path):
    """4 nodes x 8 H100, ZeRO-3 with optimizer offload, vLLM TP 8 colocated with sleep level 2: 2 loopback nodes
    through accelerate (the multi-node DeepSpeed launch that once fell back to pdsh), a vLLM engine in each rank."""
    result, run_dir = rehearse(tmp_path, "recipe=qwen72b-colocate", via_run=True)
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    assert out.index("qwen72b-colocate · placement=colocate · 4 node") < out.index("rehearsal report")  # real plan
    rows = report(out)
    assert rows["ZeRO"].startswith("stage 3 + optimizer offload") and "kept" in rows["ZeRO"]
    assert "could not" in rows["vLLM sleep mode"] and "trainer x4" in rows["processes"]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [(p["name"], p["node"]) for p in plan["processes"]] == [("trainer-node0", 0), ("trainer-node1", 1)]
    assert json.loads((run_dir / "deepspeed.json").read_text())["zero_optimization"]["offload_optimizer"]
    for node in (0, 1):  # torch's launcher on each node, not DeepSpeed's pdsh runner; vLLM in each rank
        log = (run_dir / "logs" / f"trainer-node{node}.log").read_text()
        assert f"[grpo-launch] rank {node} of 2" in log and "pdsh" not in log
        assert "weight sync check: vLLM (colocate)" in log
    assert not (run_dir / "cache" / "vllm" / "torch_compile_cache").exists()  # the engines took vllm.enforce_eager
    assert "rehearsal passed: the whole process graph ran, 2 steps trained" in out


def test_qwen72b_server_rehearses_a_vllm_node_apart_from_the_trainer(tmp_path):
    result, run_dir = rehearse(tmp_path, "recipe=qwen72b-server")
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    nodes = {p["role"]: p["node"] for p in plan["processes"]}
    assert nodes == {"vllm": 1, "trainer": 0}, plan["processes"]
    assert out.index("vllm is ready") < out.index("started trainer")  # gated on /health across the nodes
    assert total(final_metrics(run_dir, "vllm"), "vllm:request_success_total") > 0  # the engine served
    assert re.search(r"processes\s+vllm, trainer x4\s+vllm, trainer", out)


def test_qwen7b_server_rehearses(tmp_path):
    """The server placement with ZeRO-3 on 2 ranks: the end-of-run check scores the server's answer on every rank
    (rank 0 alone would wait for the others' ZeRO-3 shards for ever: the rehearsal hung until that was fixed)."""
    result, run_dir = rehearse(tmp_path, "recipe=qwen7b-server")
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    rows = report(out)
    assert "could not" in rows["data"] and "stand-in rows" in rows["data"]  # the hub is out of reach here
    assert (run_dir / "rehearsal-prompts.jsonl").is_file()
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert sorted(re.findall(r"rank (\d) of 2", log)) == ["0", "1"]
    assert "weight sync check: vLLM (server)" in log


def test_qwen15b_async_lora_rehearses_replicas_proxy_and_adapters(tmp_path):
    result, run_dir = rehearse(tmp_path, "recipe=qwen1.5b-async-lora")
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    rows = report(out)
    assert "could not" in rows["trainer"] and "AsyncGRPOTrainer needs CUDA" in rows["trainer"]
    assert re.search(r"vLLM servers\s+6\s+2", out)
    for replica in ("vllm-0", "vllm-1"):  # both replicas loaded the adapters the trainer published
        assert "Loaded new LoRA adapter" in (run_dir / "logs" / f"{replica}.log").read_text()
    assert read_metrics(run_dir).training[-1]["step"] == 2


@pytest.fixture
def user(tmp_path):
    """A user's recipe directory, prompts file and reward file in the working directory; HOME empty."""
    (tmp_path / "mine" / "recipe").mkdir(parents=True)
    (tmp_path / "mine" / "recipe" / "my-sums.yaml").write_text(USER_RECIPE)
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(40)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "home").mkdir()
    return tmp_path


def user_rehearsal(tmp_path: Path, *overrides: str):
    return rehearse(tmp_path, "recipe=my-sums", f"--recipes-dir={tmp_path / 'mine'}", *overrides,
                    env={"HOME": str(tmp_path / "home")})


def test_a_users_reward_function_and_dataset_are_rehearsed_on_real_completions(user):
    before = sorted(p.name for p in user.iterdir())
    result, run_dir = user_rehearsal(user)
    out = result.stdout
    assert result.returncode == 0, out[-5000:]
    records = read_metrics(run_dir).training
    assert records[-1]["step"] == 2 and all("rewards/exact/mean" in r for r in records)  # TRL called it
    assert re.search(r"rewards\s+my_rewards.py:exact\s+as is\s+kept", out)
    assert re.search(r"data\s+files \S+sums.jsonl \(columns question, answer\)\s+the first 64 rows", out)
    # Nothing was written outside the rehearsal's run directory: not the working directory, not HOME, not the
    # config home (conftest points XDG_CONFIG_HOME at tmp_path/xdg).
    assert sorted(p.name for p in user.iterdir()) == sorted([*before, "runs"])
    assert list((user / "runs").iterdir()) == [run_dir.parent] and list(run_dir.parent.iterdir()) == [run_dir]
    assert list((user / "home").iterdir()) == []


def test_a_reward_function_that_raises_fails_the_rehearsal_with_its_traceback(user):
    (user / "broken.py").write_text(BROKEN_REWARDS)
    result, _ = user_rehearsal(user, "rewards=[{fn:broken.py:exact}]")
    out = result.stdout
    assert result.returncode == 1, out[-5000:]
    assert re.search(r"rehearsal failed in trainer, rank [01], at step 1: ValueError: cannot score ", out), out[-3000:]
    # the function's own traceback, whole: its file (as copied into the run directory), line and exception
    assert re.search(r'File "\S+/rewards/broken.py", line 2, in exact\n\s+raise ValueError', out)


def test_a_dataset_without_the_prompt_column_is_refused_before_anything_starts(user):
    (user / "other.jsonl").write_text("".join(json.dumps({"q": f"{a}+1=", "answer": a + 1}) + "\n" for a in range(8)))
    before = sorted(p.name for p in user.iterdir())
    result, _ = user_rehearsal(user, "data.path=other.jsonl")
    assert result.returncode == 2, result.stdout[-5000:]
    # the column the recipe expects, where its value was set, and the columns the file has
    assert f"data.prompt_column 'question' is not a column of {user / 'other.jsonl'} (row 1 has q, answer) " \
           f"(data.prompt_column=question is set by recipe my-sums)" in result.stderr, result.stderr
    assert "started trainer" not in result.stdout and sorted(p.name for p in user.iterdir()) == before


def test_bad_input_is_refused_before_anything_starts(tmp_path):
    result, _ = rehearse(tmp_path, "recipe=qwen72b-colocate", "--resume", str(tmp_path), via_run=True)
    assert result.returncode == 2 and "--resume is for a real run" in result.stderr
    assert not (tmp_path / "runs").exists()
    result, _ = rehearse(tmp_path, "recipe=qwen72b-colocat")
    assert result.returncode == 2 and "did you mean" in result.stderr.lower() and "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []
