"""`grpo run recipe=tiny-cpu-async-lora`: the async-lora placement on CPU, end to end. Two replicas of the CPU
smoke-test engine behind the real routing proxy; the trainer publishes LoRA adapter versions through the proxy."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import grpo

pytestmark = pytest.mark.slow


def test_adapter_versions_flow_through_the_proxy_to_both_replicas(tmp_path):
    result = grpo("run", "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", env={"COLUMNS": "200"},
                  cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    run_dir = Path(re.search(r"run directory: (\S+)", result.stdout).group(1))
    logs = run_dir / "logs"
    loaded = {r: set(re.findall(r"loaded LoRA adapter (trl-policy-v\d+)", (logs / f"{r}.log").read_text()))
              for r in ("vllm-0", "vllm-1")}
    served = {r: set(re.findall(r"served \d+ completion\(s\) of \d+ prompt\(s\) with (trl-policy-v\d+)",
                                (logs / f"{r}.log").read_text())) for r in ("vllm-0", "vllm-1")}
    published = [json.loads(line).get("published") for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    published = ["trl-policy-v1", *filter(None, published)]  # v1 is the cold sync before the first step
    assert len(published) >= 3
    # Every version was broadcast to both replicas (the proxy's all-or-nothing load), and rollouts were served with
    # at least three of them (a version published after the last rollout was requested serves none).
    assert loaded["vllm-0"] == loaded["vllm-1"] == set(published)
    assert len(served["vllm-0"] | served["vllm-1"]) >= 3
    trained_on = {v for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                  for v in json.loads(line)["model_versions"]}
    assert len(trained_on) >= 3
    # Versions older than the staleness window were unloaded and their directories deleted, as the trainer does.
    adapters = sorted(p.name for p in (run_dir / "checkpoints" / ".vllm_lora").iterdir())
    assert "trl-policy-v1" not in adapters and published[-1] in adapters
    assert (run_dir / "checkpoints" / "final" / "adapter_config.json").exists()


def test_a_replica_killed_mid_run_is_restarted_and_taken_back(tmp_path):
    """Replicas behind the proxy are replaceable: kill one after the first step; the supervisor restarts it, the
    proxy takes it back with the current adapter, no request is lost and the run finishes."""
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", "trainer.max_steps=14"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    seen, pid = [], None
    for line in proc.stdout:  # the supervisor's own lines: act on events, not on guessed delays
        seen.append(line)
        if found := re.search(r"started vllm-1 \(pid (\d+)", line):
            pid = int(found.group(1))
        if pid and '"step": 1,' in line:
            os.killpg(pid, signal.SIGKILL)
            break
    out = "".join(seen) + proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, out[-4000:]
    assert "vllm-1 exited with code 137: restarting it (1 of 3)" in out
    assert out.count("vllm-1 is ready") == 2
    run_dir = Path(re.search(r"run directory: (\S+)", out).group(1))
    replica_log = (run_dir / "logs" / "vllm-1.log").read_text()
    second_life = replica_log.split(": serving ")[-1]  # the restarted incarnation's lines
    assert re.search(r"loaded LoRA adapter trl-policy-v\d+", second_life), "the proxy did not catch it up"
    stats = json.loads(re.findall(r"stopping; stats (\{.*\})", (run_dir / "logs" / "proxy.log").read_text())[-1])
    assert stats["errors"] == {}, stats["errors"]  # every request was answered, retried where needed
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 14
