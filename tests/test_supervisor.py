"""Orchestration of the server placement with stand-in processes: order, health gating, failures, Ctrl-C,
teardown. The stand-ins speak vLLM's health endpoint but are not vLLM; no training happens here."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import free_port, plan_json
from rich.console import Console

from grpo_launch.errors import UserError
from grpo_launch.supervisor import check_ports_free, supervise

STANDINS = Path(__file__).parent / "standins"


def server_plan(tmp_path: Path, server_args: list[str], trainer_args: list[str], ready_timeout: float = 20):
    """The real qwen7b-server plan, its vLLM and trainer commands swapped for stand-ins."""
    plan = plan_json("recipe=qwen7b-server")
    port = free_port()
    for p in plan["processes"]:
        if p["role"] == "vllm":
            p["argv"] = [sys.executable, str(STANDINS / "server.py"), "--port", str(port), *server_args]
            p["ready_url"] = f"http://127.0.0.1:{port}/health"
            p["ready_timeout_s"] = ready_timeout
        else:
            p["argv"] = [sys.executable, str(STANDINS / "trainer.py"), "--url", f"http://127.0.0.1:{port}/health",
                         *trainer_args]
    (tmp_path / "logs").mkdir()
    return plan


def run(plan, tmp_path, grace_s=3.0):
    out = io.StringIO()
    code = supervise(plan, tmp_path, grace_s=grace_s, console=Console(file=out, width=200))
    return code, out.getvalue()


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(x) for f in pid_dir.iterdir() for x in f.read_text().split()]


def assert_all_dead(pids: list[int]) -> None:
    assert pids
    deadline = time.time() + 5
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"orphan processes left: {alive}")


def test_server_first_then_trainer_then_teardown(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--ready-after", "1.5", "--pid-dir", str(pids)],
                       ["--run-for", "0.5", "--pid-dir", str(pids)])
    code, out = run(plan, tmp_path)
    assert code == 0, out
    assert out.index("started vllm") < out.index("vllm is ready") < out.index("started trainer")
    assert "server health 200 at trainer start" in (tmp_path / "logs" / "trainer.log").read_text()
    assert "stand-in server listening" in (tmp_path / "logs" / "vllm.log").read_text()
    assert_all_dead(recorded_pids(pids))  # the server (and its child) stopped once the trainer finished


def test_process_dying_at_start(tmp_path):
    plan = server_plan(tmp_path, ["--die-after", "0", "--code", "7"], [])
    code, out = run(plan, tmp_path)
    assert code == 7
    assert "vllm exited with code 7 before it was ready" in out
    assert "stand-in server dying with code 7" in out  # the log tail is shown
    assert not (tmp_path / "logs" / "trainer.log").exists()  # the trainer never started


def test_process_dying_mid_run_stops_everything(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--die-after", "2", "--code", "9", "--pid-dir", str(pids)],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    start = time.monotonic()
    code, out = run(plan, tmp_path)
    assert code == 9
    assert "vllm stopped while the trainer runs with code 9" in out
    assert time.monotonic() - start < 30
    assert_all_dead(recorded_pids(pids))
    assert (tmp_path / "logs" / "vllm.log").read_text().strip().endswith("dying with code 9")


def test_trainer_failure_passes_its_exit_code_on(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids)], ["--code", "5"])
    code, out = run(plan, tmp_path)
    assert code == 5 and "trainer exited with code 5" in out
    assert_all_dead(recorded_pids(pids))


def test_health_check_that_never_passes(tmp_path):
    plan = server_plan(tmp_path, ["--never-ready"], [], ready_timeout=2)
    code, out = run(plan, tmp_path)
    assert code == 1
    assert "vllm did not answer http://127.0.0.1:" in out and "within 2 s" in out
    assert "stand-in server listening" in out  # log tail
    assert not (tmp_path / "logs" / "trainer.log").exists()


def _supervise_in_subprocess(plan, tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code = ("import json, sys; from pathlib import Path; from grpo_launch.supervisor import supervise; "
            "sys.exit(supervise(json.loads(Path('plan.json').read_text()), Path('.').resolve(), grace_s=3))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})


def _wait_for(predicate, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_every_process(tmp_path, presses):
    pids = tmp_path / "pids"
    pids.mkdir()
    # The server ignores SIGTERM: one Ctrl-C waits the grace period then kills; two kill at once.
    plan = server_plan(tmp_path, ["--pid-dir", str(pids), "--ignore-sigterm"],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    proc = _supervise_in_subprocess(plan, tmp_path)
    _wait_for(lambda: len(list(pids.iterdir())) == 2)
    start = time.monotonic()
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    out, _ = proc.communicate(timeout=30)
    elapsed = time.monotonic() - start
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert_all_dead(recorded_pids(pids))
    assert elapsed >= 2.5 if presses == 1 else elapsed < 2.5  # graceful waits for the grace period


def test_busy_port_is_a_clear_error():
    plan = plan_json("recipe=qwen7b-server")
    with socket.socket() as s:
        s.bind(("0.0.0.0", plan["ports"][0]["port"]))
        s.listen()
        with pytest.raises(UserError, match=r"port 8000 \(the vLLM server\) is already in use") as e:
            check_ports_free(plan, 0)
    assert e.value.key == "vllm.port"
