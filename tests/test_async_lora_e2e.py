"""`grpo run recipe=tiny-cpu-async-lora`: two real vLLM replicas (vLLM's CPU build, runtime LoRA) behind the real
routing proxy; the trainer publishes LoRA adapter versions through the proxy. Asserted from the engines' own
numbers (their /metrics and logs) and the proxy's."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_ports, grpo
from engine import adapters_loaded, adapters_removed, adapters_run, final_metrics, metrics_records, total

pytestmark = pytest.mark.slow
REPLICAS = ("vllm-0", "vllm-1")


def proxy_stats(run_dir: Path) -> dict:
    """The proxy's own account of the run, which it logs as it stops."""
    return json.loads(re.findall(r"stopping; stats (\{.*\})", (run_dir / "logs" / "proxy.log").read_text())[-1])


def test_adapter_versions_flow_through_the_proxy_to_both_replicas(tmp_path):
    """The proxy listens beyond loopback here, so it requires a client key: the supervisor's probes and TRL's
    clients in the trainer (control calls and generation) all send it, and it is in no file of the run. The replicas
    require the run's key (the user's here), which the proxy and the probes send: it is in no file either."""
    key, replica_key = "proxy-key-8c1e4b7a2f", "replica-key-3e7a91d05b"
    result = grpo("run", "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", *free_ports(),
                  "placement.async_lora.proxy.host=0.0.0.0",
                  "placement.async_lora.proxy.api_key_env=GRPO_TEST_PROXY_KEY",
                  env={"COLUMNS": "200", "GRPO_TEST_PROXY_KEY": key, "GRPO_VLLM_API_KEY": replica_key}, cwd=tmp_path,
                  timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "every vLLM server requires the key in GRPO_VLLM_API_KEY, taken from your environment" in result.stdout
    run_dir = Path(re.search(r"run directory: (\S+)", result.stdout).group(1))
    assert "client API key required" in (run_dir / "logs" / "proxy.log").read_text()
    assert (run_dir / "logs" / "proxy.metrics").read_text()  # scraped with the key as the run stopped
    for secret in (key, replica_key):
        assert [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()] == []
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
    # This recipe's prompts (a 51-token system prompt and a 5-token sum) hold one full block, the system prompt's:
    # every router gets the same prefix hits here, so what the engines measure of routing is test_proxy_vllm's
    # (concurrent groups of longer prompts, against the best a group-splitting router can do). What routing decided
    # is the proxy's own account: each group's completions followed its first request (none spilled), and each
    # group's first request is the only one routed without a prefix.
    ran = adapters_run(engines["vllm-0"]) | adapters_run(engines["vllm-1"])
    assert len(ran) >= 3 and ran <= set(published)  # rollouts came from at least three adapter versions
    trained_on = {v for r in records for v in r["model_versions"]}
    assert len(trained_on) >= 3
    stats = proxy_stats(run_dir)
    requests = stats["requests"]
    assert stats["errors"] == {} and requests["spill"] == 0
    # G=4: one request in four starts a group (two groups may be cut short when training ends)
    assert requests["unmatched"] <= requests["routed"] // 4 + 2
    assert (run_dir / "logs" / "proxy.log").read_text().count("tokenizer agrees with replica") == 2
    adapters = sorted(p.name for p in (run_dir / "checkpoints" / ".vllm_lora").iterdir())
    assert "trl-policy-v1" not in adapters and published[-1] in adapters
    assert (run_dir / "checkpoints" / "final" / "adapter_config.json").exists()
    # The report in the async post's terms: staleness, samples trained, and the trainer's wait for rollouts
    report = json.loads(grpo("report", str(run_dir), "--json").stdout)
    staleness = [r["staleness/mean"] for r in records if "staleness/mean" in r]
    assert len(staleness) == 8 and report["staleness_mean"] == pytest.approx(sum(staleness) / 8)
    assert report["staleness_max"] == max(r["staleness/max"] for r in records) <= 2  # trainer.max_staleness
    assert report["samples_trained"] == 8 * 8 and report["units"] == {"training": 1, "in_use": 3, "held": 3}
    assert report["phase_share"]["wait"] > 0 and report["phase_share"]["sync"] > 0
    assert report["diagnosis"][0]["kind"] in ("async starved", "trainer-bound")


def test_a_replica_killed_mid_run_is_restarted_and_taken_back(tmp_path):
    """Replicas behind the proxy are replaceable: kill one after the first step; the supervisor restarts it, the
    proxy takes it back with the current adapter, no request is lost and the run finishes.

    The trainer is paused (SIGSTOP) from the kill until the proxy has the replica back in routing: a vLLM restart
    takes 20-45 s here, longer than the remaining steps on a fast machine, and the restarted replica must have steps
    left to serve (CI once finished all 30 steps before it was back)."""
    steps = 12
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           "recipe=tiny-cpu-async-lora", f"run.root={tmp_path / 'runs'}", f"trainer.max_steps={steps}",
           *free_ports()]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    seen, pids, paused = [], {}, False
    try:
        for line in proc.stdout:  # the supervisor's own lines: act on events, not on guessed delays
            seen.append(line)
            if found := re.search(r"started (\S+) \(pid (\d+)", line):
                pids[found.group(1)] = int(found.group(2))
            if not paused and '"step": 1,' in line:
                os.killpg(pids["trainer"], signal.SIGSTOP)
                os.killpg(pids["vllm-1"], signal.SIGKILL)
                paused = True
            if paused and "vllm-1 is ready" in line:
                break
        # The proxy readmits on its own health probe, after loading the current adapters: wait for its third "in
        # routing" line (both replicas at the start, then vllm-1 again).
        (run_dir,) = (tmp_path / "runs" / "tiny-cpu-async-lora").iterdir()
        proxy_log = run_dir / "logs" / "proxy.log"
        deadline = time.monotonic() + 120
        while proxy_log.read_text().count("is in routing") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(pids["trainer"], signal.SIGCONT)
        out = "".join(seen) + proc.communicate(timeout=900)[0]
    finally:  # a failing assertion above must not leave the run behind (stopped, it would hold its ports)
        if proc.poll() is None:
            if "trainer" in pids:
                os.killpg(pids["trainer"], signal.SIGCONT)
            proc.terminate()
            proc.wait(60)
    assert proc.returncode == 0, out[-4000:]
    assert "vllm-1 exited with code 137: restarting it (1 of 3)" in out
    assert out.count("vllm-1 is ready") == 2
    second_life = (run_dir / "logs" / "vllm-1.log").read_text().split("non-default args")[-1]
    assert adapters_loaded(second_life), "the proxy did not load the current adapter on the restarted replica"
    # The restarted replica served again (its counters start anew), and every request was answered.
    assert total(final_metrics(run_dir, "vllm-1"), "vllm:request_success_total") > 0
    assert proxy_stats(run_dir)["errors"] == {}
    assert metrics_records(run_dir)[-1]["step"] == steps
