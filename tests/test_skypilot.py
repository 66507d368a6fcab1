"""scheduler=skypilot, offline: SkyPilot's own loader accepts the task, and its `run:` script, replayed on this
machine for 2 nodes with the SKYPILOT_* variables SkyPilot sets, trains."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sky_standin
import yaml
from conftest import ROOT, RUN_ENV, free_port, grpo, grpo_run, plan_json
from fault_matrix import FINISHED, FaultRow, record_fault

from grpo_launch.contracts.rundir import Submitted, read_metrics, read_submitted, write_submitted
from grpo_launch.contracts.schedulers import SKYPILOT_CLUSTER_LENGTH, SKYPILOT_NAME, skypilot_cluster
from grpo_launch.errors import UserError

# `make test` installs SkyPilot in an environment of its own (Makefile: SKY_VENV)
SKY_PYTHON = Path(os.environ.get("GRPO_SKYPILOT_PYTHON", ROOT / ".cache" / "skypilot" / "bin" / "python"))
OLD = Path(__file__).parent / "data" / "run-dirs-8b4bc63"  # run directories the previous release wrote


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
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert f"cd {run_dir} && sky launch --yes --cluster {cluster} --down task.yaml" in result.stdout
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


# -- the launcher, against a stand-in of the `sky` command line (tests/sky_standin.py: no cloud is reachable here) --

STANDIN = Path(__file__).parent / "sky_standin.py"


class Sky:
    """The `sky` stand-in on PATH (and, as rsync's ssh, node 0 of each of its clusters): what it was asked, its
    clusters, and the job the next `sky launch` runs."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "sky"
        bin_dir = tmp_path / "sky-bin"
        bin_dir.mkdir()
        for name, extra in (("sky", ""), ("ssh", " --as-ssh")):
            (bin_dir / name).write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN}{extra} "$@"\n')
            (bin_dir / name).chmod(0o755)
        self.env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GRPO_SKY_STANDIN": str(self.root),
                    "RSYNC_RSH": str(bin_dir / "ssh")}
        self.root.mkdir()

    def job(self, what: str, **flaky: int) -> None:
        """What the next launch's job does; `flaky`: how many times each command fails first."""
        (self.root / "scenario.json").write_text(json.dumps({"job": what, "flaky": flaky}))

    def calls(self) -> list[list[str]]:
        path = self.root / "calls.jsonl"
        return [json.loads(line)["argv"] for line in path.read_text().splitlines()] if path.exists() else []

    def clusters(self) -> dict:
        path = self.root / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def add_cluster(self, name: str, *statuses: str) -> None:
        """A cluster with jobs 1.. in `statuses`, launched by someone else."""
        jobs = [{"job_id": i, "job_name": name, "username": "me", "user_hash": "abcd1234", "submitted_at": 1.0,
                 "start_at": 1.0, "end_at": None, "resources": "1x[A10G:1]", "status": status, "log_path": "x"}
                for i, status in enumerate(statuses, 1)]
        (self.root / "state.json").write_text(json.dumps({**self.clusters(), name: {"status": "UP", "jobs": jobs}}))


@pytest.fixture
def sky(tmp_path):
    if shutil.which("sky", path=os.environ["PATH"]):
        pytest.skip("SkyPilot is on this PATH: the stand-in must not hide it")
    return Sky(tmp_path)


def sky_run(tmp_path, sky: Sky, *overrides: str, name: str = "run"):
    """`grpo run scheduler=skypilot` of tiny-cpu into tmp_path/NAME, through the stand-in."""
    run_dir = tmp_path / name
    result, _ = grpo_run(tmp_path, "scheduler=skypilot", f"run.dir={run_dir}", *overrides, env=sky.env, timeout=300)
    return result, run_dir


def test_runs_of_one_recipe_get_clusters_of_their_own(tmp_path):
    """Issue 27, 13: every run of a recipe shared the cluster grpo-<recipe> (and its ~/sky_workdir): run B resumed
    from run A's checkpoints. A sweep's run directories share their names' first 20-odd characters."""
    from grpo_launch.compose import compose
    from grpo_launch.launch.schedulers import LAUNCHERS
    from grpo_launch.plan import build_plan

    plan = build_plan(compose(["recipe=qwen72b-colocate", "scheduler=skypilot", "run.node_local_checkpoints=true"]))
    launcher = LAUNCHERS["skypilot"]
    prefix = "sweep-lr1e-5-warmup0.03-" + "x" * 30
    commands = [launcher.submit_command(plan, tmp_path / f"{prefix}-bs{bs}") for bs in (64, 128)]
    clusters = [c[c.index("--cluster") + 1] for c in commands]
    assert clusters[0] != clusters[1]
    for cluster in clusters:
        assert cluster.startswith("grpo-qwen72b-colocate-sweep-lr1e-5") and len(cluster) <= SKYPILOT_CLUSTER_LENGTH
        assert SKYPILOT_NAME.fits(cluster)
    assert plan.scheduler.cluster == "grpo-qwen72b-colocate-<run>-<hash>"  # what `grpo plan` shows
    # The same directory, however it is named (a symlink, a path through ..), is the same run: its cluster again.
    (tmp_path / f"{prefix}-bs64").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / f"{prefix}-bs64", target_is_directory=True)
    assert skypilot_cluster(plan.recipe, tmp_path / "link") == clusters[0]
    assert skypilot_cluster(plan.recipe, tmp_path / "link" / ".." / f"{prefix}-bs64") == clusters[0]


@pytest.mark.parametrize(("overrides", "teardown"), [
    ((), ["--down"]),
    (("scheduler.skypilot.idle_minutes_to_autostop=30",), ["--down", "--idle-minutes-to-autostop", "30"]),
    (("scheduler.skypilot.down=false", "scheduler.skypilot.idle_minutes_to_autostop=10"),
     ["--idle-minutes-to-autostop", "10"]),
    (("scheduler.skypilot.down=false",), []),
])
def test_the_launch_says_how_the_cluster_ends(overrides, teardown):
    """Issue 27, 13: no --down nor autostop was passed, so the cluster billed on after the run ended."""
    plan = plan_json("recipe=tiny-cpu", "scheduler=skypilot", *overrides)
    submit = plan["scheduler"]["submit"]
    assert submit[:5] == ["sky", "launch", "--yes", "--cluster", "grpo-tiny-cpu-<run>-<hash>"]
    assert submit[5:] == [*teardown, "task.yaml"]


def test_a_cluster_the_recipe_names_is_used_as_named(tmp_path):
    from grpo_launch.compose import compose
    from grpo_launch.launch.schedulers import LAUNCHERS
    from grpo_launch.plan import build_plan

    plan = build_plan(compose(["recipe=tiny-cpu", "scheduler=skypilot", "scheduler.skypilot.cluster_name=mine"]))
    assert LAUNCHERS["skypilot"].submit_command(plan, tmp_path / "a") == \
        ("sky", "launch", "--yes", "--cluster", "mine", "--down", "task.yaml")


@pytest.mark.fault
def test_a_run_launches_on_its_own_cluster_brings_its_metrics_here_and_takes_the_cluster_down(tmp_path, sky):
    sky.job("succeeds")
    sky.add_cluster("grpo-tiny-cpu", "RUNNING")  # an earlier release's run of the recipe, still going
    result, run_dir = sky_run(tmp_path, sky)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    launch, *rest = sky.calls()
    assert launch == ["sky", "launch", "--yes", "--cluster", cluster, "--down", "task.yaml"]
    assert read_submitted(run_dir).ids == (cluster, "1")  # the job's ID, for `grpo stop`
    assert rest == [["sky", "down", "--yes", cluster]]
    assert set(sky.clusters()) == {"grpo-tiny-cpu"}  # nothing of this run bills; the other run goes on
    assert sky.clusters()["grpo-tiny-cpu"]["jobs"][0]["status"] == "RUNNING"
    if shutil.which("rsync"):  # node 0's metrics and logs, brought here before its disk went with the cluster (make
        # test installs rsync; without it, `grpo run` says they stay on node 0)
        assert read_metrics(run_dir).training == [{"step": 1, "loss": 0.5}]
        assert (run_dir / "logs" / "trainer-node0.log").is_file()
    else:
        assert "rsync is not installed here: the metrics and logs stay on node 0" in result.stdout
    record_fault(FaultRow("13 SkyPilot: a run beside another run of its recipe", 1, FINISHED,
                          FINISHED if result.returncode == 0 else f"exit {result.returncode}",
                          billing=len(set(sky.clusters()) - {"grpo-tiny-cpu"})))


@pytest.mark.fault
def test_a_stream_that_breaks_off_is_followed_again_not_taken_for_the_end(tmp_path, sky):
    """SkyPilot's API server (or the network to it) drops `sky launch`'s stream while the job runs: the job is
    asked for, found running, and followed again; its end is the run's end."""
    sky.job("stream-drops")
    result, run_dir = sky_run(tmp_path, sky)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert sky.calls()[1:] == [["sky", "logs", "--status", cluster, "1"], ["sky", "logs", cluster, "1"],
                               ["sky", "down", "--yes", cluster]]
    assert "SkyPilot job 1's log: broke off (exit code 1) while the job runs; asking again" in result.stdout
    record_fault(FaultRow("13 SkyPilot: the launch's stream breaks off mid-run", 1, FINISHED,
                          FINISHED if result.returncode == 0 else f"exit {result.returncode}",
                          billing=len(sky.clusters())))


@pytest.mark.fault
def test_a_launch_whose_answer_was_lost_is_found_on_the_runs_cluster(tmp_path, sky):
    """Issue 27, 15: `sky launch` dies after SkyPilot queued the job but before it printed its ID."""
    sky.job("answer-lost")
    result, run_dir = sky_run(tmp_path, sky)
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"found SkyPilot job 1 on {cluster}" in result.stdout
    assert read_submitted(run_dir).ids == (cluster, "1")
    assert sky.calls()[1][:3] == ["sky", "queue", "--skip-finished"] and sky.clusters() == {}
    record_fault(FaultRow("15 SkyPilot launch whose answer was lost", 1, FINISHED,
                          FINISHED if result.returncode == 0 else f"exit {result.returncode}",
                          billing=len(sky.clusters())))


def test_a_setup_that_fails_leaves_no_cluster_up(tmp_path, sky):
    """SkyPilot keeps a cluster whose setup failed up, for debugging, and its autodown is not set yet."""
    sky.job("setup-fails")
    result, run_dir = sky_run(tmp_path, sky)
    assert result.returncode == 1, result.stdout[-3000:]
    assert sky.calls()[-1] == ["sky", "down", "--yes", skypilot_cluster("tiny-cpu", run_dir)]
    assert sky.clusters() == {}


def test_a_cluster_kept_or_named_by_the_recipe_is_not_taken_down(tmp_path, sky):
    sky.job("succeeds")
    result, run_dir = sky_run(tmp_path, sky, "scheduler.skypilot.down=false")
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert result.returncode == 0 and f"kept the cluster {cluster} (down: false; it bills)" in result.stdout
    assert [c[1] for c in sky.calls()] == ["launch"] and cluster in sky.clusters()
    result, _ = sky_run(tmp_path, sky, "scheduler.skypilot.cluster_name=mine", name="named")
    assert result.returncode == 0 and "SkyPilot takes it down once no job runs on it (--down)" in result.stdout
    assert sky.calls()[-1] == ["sky", "launch", "--yes", "--cluster", "mine", "--down", "task.yaml"]


@pytest.mark.fault
def test_grpo_stop_cancels_the_runs_job_by_its_id_and_takes_its_cluster_down(tmp_path, sky):
    """Issue 27, 13: `grpo stop` ran `sky cancel --all` on the recipe's cluster, cancelling every run there."""
    sky.job("runs")
    sky.add_cluster("grpo-tiny-cpu", "RUNNING")  # another run, on another cluster
    run_dir = tmp_path / "run"
    output = (tmp_path / "grpo-run.out").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
                             "scheduler=skypilot", f"run.dir={run_dir}"], cwd=tmp_path, stdout=output,
                            stderr=subprocess.STDOUT, env={**os.environ, **RUN_ENV, **sky.env})
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and len(submitted_ids(run_dir)) < 2:
        time.sleep(0.1)  # until `grpo run` has recorded the job's ID
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert submitted_ids(run_dir) == (cluster, "1"), (tmp_path / "grpo-run.out").read_text()[-3000:]
    stopped = grpo("stop", str(run_dir), env={**RUN_ENV, **sky.env}, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"cancelled SkyPilot job 1 on {cluster}" in stopped.stdout
    assert f"took down the cluster {cluster}, the run's own" in stopped.stdout
    assert proc.wait(timeout=120) == 103, (tmp_path / "grpo-run.out").read_text()[-3000:]  # CANCELLED
    stops = [c for c in sky.calls() if c[1] != "launch"]
    assert stops[0] == ["sky", "cancel", "--yes", cluster, "1"] and ["sky", "down", "--yes", cluster] in stops
    assert not any("--all" in c for c in sky.calls())
    assert set(sky.clusters()) == {"grpo-tiny-cpu"}
    assert sky.clusters()["grpo-tiny-cpu"]["jobs"][0]["status"] == "RUNNING"  # the other run goes on
    record_fault(FaultRow("13 SkyPilot: grpo stop of one run among others", 1, FINISHED,
                          FINISHED if stopped.returncode == 0 else f"exit {stopped.returncode}",
                          billing=len(set(sky.clusters()) - {"grpo-tiny-cpu"})))


def test_grpo_stop_of_a_kept_cluster_cancels_the_jobs_the_run_does_not_know(tmp_path, sky):
    """Issue 27, 15: a job on the run's own cluster that the run does not know (a launch whose answer was lost) is
    cancelled by its ID; the cluster is kept, as the run's setting says."""
    sky.job("succeeds")
    result, run_dir = sky_run(tmp_path, sky, "scheduler.skypilot.down=false")
    assert result.returncode == 0, result.stdout[-3000:]
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    sky.add_cluster(cluster, "SUCCEEDED", "RUNNING")
    stopped = grpo("stop", str(run_dir), env={**RUN_ENV, **sky.env}, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "cancelled SkyPilot job 2: on the run's own cluster, its launch's answer lost" in stopped.stdout
    assert f"kept the cluster {cluster}: `sky down {cluster}` takes it down" in stopped.stdout
    assert [c[1:] for c in sky.calls()[1:]] == [["cancel", "--yes", cluster, "1"],
                                                ["queue", "--skip-finished", "--output", "json", cluster],
                                                ["cancel", "--yes", cluster, "2"]]
    assert [j["status"] for j in sky.clusters()[cluster]["jobs"]] == ["SUCCEEDED", "CANCELLED"]


@pytest.mark.fault
def test_skypilots_control_plane_is_asked_again_through_its_transient_failures(tmp_path, sky):
    """Its API server unreachable for a while: the job's state, the cancel, the queue and the teardown are asked
    again (said so), never taken for an answer."""
    sky.job("stream-drops", logs=2, down=1)  # `sky logs --status` twice, `sky down` once
    result, run_dir = sky_run(tmp_path, sky)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "SkyPilot: `sky logs --status" in result.stdout and "Could not connect to SkyPilot API server" in \
        result.stdout and "asking again in" in result.stdout
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    assert [c[1] for c in sky.calls()] == ["launch", "logs", "logs", "logs", "logs", "down", "down"]
    assert sky.clusters() == {}
    sky.job("runs", cancel=2)
    sky.add_cluster(cluster, "RUNNING")
    write_submitted(run_dir, Submitted("skypilot", (cluster, "1"), 1.0))
    stopped = grpo("stop", str(run_dir), env={**RUN_ENV, **sky.env}, cwd=tmp_path)
    assert stopped.returncode == 0 and f"cancelled SkyPilot job 1 on {cluster}" in stopped.stdout, stopped.stdout
    assert [c[1] for c in sky.calls()].count("cancel") == 3 and sky.clusters() == {}
    record_fault(FaultRow("13 SkyPilot's API server unreachable a while", 5, FINISHED,
                          FINISHED if result.returncode == stopped.returncode == 0 else "failed",
                          billing=len(sky.clusters())))


def test_a_resume_while_the_runs_job_still_runs_is_refused(tmp_path, sky):
    """Issue 27, 11 on SkyPilot: `grpo run` is gone (killed, its machine down) but its job runs on: SkyPilot's own
    record of it refuses a second launch into the run directory."""
    sky.job("succeeds")
    result, run_dir = sky_run(tmp_path, sky, "scheduler.skypilot.down=false")
    assert result.returncode == 0, result.stdout[-3000:]
    cluster = skypilot_cluster("tiny-cpu", run_dir)
    sky.add_cluster(cluster, "RUNNING")
    again = grpo("run", "--resume", str(run_dir), "--from-scratch", env={**RUN_ENV, **sky.env}, cwd=tmp_path)
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"is running: SkyPilot job 1 on {cluster}, which an earlier `grpo run` submitted" in again.stderr
    assert [c[1] for c in sky.calls()] == ["launch", "logs"]  # `sky logs --status`, nothing launched


def submitted_ids(run_dir: Path) -> tuple[str, ...]:
    try:
        return read_submitted(run_dir).ids
    except UserError:
        return ()


def test_grpo_stop_on_a_previous_releases_run_cancels_nothing_blindly(tmp_path, sky, capsys):
    """The previous release kept only the cluster, grpo-<recipe>, shared by every run of the recipe: which job is
    this run's is not known, so none is cancelled; the user is told which run there and how to cancel one."""
    from grpo_launch.cli import main

    run_dir = shutil.copytree(OLD / "qwen7b-server-skypilot", tmp_path / "old")
    write_submitted(run_dir, Submitted("skypilot", ("grpo-qwen7b-server",), 1.0))  # as that release wrote it
    sky.add_cluster("grpo-qwen7b-server", "SUCCEEDED", "RUNNING", "RUNNING")
    with pytest.MonkeyPatch.context() as env:
        for key, value in sky.env.items():
            env.setenv(key, value)
        assert main(["stop", str(run_dir)]) == 1
        out = capsys.readouterr().out
        assert "SkyPilot job(s) 2, 3 run there" in out and "sky cancel grpo-qwen7b-server ID" in out
        assert [c[1] for c in sky.calls()] == ["queue"]
        sky.add_cluster("grpo-qwen7b-server", "SUCCEEDED")
        assert main(["stop", str(run_dir)]) == 0
        assert "nothing to stop" in capsys.readouterr().out


def test_the_standins_commands_are_skypilots(tmp_path, sky):
    """What the stand-in is given, SkyPilot 0.14.1's own command line takes (its click commands parse each
    call), and what grpo-launch reads from its answers is what SkyPilot prints and exits with."""
    if not SKY_PYTHON.exists():  # a failure in CI (conftest: GRPO_NO_SKIPS)
        pytest.skip(f"SkyPilot is not installed at {SKY_PYTHON}")
    from grpo_launch.launch.schedulers import skypilot as launcher

    for what in ("succeeds", "stream-drops", "answer-lost"):
        sky.job(what)
        assert sky_run(tmp_path, sky, name=what)[0].returncode == 0
    calls = sky.calls() + [["sky", "cancel", "--yes", "c", "1", "2"]]
    code = """import inspect, json, sys
from sky import exceptions
from sky.backends import backend_utils, cloud_vm_ray_backend
from sky.client.cli import command
from sky.skylet import constants
from sky.utils import ux_utils
parsed = []
for argv in json.loads(sys.argv[1]):
    ctx = command.cli.commands[argv[1]].make_context(argv[1], argv[2:])
    parsed.append({k: v for k, v in ctx.params.items() if isinstance(v, (bool, int, str, list, tuple))})
print(json.dumps({"parsed": parsed, "cluster_regex": constants.CLUSTER_NAME_VALID_REGEX,
                  "codes": {c.name: int(c) for c in exceptions.JobExitCode},
                  "submitted": ux_utils.starting_message("Job submitted, ID: 7"),
                  "sources": inspect.getsource(backend_utils.check_cluster_available)
                             + inspect.getsource(command) + inspect.getsource(cloud_vm_ray_backend)}))
"""
    done = subprocess.run([str(SKY_PYTHON), "-c", code, json.dumps(calls)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    launch = facts["parsed"][0]
    assert launch["down"] is True and launch["yes"] is True and launch["cluster"].startswith("grpo-tiny-cpu-")
    assert list(launch["entrypoint"]) == ["task.yaml"] and re.fullmatch(facts["cluster_regex"], launch["cluster"])
    for argv, params in zip(calls, facts["parsed"], strict=True):
        if argv[1] == "logs":
            assert params["status"] == ("--status" in argv) and list(params["job_ids"]) == [argv[-1]]
        if argv[1] == "cancel":
            assert params["all"] is False and params["yes"] is True
        if argv[1] == "queue":
            assert params["skip_finished"] is True and params["output_format"] == "json"
    assert facts["codes"] == {"SUCCEEDED": launcher.SUCCEEDED, "FAILED": launcher.FAILED,
                              "NOT_FINISHED": launcher.NOT_FINISHED, "NOT_FOUND": launcher.NOT_FOUND,
                              "CANCELLED": launcher.CANCELLED}
    assert facts["submitted"] == f"{sky_standin.RESET}⚙︎ Job submitted, ID: 7"  # what the stand-in prints
    assert launcher.JOB_SUBMITTED.search(launcher.ANSI.sub("", facts["submitted"])).group(1) == "7"
    sources = re.sub(r"'\s*\n\s*f?'", "", facts["sources"])  # adjacent string literals joined
    for words in (*launcher.NO_CLUSTER, *launcher.DOWN_DONE):
        assert words.replace("STOPPED)", "{cluster_status.value})") in sources, words
