"""scheduler=slurm against a real Slurm cluster on loopback (tests/slurm_cluster.py: slurmctld, 3 slurmd with fake
GPUs, munged): `grpo run` writes job.sbatch, submits it, follows the job and passes its exit code on."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import RUN_ENV, free_port, grpo_run
from engine import SYNC_CHECK, assert_generation_followed_training
from fault_matrix import FINISHED, LEFT_RUNNING, FaultRow, record_fault, records_lost, steps_lost
from slurm_cluster import LoopbackSlurm, missing

from grpo_launch.contracts.rundir import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if reason := missing():
        pytest.skip(reason)  # a failure in CI (conftest: GRPO_NO_SKIPS)
    cluster = LoopbackSlurm(tmp_path_factory.mktemp("slurm"), nodes=3, gpus_per_node=2, cpus_per_node=4,
                            ctld_port=16817, slurmd_base_port=17001)
    cluster.start()
    print(f"\nloopback Slurm cluster up in {cluster.timings['start_s']:.2f} s")
    yield cluster
    cluster.stop()
    print(f"\nloopback Slurm cluster down in {cluster.timings['stop_s']:.2f} s")


def slurm_run(cluster, tmp_path, *overrides):
    return grpo_run(tmp_path, "scheduler=slurm", f"run.main_process_port={free_port()}", *overrides,
                    env=cluster.env(), timeout=600)


def job_id(out: str) -> str:
    return re.search(r"submitted Slurm job (\d+)", out).group(1)


def job_processes_left(cluster) -> list[int]:
    deadline = time.time() + 15  # slurmstepd lingers about 2 s after a job
    while time.time() < deadline and cluster.job_processes():
        time.sleep(0.2)
    return cluster.job_processes()


def assert_no_job_process_left(cluster) -> None:
    left = job_processes_left(cluster)
    assert not left, "left running: " + ", ".join(open(f"/proc/{p}/cmdline").read().replace("\0", " ") for p in left)


def injected(tmp_path) -> int:
    """How many `show job` calls the flaky scontrol failed."""
    failed = tmp_path / "show-job-failed"
    return failed.stat().st_size if failed.exists() else 0


def test_tiny_cpu_trains_on_two_slurm_nodes(slurm, tmp_path):
    submitted = time.time()
    result, run_dir = slurm_run(slurm, tmp_path, "recipe=tiny-cpu", "cluster.nodes=2", "cluster.gpus_per_node=1",
                                "trainer.max_steps=3")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash")
    job = job_id(out)
    assert f"Slurm job {job}: RUNNING on n[1-2]" in out and f"Slurm job {job}: COMPLETED" in out
    # each node's process log streamed with its prefix, as locally
    assert re.search(r"trainer-node1 │ \[grpo-launch\] rank 1 of 2", out)
    assert re.search(r"trainer-node0 │ \[grpo-launch\] training finished at step 3", out)
    # plan node K ran on the K-th node of the allocation: its index expanded on that node
    for node in (0, 1):
        log = (run_dir / "logs" / f"trainer-node{node}.log").read_text()
        assert f"[grpo-launch] rank {node} of 2" in log
    records = read_metrics(run_dir).training
    assert records[-1]["step"] == 3
    print(f"\nSlurm: submission to first step {records[0]['time'] - submitted:.1f} s")
    assert_no_job_process_left(slurm)


def test_tiny_cpu_server_with_vllm_on_one_node_and_the_trainer_on_another(slurm, tmp_path):
    result, run_dir = slurm_run(slurm, tmp_path, "recipe=tiny-cpu-server", "cluster.nodes=2",
                                "placement.trainer_nodes=1", "trainer.max_steps=3")
    assert result.returncode == 0, result.stdout[-4000:]
    plan = (run_dir / "plan.json").read_text()
    assert '"node": 1' in plan
    assert "vllm is ready" in (run_dir / "logs" / "step-trainer-0.out").read_text()  # gated on /health
    assert read_metrics(run_dir).training[-1]["step"] == 3
    # TRL's GRPOTrainer against the real server on the other node: every step generated with the weights of the
    # step before (through files and vLLM's reload), and after the run the server serves the final weights.
    assert_generation_followed_training(run_dir, steps=3)
    assert SYNC_CHECK.findall((run_dir / "logs" / "trainer.log").read_text()) == ["server"]
    assert (run_dir / "weight-sync" / "model.safetensors").is_file()
    assert "stopping" in (run_dir / "logs" / "step-services-0.out").read_text()  # servers stop with training
    assert_no_job_process_left(slurm)


def test_a_failing_job_passes_its_code_on(slurm, tmp_path):
    """Every rank's worker exits 7. torchrun (and accelerate) report 1 and srun the highest code of a step's
    tasks; the job's code is still the workers' own 7."""
    (tmp_path / "die.py").write_text("import os\n\n\ndef reward(completions, **kwargs):\n    os._exit(7)\n")
    result, run_dir = slurm_run(slurm, tmp_path, "cluster.nodes=2", "cluster.gpus_per_node=1",
                                f"rewards=[{{fn:{tmp_path / 'die.py'}:reward}}]")
    out = result.stdout
    assert result.returncode == 7, out[-4000:]
    assert f"Slurm job {job_id(out)}: FAILED" in out
    assert re.search(r"failed: trainer-node[01] exited with code 7", out)
    assert "grpo: job ends with exit code 7" in (run_dir / "logs" / "job.log").read_text()
    assert_no_job_process_left(slurm)


def test_ctrl_c_cancels_the_job(slurm, tmp_path):
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "scheduler=slurm", "cluster.nodes=2", "cluster.gpus_per_node=1",
           "trainer.max_steps=500", f"run.main_process_port={free_port()}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **RUN_ENV, **slurm.env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "trainer-node1 │ [grpo-launch] rank 1 of 2" in line:  # the job's processes run on both nodes
            break
    else:
        raise AssertionError("training never started:\n" + "".join(seen[-40:]))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    out = "".join(seen) + out
    assert proc.returncode == 130, out[-3000:]
    job = job_id(out)
    assert f"Slurm job {job}: CANCELLED" in out
    assert slurm.job_state(job) == "CANCELLED"
    assert_no_job_process_left(slurm)


def test_grpo_stop_cancels_the_job_from_another_terminal(slurm, tmp_path):
    """The job's ID is kept in the run directory: `grpo stop RUN_DIR` cancels it, and `grpo run` ends with it."""
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "scheduler=slurm", "trainer.max_steps=500",
           f"run.main_process_port={free_port()}"]
    env = {**os.environ, **RUN_ENV, **slurm.env()}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if ": RUNNING on " in line:
            break
    else:
        raise AssertionError("the job never ran:\n" + "".join(seen[-40:]))
    run_dir = next((tmp_path / "runs").glob("tiny-cpu/*"))
    stopped = subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "stop",
                              str(run_dir)], capture_output=True, text=True, env=env, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    job = job_id("".join(seen))
    assert f"cancelled Slurm job {job}" in stopped.stdout
    out, _ = proc.communicate(timeout=120)
    assert f"Slurm job {job}: CANCELLED" in out and proc.returncode != 0
    assert_no_job_process_left(slurm)


def flaky_scontrol(tmp_path, cluster, fail: str) -> dict:
    """The cluster's environment with an `scontrol` first on PATH that answers `show job` as the real one does but
    for the calls `fail` names (a Python expression of `n`, the call's number from 1): those fail as slurmctld under
    load fails them. Everything else is the real scontrol (the job's own scripts call it too)."""
    real = subprocess.run(["bash", "-c", "command -v scontrol"], env=cluster.env(), capture_output=True,
                          text=True).stdout.strip()
    bin_dir = tmp_path / "flaky-bin"
    bin_dir.mkdir()
    counter = tmp_path / "show-job-calls"
    (bin_dir / "scontrol").write_text(f"""#!/usr/bin/env python3
import os, sys
if "job" in sys.argv[1:4] and "show" in sys.argv[1:4]:
    with open({str(counter)!r}, "a") as f:
        f.write(".")
    n = os.path.getsize({str(counter)!r})
    if {fail}:
        with open({str(tmp_path / "show-job-failed")!r}, "a") as f:
            f.write(".")
        print("slurm_load_jobs error: Socket timed out on send/recv operation", file=sys.stderr)
        sys.exit(1)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
""")
    (bin_dir / "scontrol").chmod(0o755)
    env = cluster.env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


@pytest.mark.fault
def test_a_controller_that_times_out_mid_run_does_not_end_the_run(slurm, tmp_path):
    """Issue 27, 2: one `scontrol show job` that failed after the first poll (slurmctld's "Socket timed out", common
    under load) was taken for the record aged out: `grpo run` said failed and exited 1 while the job ran on."""
    env = flaky_scontrol(tmp_path, slurm, "2 <= n <= 4")
    result, run_dir = grpo_run(tmp_path, "scheduler=slurm", f"run.main_process_port={free_port()}",
                               "trainer.max_steps=3", env=env, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    assert "Slurm's controller: scontrol -o show failed: slurm_load_jobs error: Socket timed out" in out
    assert "Slurm's controller answers again" in out and f"Slurm job {job_id(out)}: COMPLETED" in out
    metrics = read_metrics(run_dir)
    record_fault(FaultRow("2 scontrol fails mid-run (Socket timed out)", injected(tmp_path), FINISHED,
                          FINISHED if result.returncode == 0 else f"exit {result.returncode}",
                          steps_lost=steps_lost([r["step"] for r in metrics.training], 3),
                          records_lost=records_lost(metrics, 3), billing=len(job_processes_left(slurm))))


@pytest.mark.fault
def test_a_controller_silent_past_the_bound_leaves_the_job_running_and_says_so(slurm, tmp_path):
    """Never cancelled for the control plane's silence: `grpo run` stops following (exit 75), says the job may still
    run and how to end it; `grpo stop` ends it once Slurm answers."""
    env = flaky_scontrol(tmp_path, slurm, "n >= 3")
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "scheduler=slurm", "trainer.max_steps=500",
           f"run.main_process_port={free_port()}", "scheduler.control_plane_timeout_s=4", "scheduler.slurm.poll_s=0.5"]
    done = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, **RUN_ENV, **env}, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout
    job = job_id(out)
    assert done.returncode == 75, out[-4000:]
    assert f"left as it is, maybe running: Slurm job {job}: Slurm's controller has answered nothing" in out
    assert slurm.job_state(job) in ("PENDING", "RUNNING")
    run_dir = next((tmp_path / "runs").glob("tiny-cpu/*"))
    stopped = subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "stop",
                              str(run_dir)], capture_output=True, text=True, env={**os.environ, **slurm.env()},
                             timeout=120)
    assert stopped.returncode == 0 and f"cancelled Slurm job {job}" in stopped.stdout, stopped.stdout
    record_fault(FaultRow("2 scontrol silent past the bound", injected(tmp_path), LEFT_RUNNING, LEFT_RUNNING,
                          billing=len(job_processes_left(slurm))))


@pytest.mark.fault
def test_grpo_stop_cancels_a_job_of_the_run_whose_submission_was_lost(slurm, tmp_path):
    """Issue 27, 15: a job the controller accepted while sbatch's answer was lost (it timed out) was in no record:
    it billed until its time limit. Every job carries the run's label; `grpo stop` cancels those the run does not
    know, as `grpo run` does when sbatch does not answer."""
    from grpo_launch.contracts.schedulers import run_label

    result, run_dir = slurm_run(slurm, tmp_path, "trainer.max_steps=2")
    assert result.returncode == 0, result.stdout[-3000:]
    stray = slurm.run(["sbatch", "--parsable", f"--comment={run_label(run_dir)}", f"--output={tmp_path}/stray.out",
                       "--wrap", "sleep 300"]).stdout
    stray = stray.strip().split(";")[0]
    stopped = subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "stop",
                              str(run_dir)], capture_output=True, text=True, env={**os.environ, **slurm.env()},
                             timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"cancelled Slurm job {stray}: it carries this run's label" in stopped.stdout
    deadline = time.time() + 30
    while slurm.job_state(stray) not in ("CANCELLED", "gone") and time.time() < deadline:
        time.sleep(0.5)
    record_fault(FaultRow("15 Slurm job whose submission was lost", 1, FINISHED, FINISHED,
                          billing=int(slurm.job_state(stray) not in ("CANCELLED", "gone"))))


def test_a_slurm_command_that_hangs_is_a_transient_answer():
    """A 60 s timeout of `scontrol` crashed the follower (subprocess.TimeoutExpired): now it is asked again."""
    from grpo_launch.launch.control_plane import Transient
    from grpo_launch.launch.schedulers.slurm import JobGone, slurm_command

    with pytest.raises(Transient, match="did not answer within 0.5 s"):
        slurm_command(["sleep", "5"], dict(os.environ), timeout_s=0.5)
    with pytest.raises(JobGone):
        slurm_command(["bash", "-c", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"],
                      dict(os.environ))
