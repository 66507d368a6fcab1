"""`grpo run recipe=tiny-cpu-async-lora`: the async-lora placement on CPU, end to end. Two replicas of the CPU
smoke-test engine behind the real routing proxy; the trainer publishes LoRA adapter versions through the proxy."""

import json
import re
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
