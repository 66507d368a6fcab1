"""Several nodes on this machine, for real: one launcher per node (accelerate --machine_rank K, torchrun
--node_rank K) started by one `grpo run`, rendezvousing over loopback; real TRL training on the tiny model."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import RUN_ENV, free_port, grpo_run

from grpo_launch.contracts.rundir import read_metrics

pytestmark = pytest.mark.slow
STEPS = 3


def ranks(run_dir: Path, process: str) -> set[tuple[int, int]]:
    text = (run_dir / "logs" / f"{process}.log").read_text()
    return {(int(r), int(n)) for r, n in re.findall(r"\[grpo-launch\] rank (\d+) of (\d+)", text)}


CASES = {
    # name: (overrides, ranks per node). accelerate's DDP across 2 nodes runs in test_slurm and test_skypilot.
    "torchrun-ddp": (["launcher=torchrun"], 1),
    # DeepSpeed across machines: accelerate.yaml needs deepspeed_multinode_launcher=standard, else every
    # `accelerate launch --machine_rank K` becomes DeepSpeed's pdsh runner and no node trains.
    "accelerate-zero2": (["zero=2"], 1),
    # ZeRO-3 with optimizer offload through accelerate on 2 nodes: the rehearsal of qwen72b-colocate
    # (test_rehearse), with vLLM colocated in each rank too.
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_loopback_nodes_train(tmp_path, case):
    overrides, per_node = CASES[case]
    # torchrun's PET_* variables would reconfigure it (c10d at a dead endpoint): grpo run clears them.
    stray = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "127.0.0.1:1"}
    result, run_dir = grpo_run(tmp_path, "recipe=tiny-cpu", "cluster.nodes=2", f"cluster.gpus_per_node={per_node}",
                               f"trainer.max_steps={STEPS}", f"run.main_process_port={free_port()}", *overrides,
                               env=stray)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "cleared PET_RDZV_BACKEND, PET_RDZV_ENDPOINT for every process" in result.stdout
    world = 2 * per_node
    # every rank really runs, each on its own node's launcher
    assert ranks(run_dir, "trainer-node0") == {(r, world) for r in range(per_node)}
    assert ranks(run_dir, "trainer-node1") == {(r, world) for r in range(per_node, world)}
    assert read_metrics(run_dir).training[-1]["step"] == STEPS


def _started(line: str) -> tuple[str, int] | None:
    found = re.search(r"started (\S+) \(pid (\d+)", line)
    return (found.group(1), int(found.group(2))) if found else None


def test_killing_one_node_launcher_stops_the_other(tmp_path):
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           f"run.root={tmp_path / 'runs'}", "cluster.nodes=2", "cluster.gpus_per_node=1", "trainer.max_steps=500",
           "launcher=torchrun", f"run.main_process_port={free_port()}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, **RUN_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    launchers, seen = {}, []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if started := _started(line):
            launchers[started[0]] = started[1]
        if "trainer-node1 │ [grpo-launch] rank 1 of 2" in line:  # both nodes joined: the process group is up
            break
    else:
        proc.kill()
        raise AssertionError("training did not start:\n" + "".join(seen[-50:]))
    every = {p.pid for pid in launchers.values() for p in [psutil.Process(pid), *psutil.Process(pid).children(True)]}
    os.kill(launchers["trainer-node1"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, out[-3000:]
    assert "failed: trainer-node1 exited with code 137" in out
    deadline = time.time() + 10
    while time.time() < deadline and (alive := [p for p in every if psutil.pid_exists(p)
                                                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]):
        time.sleep(0.2)
    assert not alive, f"left running: {alive}"


@pytest.mark.parametrize(("node", "says"), [(0, "did not complete within 4"), (1, "did not answer within 4")])
def test_a_rendezvous_that_cannot_complete_fails_in_time(tmp_path, node, says):
    """`grpo run --node-rank K` with the other node never started: it fails within the stated timeout, naming
    the rendezvous and the key that sets the timeout, instead of hanging."""
    port = free_port()
    started = time.monotonic()
    # No model to build: a directory with a config.json and no weights passes the pre-flight check, and the
    # launchers' rendezvous fails before any worker would load it.
    (model := tmp_path / "no-weights").mkdir()
    (model / "config.json").write_text("{}")
    result, run_dir = grpo_run(tmp_path, "--node-rank", str(node), "cluster.nodes=2", "cluster.gpus_per_node=1",
                               "launcher=torchrun", f"model.name_or_path={model}",
                               f"run.main_process_port={port}", "run.rendezvous_timeout_s=4",
                               f"run.dir={tmp_path / 'run'}", timeout=120)
    took = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-3000:]
    assert f"rendezvous at 127.0.0.1:{port} {says} s (run.rendezvous_timeout_s)" in result.stdout
    assert took < 40, took
