"""scheduler=hf-jobs end to end: `grpo run` submits, waits on, follows and cancels real Jobs through huggingface_hub's
own client, against the local stand-in for the Jobs API (tests/hf_jobs_standin.py: each Job a real process, its real
command, in network and mount namespaces of its own; bucket transfers copied, tests/hf_jobs_cli.py). The vLLM
replicas are real `vllm serve` engines (vLLM's CPU build) as Jobs; the trainer Job runs grpo-launch's node
supervisor with the routing proxy and the trainer. The Jobs' "image" is this machine's environment, which has
grpo-launch already (scheduler.hf_jobs.install_wheel=false: a Job here must not pip-install into the shared
environment; test_hf_jobs_plan.py checks the wheel)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RUN_ENV, grpo
from hf_jobs_standin import StandIn, missing

from grpo_launch.compose import compose
from grpo_launch.contracts.rundir import read_metrics
from grpo_launch.contracts.schedulers import run_group
from grpo_launch.launch import prepared
from grpo_launch.materialize import materialize
from grpo_launch.plan import build_plan

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_standin_token"
ONE_REPLICA = ["placement.async_lora.replicas=1", "cluster.gpus_per_node=2"]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    if reason := missing():
        pytest.skip(reason)  # a failure in CI (conftest: GRPO_NO_SKIPS)
    image = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/sbin", "/usr/local/bin",
                                      "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
             "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT),
             "TORCH_EXTENSIONS_DIR": RUN_ENV["TORCH_EXTENSIONS_DIR"]}
    server = StandIn(tmp_path_factory.mktemp("hf-jobs-standin"), image_env=image)
    server.start()
    yield server
    server.stop()


class Run:
    """`grpo run recipe=tiny-cpu-async-lora scheduler=hf-jobs ...` in the background, its output in a file."""

    def __init__(self, standin: StandIn, tmp_path: Path, *args: str) -> None:
        self.standin, self.tmp_path = standin, tmp_path
        self.output = tmp_path / "grpo-run.out"
        self.env = {**os.environ, **RUN_ENV, "HF_ENDPOINT": standin.endpoint, "HF_TOKEN": TOKEN,
                    "GRPO_STANDIN_ROOT": str(standin.root), "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, str(ROOT / "tests" / "hf_jobs_cli.py"), "run", "recipe=tiny-cpu-async-lora",
               "scheduler=hf-jobs", f"run.root={tmp_path / 'runs'}", f"scheduler.hf_jobs.mount_path={tmp_path / 'mnt'}",
               "scheduler.hf_jobs.install_wheel=false", *args]
        self.started = time.time()
        with self.output.open("w") as out:
            self.process = subprocess.Popen(cmd, cwd=tmp_path, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for(self, what, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline and self.process.poll() is None:
            if what():
                return
            time.sleep(0.2)
        raise AssertionError(f"never happened (grpo run {'ended' if self.process.poll() is not None else 'runs'}):\n"
                             + self.text()[-4000:])

    def end(self, timeout: float = 300) -> str:
        self.process.wait(timeout=timeout)
        return self.text()

    @property
    def run_dir(self) -> Path:
        return next((self.tmp_path / "runs" / "tiny-cpu-async-lora").iterdir())

    def bucket_metrics(self) -> list[dict]:
        """The records the trainer Job wrote so far, in the bucket's copy of the run directory."""
        if not (self.tmp_path / "runs" / "tiny-cpu-async-lora").is_dir():
            return []
        found = list(self.standin.root.glob(f"buckets/*/grpo-runs/*{self.run_dir.name}/metrics.jsonl"))
        return [json.loads(line) for line in found[0].read_text().splitlines() if line] if found else []


@pytest.fixture
def start(standin, tmp_path):
    """Start `grpo run` in the background; a run a failing test leaves is interrupted (its Jobs cancelled)."""
    runs = []

    def started(*args: str) -> Run:
        runs.append(Run(standin, tmp_path, *args))
        return runs[-1]

    yield started
    for run in runs:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
            try:
                run.process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                run.process.kill()


def jobs_of(run: Run, name: str) -> list:
    """The stand-in's Jobs of this run named `name`, in submit order."""
    if not (run.tmp_path / "runs" / "tiny-cpu-async-lora").is_dir():
        return []
    group = run_group("tiny-cpu-async-lora", run.run_dir)
    return [j for j in run.standin.by_name(name) if j.spec["labels"]["grpo-run"] == group]


def job_of(run: Run, name: str):
    (job,) = jobs_of(run, name)[:1]
    return job


def ended(run: Run, name: str) -> list[str]:
    return [j.stage for j in jobs_of(run, name)]


def assert_nothing_left(standin: StandIn, run: Run) -> None:
    """Every Job ended (none billing), no process of any Job, nor of `grpo run`, left here."""
    deadline = time.time() + 30
    while time.time() < deadline and (standin.processes_left() or any(not j.ended for j in standin.jobs.values())):
        time.sleep(0.2)
    assert all(j.ended for j in standin.jobs.values()), [(j.id, j.stage) for j in standin.jobs.values()]
    assert not standin.processes_left(), standin.processes_left()
    assert run.process.poll() is not None


def test_the_async_lora_recipe_runs_as_jobs_end_to_end(standin, start, tmp_path):
    """--preflight, 2 vLLM Jobs waited for on their exposed /health, the trainer Job (proxy + trainer) training 8
    steps with adapter versions loaded on both replicas through the bucket mount; a replica's machine dying mid-run is
    submitted again; at the end every Job is cancelled and the run directory comes back from the bucket."""
    before = set(standin.jobs)
    run = start("--preflight")
    run.wait_for(lambda: len(run.bucket_metrics()) >= 2, timeout=600)
    standin.crash(job_of(run, "vllm-1").id)
    out = run.end()
    assert run.process.returncode == 0, out[-5000:]
    jobs = [standin.jobs[i] for i in standin.jobs if i not in before]

    # The preflight: read-write on one Job, read-only on the other at the same path, a file seen across, reached.
    assert "preflight: mount read-write on the writer: True, read-only on the reader: True, the Jobs reach each " \
           "other: True: passed" in out
    assert "preflight: a file written by one Job is seen by the other after" in out
    assert ended(run, "preflight-writer") == ["COMPLETED"] and ended(run, "preflight-reader") == ["COMPLETED"]

    # What the library sent for each Job (the stand-in kept the request): the mount, the network, the secret.
    group = job_of(run, "trainer").spec["network"]["group"]
    mount = str(tmp_path / "mnt")
    for job in jobs:
        (volume,) = job.spec["volumes"]
        assert (volume["type"], volume["source"], volume["path"], volume["mountPath"]) == \
            ("bucket", "standin-user/grpo-runs", group, mount)
        preflight = job.spec["labels"]["name"].endswith(("-preflight-writer", "-preflight-reader"))
        assert job.spec["network"]["group"] == group
        assert job.spec.get("secrets") == (None if preflight else {"HF_TOKEN": TOKEN})  # values only in the request
        assert (job.spec["flavor"], job.spec["timeoutSeconds"]) == (("cpu-basic", 1800) if preflight else
                                                                    ("cpu-upgrade", 6 * 3600))
    for name in ("vllm-0", "vllm-1"):
        spec = job_of(run, name).spec
        assert spec["volumes"][0]["readOnly"] is True and spec["expose"] == {"ports": [8000]}
        assert spec["network"]["aliases"] == [name] and spec["command"][:2] == ["bash", "-c"]
    assert job_of(run, "trainer").spec["volumes"][0]["readOnly"] is False

    # Every Job ended: the trainer completed, the replicas cancelled; the dead one submitted again (same alias).
    assert ended(run, "trainer") == ["COMPLETED"] and ended(run, "vllm-0") == ["CANCELED"]
    assert ended(run, "vllm-1") == ["ERROR", "CANCELED"], ended(run, "vllm-1")
    assert re.search(r"vllm-1 \(Job \S+\) ended ERROR.*: restarting it \(1 of 3\)", out), out[-3000:]
    assert_nothing_left(standin, run)

    # Training happened in the Jobs and came back: every step, adapters through the read-only mount.
    run_dir = run.run_dir
    assert [r["step"] for r in read_metrics(run_dir).training] == list(range(1, 9))
    assert (run_dir / "reward_curve.png").is_file() and "training finished at step 8" in \
        (run_dir / "logs" / "trainer.log").read_text()
    assert f"path '{mount}/checkpoints/.vllm_lora/trl-policy-v" in (run_dir / "logs" / "vllm-0.job.log").read_text()
    submitted = json.loads((run_dir / "submitted.json").read_text())
    assert submitted["ids"] == [j.id for j in jobs] and submitted["folder"] == group

    first_submit = min(t for t, job_id, what, _ in standin.record if job_id == job_of(run, "vllm-0").id
                       and what == "submitted")
    first_step = read_metrics(run_dir).training[0]["time"]
    print(f"\nhf-jobs stand-in: first vLLM Job submitted to the first training step: {first_step - first_submit:.1f} s "
          f"(grpo run to the end: {time.time() - run.started:.1f} s)")

    stopped = grpo("stop", str(run_dir), env=run.env)
    assert stopped.returncode == 0 and "cancelled" not in stopped.stdout and "COMPLETED" in stopped.stdout


def test_hf_jobs_sh_replays_the_run_by_hand(standin, tmp_path):
    """The run directory's hf-jobs.sh, by hand: the real `hf` CLI submits the Jobs to the stand-in (`hf buckets sync`
    copied, tests/hf_shim), waits on the vLLM Job's /health with the token, follows the trainer Job's logs, brings the
    run directory back and cancels the vLLM Job on its way out."""
    composed = compose(["recipe=tiny-cpu-async-lora", "scheduler=hf-jobs", *ONE_REPLICA, "trainer.max_steps=3",
                        f"run.root={tmp_path / 'runs'}", f"scheduler.hf_jobs.mount_path={tmp_path / 'mnt'}",
                        "scheduler.hf_jobs.install_wheel=false"])
    plan = build_plan(composed)
    run_dir = materialize(composed, plan, [])
    for step in plan.prepare:  # the tiny model the other runs built, kept (launch.prepared): the script skips it
        prepared.restore(step.cache_key, run_dir / step.creates)
    shim = ROOT / "tests" / "hf_shim"
    env = {**os.environ, **RUN_ENV, "PATH": f"{shim}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GRPO_REAL_HF": str(Path(sys.executable).parent / "hf"), "GRPO_TESTS_DIR": str(ROOT / "tests"),
           "GRPO_STANDIN_ROOT": str(standin.root), "HF_ENDPOINT": standin.endpoint, "HF_TOKEN": TOKEN,
           "HF_JOBS_NAMESPACE": "standin-user", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "hf-jobs.sh"], cwd=run_dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "grpo: the trainer Job ended COMPLETED" in done.stdout
    group = run_group("tiny-cpu-async-lora", run_dir)
    mine = [j for j in standin.jobs.values() if j.spec["labels"]["grpo-run"] == group]
    deadline = time.time() + 30  # the script asked for the cancel on its way out; the Job ends a moment later
    while time.time() < deadline and not all(j.ended for j in mine):
        time.sleep(0.2)
    assert sorted((j.spec["labels"]["name"].removeprefix(group + "-"), j.stage) for j in mine) == \
        [("trainer", "COMPLETED"), ("vllm-0", "CANCELED")]
    assert [r["step"] for r in read_metrics(run_dir).training] == [1, 2, 3]  # brought back from the bucket
    assert not standin.processes_left()


def test_a_replica_job_that_errors_before_serving_stops_everything(standin, start):
    run = start(*ONE_REPLICA, "vllm.extra_args=[--no-such-flag]")
    out = run.end()
    assert run.process.returncode == 1, out[-4000:]
    job = job_of(run, "vllm-0")
    assert f"failed: vllm-0 (Job {job.id}) ended ERROR: the command exited with code" in out, out[-3000:]
    assert "before it served" in out and "no-such-flag" in out  # its log tail, from the Hub's log stream
    assert jobs_of(run, "trainer") == [] and job.stage == "ERROR"
    assert_nothing_left(standin, run)


def test_a_failing_trainer_job_stops_everything(standin, start):
    run = start(*ONE_REPLICA, "scheduler.setup=['echo the trainer Job fails here; exit 7']")
    out = run.end()
    assert run.process.returncode == 1, out[-4000:]
    trainer = job_of(run, "trainer")
    assert f"failed: trainer (Job {trainer.id}) ended ERROR: the command exited with code 7" in out
    assert "the trainer Job fails here" in out
    assert ended(run, "vllm-0") == ["CANCELED"] and trainer.stage == "ERROR"
    assert_nothing_left(standin, run)


def test_ctrl_c_mid_run_cancels_every_job(standin, start):
    """Ctrl-C once the trainer Job runs (the vLLM Job serving, the supervisor up): every Job cancelled."""
    run = start(*ONE_REPLICA, "trainer.max_steps=500")
    run.wait_for(lambda: "trainer │ node 0 of 2" in run.text(), timeout=600)
    run.process.send_signal(signal.SIGINT)
    out = run.end(timeout=180)
    assert run.process.returncode == 130, out[-4000:]
    assert ended(run, "vllm-0") == ["CANCELED"] and ended(run, "trainer") == ["CANCELED"]
    assert_nothing_left(standin, run)


def test_grpo_stop_cancels_the_jobs_of_a_killed_grpo_run(standin, start):
    """SIGKILL leaves the Jobs billing: their IDs were written as they were submitted, and `grpo stop RUN_DIR`
    cancels them from another terminal."""
    run = start(*ONE_REPLICA)
    run.wait_for(lambda: any(j.stage == "RUNNING" for j in jobs_of(run, "vllm-0")), timeout=300)
    run.process.kill()
    run.process.wait()
    job = job_of(run, "vllm-0")
    assert job.stage == "RUNNING"
    stopped = grpo("stop", str(run.run_dir), env=run.env)
    assert stopped.returncode == 0 and f"cancelled Job {job.id} (was RUNNING)" in stopped.stdout, stopped.stdout
    assert_nothing_left(standin, run)
    assert ended(run, "vllm-0") == ["CANCELED"]
