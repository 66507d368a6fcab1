"""Orchestration with stand-in processes: order, health gating, failures seen whenever they happen, restarts,
Ctrl-C, teardown. The stand-ins speak vLLM's health endpoint but are not vLLM; no training happens here."""

import io
import json
import os
import re
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

from grpo_launch.contracts.plan import Plan
from grpo_launch.errors import UserError
from grpo_launch.launch.preflight import check_ports_free
from grpo_launch.launch.supervisor import supervise

STANDINS = Path(__file__).parent / "standins"


def standin_server(port: int, *args: str) -> list[str]:
    return [sys.executable, str(STANDINS / "server.py"), "--port", str(port), *args]


def standin_trainer(url: str | None, *args: str) -> list[str]:
    return [sys.executable, str(STANDINS / "trainer.py"), *(["--url", url] if url else []), *args]


def with_processes(plan: dict, tmp_path: Path, argv: dict, ready_timeout: float = 20, **fields) -> dict:
    """The plan with each named process's argv replaced (readiness on the stand-in's port)."""
    for p in plan["processes"]:
        if p["name"] in argv:
            p["argv"], port = argv[p["name"]]
            p["ready_url"] = f"http://127.0.0.1:{port}/health" if port else None
            p["ready_timeout_s"] = ready_timeout
            p["start_delay_s"] = 0.0
            p.update(fields.get(p["name"], {}))
    (tmp_path / "logs").mkdir(exist_ok=True)
    return plan


def server_plan(tmp_path: Path, server_args: list[str], trainer_args: list[str], ready_timeout: float = 20) -> dict:
    """The real qwen7b-server plan, its vLLM and trainer commands swapped for stand-ins."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    return with_processes(plan_json("recipe=qwen7b-server"), tmp_path,
                          {"vllm": (standin_server(port, *server_args), port),
                           "trainer": (standin_trainer(url, *trainer_args), None)}, ready_timeout)


def run(plan: dict, tmp_path: Path, grace_s: float = 3.0):
    out = io.StringIO()
    result = supervise(Plan.from_json(plan), tmp_path, grace_s=grace_s, console=Console(file=out, width=200))
    return result, out.getvalue()


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
    result, out = run(plan, tmp_path)
    assert result.code == 0 and result.failures == (), out
    assert out.index("started vllm") < out.index("vllm is ready") < out.index("started trainer")
    assert "server health 200 at trainer start" in (tmp_path / "logs" / "trainer.log").read_text()
    assert "stand-in server listening" in (tmp_path / "logs" / "vllm.log").read_text()
    assert_all_dead(recorded_pids(pids))  # the server (and its child) stopped once the trainer finished


class ClosedPipe(io.StringIO):
    """A console stream whose reader went away (`grpo run | head -3`): every write after the first raises."""

    def write(self, text: str) -> int:
        if self.tell():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def test_a_closed_console_neither_stops_the_run_nor_orphans_it(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--ready-after", "0.5", "--pid-dir", str(pids)],
                       ["--run-for", "0.5", "--pid-dir", str(pids)])
    result = supervise(Plan.from_json(plan), tmp_path, grace_s=3, console=Console(file=ClosedPipe(), width=200))
    assert result.code == 0 and result.failures == ()
    assert "server health 200 at trainer start" in (tmp_path / "logs" / "trainer.log").read_text()
    assert_all_dead(recorded_pids(pids))


def test_a_bug_in_the_supervisor_still_stops_every_process(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--ready-after", "0.5", "--pid-dir", str(pids)],
                       ["--run-for", "60", "--pid-dir", str(pids)])

    def broken(self, name, seconds):
        raise RuntimeError("a bug while showing readiness")

    monkeypatch.setattr("grpo_launch.launch.display.ConsoleDisplay.ready", broken)
    with pytest.raises(RuntimeError, match="a bug while showing readiness"):
        run(plan, tmp_path)
    assert_all_dead(recorded_pids(pids))


def prepare_plan(tmp_path: Path, counter: Path) -> dict:
    """A plan whose one prepare step has a cache key: it counts its builds in `counter` (outside the run)."""
    plan = server_plan(tmp_path, ["--ready-after", "0.2"], ["--run-for", "0.1"])
    build = f"import os; os.mkdir('thing'); open('thing/made', 'w').write('x'); open({str(counter)!r}, 'a').write('.')"
    plan["prepare"] = [{"name": "thing", "argv": [sys.executable, "-c", build], "creates": "thing",
                        "cache_key": "thing-1"}]
    return plan


@pytest.mark.parametrize("mode", ["1", "read", "0"])
def test_a_prepare_step_with_a_cache_key_is_built_once(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("GRPO_MODEL_CACHE", mode)
    monkeypatch.setenv("GRPO_MODEL_CACHE_DIR", str(tmp_path / "kept"))
    counter = tmp_path / "builds"
    for n in range(2):
        run_dir = tmp_path / f"run{n}"
        run_dir.mkdir()
        result, out = run(prepare_plan(run_dir, counter), run_dir)
        assert result.code == 0, out
        assert (run_dir / "thing" / "made").read_text() == "x"
    kept = tmp_path / "kept" / "thing-1"
    assert counter.read_text() == ("." if mode == "1" else "..")  # read and 0: nothing kept, built each time
    assert kept.is_dir() == (mode == "1")
    if mode == "1":
        assert "prepared thing: kept from an earlier run" in out


def test_process_dying_at_start(tmp_path):
    plan = server_plan(tmp_path, ["--die-after", "0", "--code", "7"], [])
    result, out = run(plan, tmp_path)
    assert result.code == 7
    assert [str(f) for f in result.failures] == ["vllm exited with code 7 before it was ready"]
    assert "failed: vllm exited with code 7 before it was ready" in out
    assert "stand-in server dying with code 7" in out  # the log tail is shown
    assert not (tmp_path / "logs" / "trainer.log").exists()  # the trainer never started


def test_process_dying_mid_run_stops_everything(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--die-after", "2", "--code", "9", "--pid-dir", str(pids)],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    result, out = run(plan, tmp_path)
    assert result.code == 9
    assert "vllm stopped while the trainer runs with code 9" in out
    assert_all_dead(recorded_pids(pids))
    assert "dying with code 9" in (tmp_path / "logs" / "vllm.log").read_text().strip().splitlines()[-1]


def test_trainer_failure_passes_its_exit_code_on(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids)], ["--code", "5"])
    result, out = run(plan, tmp_path)
    assert result.code == 5 and "trainer exited with code 5" in out
    assert_all_dead(recorded_pids(pids))


def test_health_check_that_never_passes(tmp_path):
    plan = server_plan(tmp_path, ["--never-ready"], [], ready_timeout=2)
    result, out = run(plan, tmp_path)
    assert result.code == 1
    assert "vllm did not answer http://127.0.0.1:" in out and "within 2 s" in out
    assert "stand-in server listening" in out  # log tail
    assert not (tmp_path / "logs" / "trainer.log").exists()


def two_replica_plan(tmp_path: Path, replica0: list[str], replica1: list[str], **fields) -> dict:
    """The real async-lora plan with two replicas; replicas, proxy and trainer are stand-ins."""
    ports = [free_port() for _ in range(3)]
    proxy_url = f"http://127.0.0.1:{ports[2]}/health"
    return with_processes(
        plan_json("recipe=qwen1.5b-async-lora", "placement.async_lora.replicas=2"), tmp_path,
        {"vllm-0": (standin_server(ports[0], *replica0), ports[0]),
         "vllm-1": (standin_server(ports[1], *replica1), ports[1]),
         "proxy": (standin_server(ports[2]), ports[2]),
         "trainer": (standin_trainer(proxy_url, "--run-for", "60"), None)}, ready_timeout=1800, **fields)


def test_a_process_dying_while_another_is_awaited_is_named_at_once(tmp_path):
    """The reported bug: replica 0 died while the supervisor waited for replica 1, and the run said only that
    vllm-1 did not answer (after the whole health timeout). Every exit is an event, whatever is awaited."""
    plan = two_replica_plan(tmp_path, ["--ready-after", "30", "--die-after", "1", "--code", "9"], ["--never-ready"])
    result, out = run(plan, tmp_path)
    reported = time.time()
    assert result.code == 9
    assert [str(f) for f in result.failures] == ["vllm-0 exited with code 9 before it was ready"]
    died = float(re.search(r"dying with code 9 at (\S+)", (tmp_path / "logs" / "vllm-0.log").read_text()).group(1))
    assert reported - died < 2.0
    assert "vllm-1 did not answer" not in out
    assert not (tmp_path / "logs" / "trainer.log").exists()


def test_a_replica_that_dies_mid_run_is_restarted(tmp_path):
    """A replaceable replica (restart in its spec) that dies after it was ready comes back; the run goes on."""
    plan = two_replica_plan(tmp_path, [], ["--die-after", "1.5", "--code", "9"])
    for p in plan["processes"]:
        if p["name"] == "trainer":
            p["argv"] = standin_trainer(None, "--run-for", "4")
    result, out = run({**plan, "prepare": []}, tmp_path)
    assert result.code == 0, out
    assert result.restarts.get("vllm-1", 0) >= 1
    assert "vllm-1 exited with code 9: restarting it (1 of 3)" in out
    log = (tmp_path / "logs" / "vllm-1.log").read_text()
    assert log.count("stand-in server listening") >= 2  # one log, both incarnations


def test_restarts_are_bounded(tmp_path):
    plan = two_replica_plan(tmp_path, [], ["--die-after", "0.5", "--code", "9"])
    for p in plan["processes"]:
        if p["name"] == "vllm-1":
            p["restart"] = {"max_restarts": 2, "backoff_s": 0.1}
    result, out = run(plan, tmp_path)
    assert result.code == 9
    assert result.restarts == {"vllm-1": 2}
    assert "restarting it (2 of 2)" in out
    assert [str(f) for f in result.failures] == ["vllm-1 stopped while the trainer runs with code 9"]


def test_a_replica_that_dies_before_it_was_ready_is_not_restarted(tmp_path):
    plan = two_replica_plan(tmp_path, [], ["--die-after", "0", "--code", "3"])
    result, out = run(plan, tmp_path)
    assert result.code == 3 and result.restarts == {}
    assert "restarting" not in out


def _supervise_in_subprocess(plan, tmp_path, grace_s):
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code = ("import sys; from pathlib import Path; from grpo_launch.contracts.plan import load_plan; "
            "from grpo_launch.launch.supervisor import supervise; "
            f"sys.exit(supervise(load_plan('plan.json'), Path('.').resolve(), grace_s={grace_s}).code)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})


def _read_until(proc: subprocess.Popen, marker: str, seen: list[str]) -> None:
    """Read the supervisor's output until a line holds `marker`: the event to act on, not a guessed delay."""
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return
    raise AssertionError(f"the supervisor ended without printing {marker!r}:\n{''.join(seen)}")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_every_process(tmp_path, presses):
    pids = tmp_path / "pids"
    pids.mkdir()
    # The server ignores SIGTERM: one Ctrl-C sends it SIGTERM, waits the grace period and kills it; a second
    # Ctrl-C kills at once, so the grace period (60 s) never runs out within the test's 30 s.
    plan = server_plan(tmp_path, ["--pid-dir", str(pids), "--ignore-sigterm"],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    proc = _supervise_in_subprocess(plan, tmp_path, grace_s=3 if presses == 1 else 60)
    seen: list[str] = []
    _read_until(proc, "started trainer", seen)
    proc.send_signal(signal.SIGINT)
    _read_until(proc, "stopping (Ctrl-C again to kill at once)", seen)
    if presses == 2:
        _read_until(proc, "stand-in server ignoring SIGTERM", seen)  # the first press's SIGTERM arrived
        proc.send_signal(signal.SIGINT)
        _read_until(proc, "killing every process now", seen)
    out, _ = proc.communicate(timeout=30)
    out = "".join(seen) + out
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert_all_dead(recorded_pids(pids))
    if presses == 1:  # SIGTERM came first, the server ignored it, and SIGKILL after the grace period ended it
        assert "stand-in server ignoring SIGTERM" in (tmp_path / "logs" / "vllm.log").read_text()


def test_busy_port_is_a_clear_error():
    plan = Plan.from_json(plan_json("recipe=qwen7b-server"))
    with socket.socket() as s:
        s.bind(("0.0.0.0", plan.ports[0].port))
        s.listen()
        with pytest.raises(UserError, match=r"port 8000 \(the vLLM server\) is already in use") as e:
            check_ports_free(plan, 0)
    assert e.value.key == "vllm.port"


# torch.distributed's report when a worker fails, as torchrun 2.13 printed it (rank 1 ran os._exit(7)).
TORCH_FAILURE_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
grpo_launch.trainer FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_08:55:37
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5286)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_08:55:37
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 7 (pid: 5285)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def test_a_failed_workers_own_code_is_passed_on(tmp_path):
    """torchrun and accelerate exit 1 whichever way a worker failed; the run passes the root cause's code on."""
    report = tmp_path / "report.txt"
    report.write_text(TORCH_FAILURE_REPORT + "\n")
    plan = with_processes(plan_json(), tmp_path, {"trainer": ([sys.executable, "-c", "import sys; print(open("
                                                               f"{str(report)!r}).read()); sys.exit(1)"], None)})
    result, out = run({**plan, "prepare": []}, tmp_path)
    assert result.code == 7, out
    assert "trainer exited with code 7" in out


def test_stray_torchrun_variables_never_reach_a_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PET_NNODES", "2")
    plan = with_processes(plan_json(), tmp_path, {"trainer": ([sys.executable, "-c", "import os, sys; "
                                                               "sys.exit(3 if 'PET_NNODES' in os.environ else 0)"],
                                                              None)})
    result, out = run({**plan, "prepare": []}, tmp_path)
    assert result.code == 0, out
