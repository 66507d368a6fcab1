"""`grpo stop RUN_DIR` from another terminal: the local run's `grpo run` stops every process, as Ctrl-C would
(scheduler=slurm's is in test_slurm.py, scheduler=hf-jobs's in test_hf_jobs_e2e.py)."""

import os
import subprocess
import sys
import time

import pytest
from conftest import RUN_ENV, free_port, grpo

pytestmark = pytest.mark.slow


def processes_in(directory) -> list[str]:
    """The command lines of the processes working in `directory` (every process a run starts works there)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit() and os.readlink(f"/proc/{proc}/cwd").startswith(str(directory)):
                found.append(open(f"/proc/{proc}/cmdline").read().replace("\0", " "))
        except OSError:
            pass
    return found


def test_grpo_stop_ends_a_local_run_from_another_terminal(tmp_path):
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "trainer.max_steps=500", f"run.main_process_port={free_port()}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **RUN_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    started = []  # the trainer's launcher runs: its log is open
    while time.time() < deadline and not started and proc.poll() is None:
        started = list((tmp_path / "runs").glob("tiny-cpu/*/logs/trainer.log"))
        time.sleep(0.2)
    assert started, proc.communicate()[0][-3000:]
    run_dir = started[0].parents[1]
    stopped = grpo("stop", str(run_dir), env=RUN_ENV, cwd=tmp_path)
    assert stopped.returncode == 0 and "SIGTERM sent" in stopped.stdout, stopped.stdout + stopped.stderr
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-3000:]  # stopped as on Ctrl-C: the run says it was interrupted
    assert "interrupted" in out
    assert not processes_in(run_dir)
    again = grpo("stop", str(run_dir), env=RUN_ENV, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to stop" in again.stdout


def test_grpo_stop_refuses_what_is_not_a_run_directory(tmp_path):
    result = grpo("stop", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "not a grpo-launch run directory" in result.stderr
