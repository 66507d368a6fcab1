"""The GPU check (benchmarks/gpu_check.py) as far as a CPU machine can run it: it plans both layouts, builds its
model, says there is no CUDA and exits 0; its worker times the phases of a real trainer run (on the CPU here) and
the report puts them beside the model's prediction."""

import argparse
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, free_port

from grpo_launch.compose import compose
from grpo_launch.contracts import tiny
from grpo_launch.contracts.phases import Phase
from grpo_launch.estimate.catalog import shape_from_config
from grpo_launch.materialize import materialize
from grpo_launch.plan import build_plan

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SMALL = ["--hidden", "64", "--layers", "2", "--heads", "2", "--kv-heads", "1"]


def test_without_cuda_it_plans_builds_its_model_and_exits_0(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *SMALL], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "no CUDA device here" in out and "nothing is measured" in out
    for stage in (2, 3):
        assert f"ZeRO-{stage} on H100: training predicted" in out
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["hidden_size"] == 64
    assert (tmp_path / "model" / "tokenizer.json").exists() and not (tmp_path / "gpu_check.json").exists()


def test_its_default_model_has_a_few_hundred_million_parameters():
    shape = {"hidden_size": 1024, "num_layers": 24, "num_heads": 16, "num_kv_heads": 4, "max_position_embeddings": 256}
    assert [f"--{k.replace('_', '-')}" for k in ("hidden", "layers", "heads", "kv_heads")] == SMALL[::2]
    defaults = {a.dest: a.default for a in _parser()._actions}
    assert {k: defaults[k] for k in ("hidden", "layers", "heads", "kv_heads", "context")} == dict(
        zip(("hidden", "layers", "heads", "kv_heads", "context"), shape.values(), strict=True))
    assert 200e6 < shape_from_config(tiny.config_json(**shape)).parameters < 600e6


def _parser():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    return gpu_check.parser()


@pytest.mark.slow
def test_the_worker_times_a_real_run_and_the_report_compares_it(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    composed = compose(["recipe=tiny-cpu", "cluster.gpus_per_node=1", "trainer.max_steps=3"])
    plan = build_plan(composed)
    run_dir = materialize(composed, plan, [], tmp_path / "run")
    (step,) = plan.prepare  # the built-in tiny model
    subprocess.run([sys.executable, *step.argv[1:]], cwd=run_dir, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    env = {**os.environ, **plan.processes[0].env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--worker", str(run_dir)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = json.loads((run_dir / gpu_check.MEASURED).read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["generation_s"] > 0 and s["training_s"] > 0
        assert s["step_s"] >= s["generation_s"] + s["training_s"]
        assert s["completion_width"] <= 8 and s["prompt_width"] > 0

    # The same measurements beside the prediction of a GPU layout of that shape, as the check reports them.
    gpu = {"name": "NVIDIA H100 80GB HBM3", "gib": 79.6}  # as torch names an H100 SXM
    args = argparse.Namespace(steps=3, batch=16, completion=8)
    gpu_composed = compose(gpu_check.overrides(args, 2, run_dir / "model", gpu))
    gpu_plan = build_plan(gpu_composed)
    at_measured = gpu_check._predicted_at(gpu_composed, gpu_plan, steps)
    table = gpu_check.report([{"stage": 2, "failed": False, "steps": steps, "gpu": gpu,
                               "predicted_training_s": gpu_plan.prediction.phase(Phase.TRAIN).seconds,
                               "predicted_training_at_measured_s": at_measured,
                               "estimate": gpu_check._estimate(gpu_plan)}])
    assert gpu_plan.prediction.accelerator == "H100" and at_measured > 0
    assert "GPU check on NVIDIA H100 80GB HBM3" in table and "| ZeRO-2 | training phase, s |" in table
