"""Every vLLM placement against the real engine (vLLM's CPU build), proven by the engines' own numbers: the server
placement with TRL's GRPOTrainer, colocate under accelerate and torchrun, and the faults of a real server."""

import importlib.metadata
import re
from pathlib import Path

import psutil
import pytest
from conftest import grpo
from engine import final_metrics, metrics_records, total

from grpo_launch.cli import main

pytestmark = pytest.mark.slow
ENV = {"COLUMNS": "200"}
# TRL's own measure of whether vLLM generated with the trainer's weights: |trainer log-prob - vLLM's| per token.
LOGP_DIFFERENCE = "sampling/sampling_logp_difference/max"
SYNC_CHECK = re.compile(r"weight sync check: vLLM \((\w+)\) generates with the trained weights")


def grpo_run(tmp_path: Path, *overrides: str):
    result = grpo("run", f"run.root={tmp_path / 'runs'}", *overrides, env=ENV, cwd=tmp_path, timeout=900)
    found = re.search(r"run directory: (\S+)", result.stdout)
    return result, Path(found.group(1)) if found else None


def assert_generation_followed_training(run_dir: Path, steps: int) -> None:
    records = [r for r in metrics_records(run_dir) if LOGP_DIFFERENCE in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    # Every step generated with the weights of the step before: the trainer and vLLM agree to float32 precision
    # while training moves the weights (the loss is not zero throughout).
    assert max(r[LOGP_DIFFERENCE] for r in records) < 1e-4, [r[LOGP_DIFFERENCE] for r in records]
    assert any(abs(r["loss"]) > 0 for r in records)


def vllm_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "vllm serve" in cmd or "vllm.entrypoints" in cmd:
            found.append(p)
    return found


def test_server_placement_trains_against_a_real_server(tmp_path):
    result, run_dir = grpo_run(tmp_path, "recipe=tiny-cpu-server")
    assert result.returncode == 0, result.stdout[-4000:]
    plan_argv = (run_dir / "launch.sh").read_text()
    assert "vllm serve model --host 127.0.0.1 --port 8000" in plan_argv  # what the plan showed is what ran
    assert "vllm is ready" in result.stdout and result.stdout.index("vllm is ready") < result.stdout.index(
        "started trainer")
    assert_generation_followed_training(run_dir, steps=12)
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert SYNC_CHECK.findall(log) == ["server"]  # after the run: the server serves the final weights
    assert sorted(re.findall(r"rank (\d) of 2", log)) == ["0", "1"]  # both trainer ranks ran
    engine = final_metrics(run_dir, "vllm")
    assert total(engine, "vllm:request_success_total") >= 12 * 32  # 12 steps x 32 completions, from the engine
    assert (run_dir / "weight-sync" / "model.safetensors").is_file()


def test_colocate_runs_vllm_inside_both_ranks(tmp_path):
    """Under torchrun; colocate under accelerate (with ZeRO-3 and offload, on 2 nodes) is the rehearsal of
    qwen72b-colocate (test_rehearse)."""
    result, run_dir = grpo_run(tmp_path, "recipe=tiny-cpu-colocate", "launcher=torchrun")
    assert result.returncode == 0, result.stdout[-4000:]
    assert_generation_followed_training(run_dir, steps=12)
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert SYNC_CHECK.findall(log) == ["colocate", "colocate"]  # each rank's own engine
    assert sorted(p.name for p in (run_dir / "weight-sync").iterdir()) == ["rank-0", "rank-1"]


def test_a_server_that_fails_to_start_stops_the_run(tmp_path):
    before = {p.pid for p in vllm_processes()}
    result, run_dir = grpo_run(tmp_path, "recipe=tiny-cpu-server", "vllm.extra_args=[--no-such-flag]")
    assert result.returncode == 2, result.stdout[-3000:]  # vLLM's own exit code for a bad flag
    assert "failed: vllm exited with code 2 before it was ready" in result.stdout
    assert "unrecognized arguments: --no-such-flag" in result.stdout  # its log tail
    assert "started trainer" not in result.stdout
    assert {p.pid for p in vllm_processes()} <= before  # nothing of it is left


def test_a_vllm_recipe_without_vllm_installed_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    def missing(name):
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return "0"

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert main(["run", "recipe=tiny-cpu-server", f"run.root={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert "runs vLLM on this machine (placement server), and vLLM is not installed here" in err
    assert "make setup" in err and "grpo plan` works without it" in err
    assert not (tmp_path / "runs").exists()
    assert main(["plan", "recipe=tiny-cpu-server", "--json"]) == 0  # planning needs no vLLM
