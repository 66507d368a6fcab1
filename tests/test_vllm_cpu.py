"""vLLM's CPU build against the real engine: the faults of a real server. Colocate under torchrun and a server run
are reported and compared in test_report_e2e; the server placement also runs against a real server on its own Slurm
node (test_slurm) and in the server recipes' rehearsals (test_rehearse); colocate under accelerate, on 2 nodes, in
qwen72b-colocate's rehearsal."""

import importlib.metadata
import re
from pathlib import Path

import psutil
import pytest
from conftest import RUN_ENV, free_ports, grpo_run

from grpo_launch.cli import main

pytestmark = pytest.mark.slow


def vllm_processes(under: Path) -> list[psutil.Process]:
    """vLLM's processes running in `under`, a test's directory (other tests' servers may run beside it)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("vllm serve" in cmd or "vllm.entrypoints" in cmd) and Path(p.info["cwd"] or "/").is_relative_to(under):
            found.append(p)
    return found


def test_a_server_that_fails_to_start_stops_the_run(tmp_path):
    result, run_dir = grpo_run(tmp_path, "recipe=tiny-cpu-server", "vllm.extra_args=[--no-such-flag]", timeout=900)
    assert result.returncode == 2, result.stdout[-3000:]  # vLLM's own exit code for a bad flag
    assert "failed: vllm exited with code 2 before it was ready" in result.stdout
    assert "unrecognized arguments: --no-such-flag" in result.stdout  # its log tail
    assert "started trainer" not in result.stdout
    assert vllm_processes(tmp_path) == []  # nothing of it is left


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_of_grpo_leaves_no_process(tmp_path):
    """`grpo run` of tiny-cpu-server killed by SIGKILL once the vLLM server is ready and both trainer ranks run: its
    watchdog ends every process group, so nothing is left of the server (its API server and the EngineCore process
    under it), of accelerate's launcher or of its ranks."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
                             "recipe=tiny-cpu-server", f"run.root={tmp_path / 'runs'}", "--grace", "5",
                             *free_ports()],
                            cwd=tmp_path, env={**os.environ, **RUN_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen, ranks = [], set()
    for line in proc.stdout:  # what the run says, not a guessed delay: the server is ready, both ranks started
        seen.append(line)
        ranks |= set(re.findall(r"\[grpo-launch\] rank (\d) of 2", line))
        if ranks == {"0", "1"}:
            break
    assert ranks == {"0", "1"}, "".join(seen)[-3000:]
    assert any("vllm is ready" in line for line in seen)
    descendants = psutil.Process(proc.pid).children(recursive=True)
    commands = {p.pid: " ".join(p.cmdline()) for p in descendants}
    names = " ".join(commands.values())
    assert "vllm serve" in names and "accelerate" in names and "grpo_launch.trainer" in names, names
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60  # SIGTERM, the 5 s grace, SIGKILL
    left = descendants
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if alive(p)]
    survivors = [commands[p.pid] for p in left]
    for p in left:  # what the test found is not left for the next one
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert not survivors


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
