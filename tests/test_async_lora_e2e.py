"""`grpo run recipe=tiny-cpu-async-lora`: two real vLLM replicas (vLLM's CPU build, runtime LoRA) behind the real
routing proxy; the trainer publishes LoRA adapter versions through the proxy. Asserted from the engines' own
numbers (their /metrics and logs) and the proxy's."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import grpo
from engine import adapters_loaded, adapters_removed, adapters_run, final_metrics, metrics_records, total

pytestmark = pytest.mark.slow
REPLICAS = ("vllm-0", "vllm-1")


def proxy_stats(run_dir: Path) -> dict:
    """The proxy's own account of the run, which it logs as it stops."""
    return json.loads(re.findall(r"stopping; stats (\{.*\})", (run_dir / "logs" / "proxy.log").read_text())[-1])


def test_adapter_versions_flow_through_the_proxy_to_both_replicas(tmp_path):
    result = grpo("run", "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", env={"COLUMNS": "200"},
                  cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    run_dir = Path(re.search(r"run directory: (\S+)", result.stdout).group(1))
    records = metrics_records(run_dir)
    published = ["trl-policy-v1", *(r["published"] for r in records if "published" in r)]  # v1: the cold sync
    assert len(published) >= 3
    logs = {r: (run_dir / "logs" / f"{r}.log").read_text() for r in REPLICAS}
    engines = {r: final_metrics(run_dir, r) for r in REPLICAS}
    for replica in REPLICAS:
        # Every version was loaded on both replicas (the proxy's all-or-nothing broadcast), in order, and the ones
        # that left the staleness window were unloaded again: vLLM's own log lines.
        assert adapters_loaded(logs[replica]) == published
        assert adapters_removed(logs[replica]) == published[: len(published) - 3]  # max_staleness 2: 3 kept
        assert total(engines[replica], "vllm:request_success_total") > 0  # both replicas served rollouts
    # The engines' prefix caches hit: prompts share a system prompt longer than a block, and a prompt's group of
    # completions reuses its prefix; the proxy routed by that prefix.
    assert sum(total(engines[r], "vllm:prefix_cache_hits_total") for r in REPLICAS) > 0
    ran = adapters_run(engines["vllm-0"]) | adapters_run(engines["vllm-1"])
    assert len(ran) >= 3 and ran <= set(published)  # rollouts came from at least three adapter versions
    trained_on = {v for r in records for v in r["model_versions"]}
    assert len(trained_on) >= 3
    stats = proxy_stats(run_dir)
    assert stats["errors"] == {} and stats["requests"]["affinity"] > 0
    assert (run_dir / "logs" / "proxy.log").read_text().count("tokenizer agrees with replica") == 2
    adapters = sorted(p.name for p in (run_dir / "checkpoints" / ".vllm_lora").iterdir())
    assert "trl-policy-v1" not in adapters and published[-1] in adapters
    assert (run_dir / "checkpoints" / "final" / "adapter_config.json").exists()


def test_a_replica_killed_mid_run_is_restarted_and_taken_back(tmp_path):
    """Replicas behind the proxy are replaceable: kill one after the first step; the supervisor restarts it, the
    proxy takes it back with the current adapter, no request is lost and the run finishes."""
    steps = 30
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", f"trainer.max_steps={steps}"]
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
    out = "".join(seen) + proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, out[-4000:]
    assert "vllm-1 exited with code 137: restarting it (1 of 3)" in out
    assert out.count("vllm-1 is ready") == 2
    run_dir = Path(re.search(r"run directory: (\S+)", out).group(1))
    second_life = (run_dir / "logs" / "vllm-1.log").read_text().split("non-default args")[-1]
    assert adapters_loaded(second_life), "the proxy did not load the current adapter on the restarted replica"
    # The restarted replica served again (its counters start anew), and every request was answered.
    assert total(final_metrics(run_dir, "vllm-1"), "vllm:request_success_total") > 0
    assert proxy_stats(run_dir)["errors"] == {}
    assert metrics_records(run_dir)[-1]["step"] == steps
