"""scheduler=skypilot, offline: SkyPilot's own loader accepts the task, and its `run:` script, replayed on this
machine for 2 nodes with the SKYPILOT_* variables SkyPilot sets, trains."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, RUN_ENV, free_port, grpo_run, plan_json

from grpo_launch.contracts.rundir import read_metrics

# `make test` installs SkyPilot in an environment of its own (Makefile: SKY_VENV)
SKY_PYTHON = Path(os.environ.get("GRPO_SKYPILOT_PYTHON", ROOT / ".cache" / "skypilot" / "bin" / "python"))


def test_skypilot_loads_the_task(tmp_path):
    if not SKY_PYTHON.exists():  # a failure in CI (conftest: GRPO_NO_SKIPS)
        pytest.skip(f"SkyPilot is not installed at {SKY_PYTHON} (`make test` installs it; or set GRPO_SKYPILOT_PYTHON)")
    plan = plan_json("recipe=qwen72b-server", "scheduler=skypilot", "scheduler.skypilot.cloud=aws",
                     "scheduler.skypilot.use_spot=true", "scheduler.setup=['pip install grpo-launch']",
                     "trainer.output_dir=/shared/checkpoints")
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(plan["files"]["task.yaml"]))
    code = ("import json, sys, sky; t = sky.Task.from_yaml(sys.argv[1]); (r,) = t.resources; "
            "print(json.dumps({'num_nodes': t.num_nodes, 'run': t.run, 'setup': t.setup, 'workdir': t.workdir, "
            "'cloud': str(r.cloud), 'accelerators': r.accelerators, 'spot': r.use_spot}))")
    done = subprocess.run([str(SKY_PYTHON), "-c", code, str(tmp_path / "task.yaml")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    task = json.loads(done.stdout.strip().splitlines()[-1])
    assert task["num_nodes"] == 5 and task["run"] == plan["files"]["task.yaml"]["run"]
    assert task["setup"] == "pip install grpo-launch\n" and task["workdir"] == "."
    assert (task["cloud"].lower(), task["accelerators"], task["spot"]) == ("aws", {"H100": 8}, True)


@pytest.mark.slow
def test_the_run_script_replayed_on_two_loopback_nodes_trains(tmp_path):
    """What SkyPilot does on each node: the workdir (the run directory) copied to the node, then `run:` with
    SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS set."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join([bin_dir, "/usr/bin", "/bin"])
    if shutil.which("sky", path=path):
        pytest.skip("SkyPilot is on this PATH: `grpo run scheduler=skypilot` would launch for real")
    result, run_dir = grpo_run(tmp_path, "scheduler=skypilot", "cluster.nodes=2", "cluster.gpus_per_node=1",
                               "trainer.max_steps=3", f"run.main_process_port={free_port()}", env={"PATH": path})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "SkyPilot is not installed here: nothing launched" in result.stdout  # and it says how
    assert f"cd {run_dir} && sky launch --yes --cluster grpo-tiny-cpu task.yaml" in result.stdout
    run = yaml.safe_load((run_dir / "task.yaml").read_text())["run"]
    nodes = []
    for rank in (0, 1):
        workdir = tmp_path / f"node{rank}" / "sky_workdir"
        shutil.copytree(run_dir, workdir)
        env = {**os.environ, **RUN_ENV, "PATH": path, "SKYPILOT_NODE_RANK": str(rank),
               "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n", "SKYPILOT_NUM_NODES": "2"}
        nodes.append(subprocess.Popen(["bash", "-c", run], cwd=workdir, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, out in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-3000:]
    head, other = (tmp_path / f"node{rank}" / "sky_workdir" for rank in (0, 1))
    assert "[grpo-launch] rank 1 of 2" in (other / "logs" / "trainer-node1.log").read_text()
    assert read_metrics(head).training[-1]["step"] == 3  # results stay on the nodes (node 0 logs the metrics)
