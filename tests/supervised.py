"""The real supervisor over stand-in processes: the plans of real recipes with their commands swapped for
tests/standins (which speak vLLM's health endpoint but are not vLLM), run in this process or in a child of its own
(to signal it or kill it)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import free_port, plan_json
from rich.console import Console

from grpo_launch.contracts.plan import Plan
from grpo_launch.launch.supervisor import supervise

STANDINS = Path(__file__).parent / "standins"
PROBE_S = 0.2                  # a ready stand-in server is probed this often: 3 failures in a row and it is dead


def standin_server(port: int, *args: str) -> list[str]:
    return [sys.executable, str(STANDINS / "server.py"), "--port", str(port), *args]


def standin_trainer(url: str | None, *args: str) -> list[str]:
    return [sys.executable, str(STANDINS / "trainer.py"), *(["--url", url] if url else []), *args]


def with_processes(plan: dict, tmp_path: Path, argv: dict, ready_timeout: float = 20, **fields) -> dict:
    """The plan with each named process's argv replaced (readiness and liveness on the stand-in's port)."""
    for p in plan["processes"]:
        if p["name"] in argv:
            p["argv"], port = argv[p["name"]]
            p["ready_url"] = f"http://127.0.0.1:{port}/health" if port else None
            p["ready_timeout_s"] = ready_timeout
            p["liveness"] = {"interval_s": PROBE_S, "timeout_s": PROBE_S, "failures": 3} if port else None
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


def two_replica_plan(tmp_path: Path, replica0: list[str], replica1: list[str], trainer: list[str] | None = None,
                     ready_timeout: float = 1800, **fields) -> dict:
    """The real async-lora plan with two replicas; replicas, proxy and trainer are stand-ins."""
    ports = [free_port() for _ in range(3)]
    proxy_url = f"http://127.0.0.1:{ports[2]}/health"
    return with_processes(
        plan_json("recipe=qwen1.5b-async-lora", "placement.async_lora.replicas=2"), tmp_path,
        {"vllm-0": (standin_server(ports[0], *replica0), ports[0]),
         "vllm-1": (standin_server(ports[1], *replica1), ports[1]),
         "proxy": (standin_server(ports[2]), ports[2]),
         "trainer": (standin_trainer(proxy_url, *(trainer or ["--run-for", "60"])), None)},
        ready_timeout=ready_timeout, **fields)


def run(plan: dict, tmp_path: Path, grace_s: float = 3.0, console_file=None, nodes=(0,)):
    out = console_file or io.StringIO()
    result = supervise(Plan.from_json(plan), tmp_path, nodes=nodes, grace_s=grace_s,
                       console=Console(file=out, width=200))
    return result, out.getvalue() if console_file is None else ""


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(x) for f in pid_dir.iterdir() for x in f.read_text().split()]


def assert_all_dead(pids: list[int], within_s: float = 10) -> None:
    assert pids
    deadline = time.time() + within_s
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"orphan processes left: {alive}")


def supervise_in_subprocess(plan: dict, tmp_path: Path, grace_s: float, before: str = "") -> subprocess.Popen:
    """The supervisor in a process of its own, to signal it; `before` (Python) runs first."""
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    code = (f"{before}\nimport sys; from pathlib import Path; from grpo_launch.contracts.rundir import read_plan; "
            "from grpo_launch.launch.supervisor import supervise; "
            f"sys.exit(supervise(read_plan(Path('.')), Path('.').resolve(), grace_s={grace_s}).code)")
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"})


def read_until(proc: subprocess.Popen, marker: str, seen: list[str]) -> None:
    """Read the supervisor's output until a line holds `marker`: the event to act on, not a guessed delay."""
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return
    raise AssertionError(f"the supervisor ended without printing {marker!r}:\n{''.join(seen)}")
