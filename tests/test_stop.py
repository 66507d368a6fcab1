"""`grpo stop RUN_DIR` from another terminal: the local run's `grpo run` stops every process, as Ctrl-C would
(scheduler=slurm's is in test_slurm.py, scheduler=hf-jobs's in test_hf_jobs_e2e.py)."""

import os
import subprocess
import sys
import time

import pytest
from conftest import RUN_ENV, free_port, grpo
from fault_matrix import REFUSED, FaultRow, record_fault

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


@pytest.mark.fault
def test_grpo_stop_ends_a_local_run_from_another_terminal(tmp_path):
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "trainer.max_steps=500", f"run.main_process_port={free_port()}"]
    output = (tmp_path / "grpo-run.out").open("w+")  # a pipe nobody reads while the test works would fill
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **RUN_ENV}, stdout=output,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    started = []  # the trainer's launcher runs: its log is open
    while time.time() < deadline and not started and proc.poll() is None:
        started = list((tmp_path / "runs").glob("tiny-cpu/*/logs/trainer.log"))
        time.sleep(0.2)
    assert started, (tmp_path / "grpo-run.out").read_text()[-3000:]
    run_dir = started[0].parents[1]
    # Issue 27, 11: a second `grpo run --resume` of the running directory started a second trainer in it, and
    # overwrote submitted.json (so `grpo stop` then stopped the wrong run). It is refused, naming the holder.
    submitted = (run_dir / "submitted.json").read_bytes()
    second = grpo("run", "--resume", str(run_dir), "--from-scratch", f"run.main_process_port={free_port()}",
                  "--force", env=RUN_ENV, cwd=tmp_path)  # another port: nothing else would stop it
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"{run_dir} is running: its node 0 is held by `grpo run` pid {proc.pid} on" in second.stderr
    assert (run_dir / "submitted.json").read_bytes() == submitted and proc.poll() is None
    record_fault(FaultRow("11 a second --resume of a running run", 1, REFUSED,
                          REFUSED if second.returncode == 2 else f"exit {second.returncode}"))
    stopped = grpo("stop", str(run_dir), env=RUN_ENV, cwd=tmp_path)
    assert stopped.returncode == 0 and "SIGTERM sent" in stopped.stdout, stopped.stdout + stopped.stderr
    proc.wait(timeout=60)
    out = (tmp_path / "grpo-run.out").read_text()
    assert proc.returncode == 143, out[-3000:]  # 128 + SIGTERM, which grpo stop sends: the run stops as on Ctrl-C
    assert "interrupted" in out
    assert not processes_in(run_dir)
    again = grpo("stop", str(run_dir), env=RUN_ENV, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to stop" in again.stdout
    assert not list(run_dir.glob("run-node*.lock"))  # given back as the run ended


def test_grpo_stop_refuses_what_is_not_a_run_directory(tmp_path):
    result = grpo("stop", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "not a grpo-launch run directory" in result.stderr


@pytest.mark.fault
def test_grpo_stop_does_not_signal_a_process_that_took_the_recorded_pid(tmp_path):
    """Issue 27, 18: `grpo stop` took a recorded pid for the run's `grpo run` when its command line held "grpo":
    after the run ended and the pid was reused, it signalled another process. The record has its start time."""
    import socket

    from grpo_launch.compose import compose
    from grpo_launch.contracts.rundir import Submitted, process_started, write_submitted
    from grpo_launch.materialize import materialize
    from grpo_launch.plan import build_plan

    composed = compose([f"run.dir={tmp_path / 'run'}"])
    run_dir = materialize(composed, build_plan(composed), [])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "grpo"])  # has taken the pid
    try:
        write_submitted(run_dir, Submitted("local", (str(other.pid),), time.time(), host=socket.gethostname(),
                                           started=process_started(other.pid) - 1, nodes=(0,)))
        stopped = grpo("stop", str(run_dir), cwd=tmp_path)
        assert stopped.returncode == 0 and "nothing to stop" in stopped.stdout, stopped.stdout + stopped.stderr
        record_fault(FaultRow("18 grpo stop after the run's pid was reused", 1, REFUSED,
                              REFUSED if other.poll() is None else "signalled the pid's new owner"))
    finally:
        other.kill()


def test_a_lock_whose_holder_has_gone_is_taken_over(tmp_path):
    """A `grpo run` killed with SIGKILL leaves its lock: the next run takes it over; a live holder keeps it."""
    import socket

    from grpo_launch.contracts.rundir import read_run_lock, release_run_lock, take_run_lock

    host = socket.gethostname()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert take_run_lock(tmp_path, [0, 1], holder.pid, host) is None
        held = take_run_lock(tmp_path, [1, 2], os.getpid(), host)
        assert (held.node, held.pid) == (1, holder.pid) and read_run_lock(tmp_path, 2) is None
        assert take_run_lock(tmp_path, [0], os.getpid(), "another-host") is not None  # it cannot tell: held
    finally:
        holder.kill()
        holder.wait()
    assert take_run_lock(tmp_path, [0, 1], os.getpid(), host) is None
    assert {read_run_lock(tmp_path, n).pid for n in (0, 1)} == {os.getpid()}
    release_run_lock(tmp_path, [0, 1], os.getpid(), host)
    assert not list(tmp_path.glob("run-node*.lock"))
