"""The supervisor survives its own faults (issue 15): its output handling failing, signals, its own death, processes
that die again or stop answering, and every wait bounded. Stand-in processes (tests/standins) order the events by
what the supervisor did; the real vLLM case is test_vllm_cpu's."""

import errno
import io
import signal
import subprocess
import sys

import pytest
from conftest import free_port, plan_json
from rich.console import Console
from supervised import (
    assert_all_dead,
    read_until,
    recorded_pids,
    run,
    server_plan,
    standin_server,
    standin_trainer,
    supervise_in_subprocess,
    two_replica_plan,
    with_processes,
)

from grpo_launch.cli.plan_view import bounds_line
from grpo_launch.contracts.plan import Plan
from grpo_launch.launch.follow import Job, JobFollower
from grpo_launch.launch.output import LINE_LIMIT
from grpo_launch.launch.supervisor import supervise


# -- output: reading, logging and the console never stop the draining of a child's output ---------------------------
def test_a_line_longer_than_the_read_limit_is_drained_whole(tmp_path):
    """A tqdm bar redrawn with \\r for a whole epoch is one line of hundreds of KiB: it is logged whole and the
    output after it keeps flowing (before: the reader died at 64 KiB and the child blocked on a full pipe)."""
    size = 5 * LINE_LIMIT
    plan = server_plan(tmp_path, [], ["--long-line", str(size)])
    result, out = run(plan, tmp_path)
    assert result.code == 0, out
    assert "trainer │ stand-in trainer after the long line" in out
    log = (tmp_path / "logs" / "trainer.log").read_bytes()
    bar = max(log.split(b"\n"), key=len)
    assert len(bar) >= size and bar.count(b"\r") >= size // 60


def test_a_log_that_cannot_be_written_loses_only_that_output(tmp_path):
    """A log write that fails (here the file size limit, as a full disk would) costs the output it held: the child
    keeps being drained, its lines keep reaching the console, the run ends as it would have, and the loss is said."""
    plan = server_plan(tmp_path, [], ["--print-bytes", str(1 << 20)])
    limit = 1 << 16
    proc = supervise_in_subprocess(plan, tmp_path, grace_s=3, before=(
        f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))"))
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "trainer.log: File too large (errno 27): this output is not kept until a write works again" in out
    assert f"trainer │ stand-in trainer printed {1 << 20} bytes" in out
    assert (tmp_path / "logs" / "trainer.log").stat().st_size == limit


class FailingConsole(io.StringIO):
    """A console whose terminal went away (an ssh session closed): every write after the first fails with EIO."""

    def write(self, text: str) -> int:
        if self.tell():
            raise OSError(errno.EIO, "Input/output error")
        return super().write(text)


def test_a_console_that_fails_neither_stops_the_run_nor_orphans_it(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids)], ["--run-for", "0.5", "--pid-dir", str(pids)])
    result = supervise(Plan.from_json(plan), tmp_path, grace_s=3, console=Console(file=FailingConsole(), width=200))
    assert result.code == 0 and result.failures == ()
    assert "stand-in trainer done, exit 0" in (tmp_path / "logs" / "trainer.log").read_text()
    assert_all_dead(recorded_pids(pids))


def test_a_display_that_raises_never_stops_the_draining(tmp_path, monkeypatch):
    """A bug showing a line must not leave a child blocked on a full pipe: the lines keep being read and logged."""
    def broken(self, name, text):
        raise RuntimeError("a bug while showing a line")

    monkeypatch.setattr("grpo_launch.launch.display.ConsoleDisplay.line", broken)
    plan = server_plan(tmp_path, [], ["--print-bytes", str(1 << 20)])
    result, out = run(plan, tmp_path)
    assert result.code == 0, out
    assert "showing trainer.log's lines failed (RuntimeError: a bug while showing a line); the log keeps them" in out
    assert f"stand-in trainer printed {1 << 20} bytes" in (tmp_path / "logs" / "trainer.log").read_text()


# -- signals and the supervisor's own death --------------------------------------------------------------------------
def test_a_stop_request_survives_a_console_failing_in_the_signal_handler(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids)], ["--run-for", "60", "--pid-dir", str(pids)])
    proc = supervise_in_subprocess(plan, tmp_path, grace_s=3, before=(
        "import grpo_launch.launch.display as d\n"
        "def broken(self, *args):\n    raise OSError(5, 'Input/output error')\n"
        "d.ConsoleDisplay.stopping = broken"))
    seen: list[str] = []
    try:
        read_until(proc, "started trainer", seen)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # the trainer would run for 60 s had the stop been dropped
    finally:
        proc.kill()
    assert proc.returncode == 130, "".join(seen) + out
    assert_all_dead(recorded_pids(pids))


class RunningJob(Job):
    """A stand-in for a scheduler's job (test_slurm follows real ones): running until cancelled."""

    name = "job 1"

    def __init__(self) -> None:
        self.cancels: list[int] = []

    def state(self) -> tuple[str, bool]:
        return "RUNNING", False

    def exit_code(self) -> int:
        return 0

    def cancel(self, presses: int) -> None:
        self.cancels.append(presses)


def test_a_followed_job_is_cancelled_even_when_the_console_fails(tmp_path, monkeypatch):
    def broken(self, *args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("grpo_launch.launch.display.ConsoleDisplay.stopping", broken)
    job = RunningJob()
    follower = JobFollower(Plan.from_json(plan_json()), tmp_path, job, Console(file=io.StringIO()), poll_s=1)
    with pytest.raises(OSError):
        follower._on_signal(signal.SIGINT, None)
    assert job.cancels == [1]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_the_run_like_ctrl_c(tmp_path, sig, code):
    """SIGHUP is what a closed ssh session sends; the exit code names the signal (Ctrl-C's is 130)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids)], ["--run-for", "60", "--pid-dir", str(pids)])
    proc = supervise_in_subprocess(plan, tmp_path, grace_s=3)
    seen: list[str] = []
    try:
        read_until(proc, "started trainer", seen)
        proc.send_signal(sig)
        read_until(proc, f"stopping on {signal.Signals(sig).name} (a second signal kills at once)", seen)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, "".join(seen) + out
    assert "interrupted" in out
    assert_all_dead(recorded_pids(pids))


def test_killing_the_supervisor_leaves_no_process(tmp_path):
    """SIGKILL runs no code of the supervisor's: its watchdog ends every process group (SIGTERM, then SIGKILL
    after the grace period), grandchildren included. (A real vLLM run: test_vllm_cpu.)"""
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--pid-dir", str(pids), "--ignore-sigterm"],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    proc = supervise_in_subprocess(plan, tmp_path, grace_s=2)
    seen: list[str] = []
    read_until(proc, "stand-in trainer recorded its pids", seen)
    proc.kill()
    proc.wait()
    try:
        assert_all_dead(recorded_pids(pids), within_s=30)
    finally:
        for pid in recorded_pids(pids):
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    log = (tmp_path / "logs" / "watchdog.log").read_text()
    assert f"the supervisor (pid {proc.pid}) ended without stopping its processes" in log


# -- restarts ---------------------------------------------------------------------------------------------------------
def test_a_restart_ends_what_the_dead_incarnation_left(tmp_path):
    """A dead replica's leader is gone but its group lives on (vLLM's EngineCore): it is killed, and gone, before
    the next incarnation starts, which looks for the processes of the earlier ones."""
    incarnations = tmp_path / "vllm-1"
    incarnations.mkdir()
    plan = two_replica_plan(tmp_path, [], ["--die-after-probes", "2", "--deaths", "1", "--code", "9", "--pid-dir",
                                           str(incarnations), "--report-earlier"],
                            ["--until-started", str(incarnations), "2"])
    result, out = run(plan, tmp_path)
    assert result.code == 0 and result.restarts == {"vllm-1": 1}, out
    log = (tmp_path / "logs" / "vllm-1.log").read_text()
    assert "stand-in server: earlier incarnations' processes alive: []" in log, log


@pytest.mark.parametrize("healthy_long_enough", [True, False])
def test_the_restart_budget_refills_after_a_period_of_health(tmp_path, healthy_long_enough):
    """One restart allowed. Each incarnation dies once probed ready and probed again, so it was ready at least one
    probe interval: with a reset period shorter than that its earlier death no longer counts, and a third
    incarnation starts (the trainer ends then); with a long one, the second death stops the run."""
    incarnations = tmp_path / "vllm-1"
    incarnations.mkdir()
    reset = 0.01 if healthy_long_enough else 3600
    plan = two_replica_plan(
        tmp_path, [], ["--die-after-probes", "2", "--code", "9", "--pid-dir", str(incarnations)],
        ["--until-started", str(incarnations), "3"],
        **{"vllm-1": {"restart": {"max_restarts": 1, "backoff_s": 0.1, "reset_after_s": reset}}})
    result, out = run(plan, tmp_path)
    if healthy_long_enough:
        assert result.code == 0, out
        assert result.restarts["vllm-1"] >= 2 and "restarting it (1 of 1)" in out
        assert "restarting it (2 of 1)" not in out
    else:
        assert result.code == 9 and result.restarts == {"vllm-1": 1}, out
        assert [str(f) for f in result.failures] == ["vllm-1 stopped while the trainer runs with code 9"]


# -- liveness: a ready server that stops answering is dead -----------------------------------------------------------
def test_a_wedged_server_stops_the_run_naming_it(tmp_path):
    """Alive but no longer answering /health: after 3 probes in a row go unanswered (about 3 x 2 x 0.2 s here), the run
    stops and says why; the trainer would otherwise run its 60 s."""
    pids = tmp_path / "pids"
    pids.mkdir()
    plan = server_plan(tmp_path, ["--wedge-after-probes", "2", "--pid-dir", str(pids)],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    result, out = run(plan, tmp_path)
    assert result.code == 1, out
    (failure,) = result.failures
    assert str(failure).startswith(f"vllm stopped answering {plan['processes'][0]['ready_url']}: 3 probes in a row "
                                   f"unanswered"), out
    assert "stand-in server no longer answering" in out
    assert_all_dead(recorded_pids(pids))


def test_a_server_that_answers_unhealthy_is_alive(tmp_path):
    """Any answer is life: the proxy answers 503 while a replica behind it restarts. The server here answers 503
    from its third probe on; the trainer ends once the supervisor probed it 8 times, 6 of them answered 503."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plan = with_processes(plan_json("recipe=qwen7b-server"), tmp_path,
                          {"vllm": (standin_server(port, "--degrade-after-probes", "2"), port),
                           "trainer": (standin_trainer(None, "--until-probed", url, "8"), None)})
    result, out = run(plan, tmp_path)
    assert result.code == 0 and result.failures == (), out


def test_a_wedged_replica_is_restarted(tmp_path):
    incarnations = tmp_path / "vllm-1"
    incarnations.mkdir()
    plan = two_replica_plan(tmp_path, [], ["--wedge-after-probes", "2", "--deaths", "1", "--pid-dir",
                                           str(incarnations)], ["--until-started", str(incarnations), "2"])
    result, out = run(plan, tmp_path)
    assert result.code == 0 and result.restarts == {"vllm-1": 1}, out
    assert "vllm-1 stopped answering http://127.0.0.1:" in out and ": restarting it (1 of 3)" in out
    assert_all_dead(recorded_pids(incarnations))


def test_a_server_on_another_node_that_dies_stops_the_run(tmp_path):
    """This supervisor runs node 0 (the trainer); the server is node 1's, started here by the test. It is probed
    like a local one: once it is gone, the run stops naming it, rather than when the trainer fails."""
    port = free_port()
    plan = with_processes(plan_json("recipe=tiny-cpu-server", "cluster.nodes=2"), tmp_path,
                          {"vllm": ([], port), "trainer": (standin_trainer(None, "--run-for", "60"), None)})
    plan["prepare"] = []
    server = subprocess.Popen(standin_server(port, "--die-after-probes", "2", "--code", "9"),
                              stdout=subprocess.DEVNULL)
    try:
        result, out = run(plan, tmp_path, nodes=(0,))
    finally:
        server.kill()
    assert result.code == 1, out
    (failure,) = result.failures
    assert str(failure).startswith(f"vllm (node 1) stopped answering http://127.0.0.1:{port}/health: 3 probes in a "
                                   f"row unanswered"), out
    assert server.wait() == 9


# -- every wait has a bound the plan states ---------------------------------------------------------------------------
def test_a_trainer_node_that_never_exits_fails_the_run_within_its_bound(tmp_path):
    """Two loopback trainer nodes: node 0's launcher finished, node 1's never exits (before: the run hung)."""
    plan = with_processes(plan_json("cluster.nodes=2"), tmp_path,
                          {"trainer-node0": (standin_trainer(None, "--run-for", "0"), None),
                           "trainer-node1": (standin_trainer(None, "--run-for", "60"), None)},
                          **{"trainer-node0": {"exit_timeout_s": 1.0}})
    plan["prepare"] = []
    result, out = run(plan, tmp_path, nodes=(0, 1))
    assert result.code == 1, out
    assert [str(f) for f in result.failures] == ["trainer-node1 did not exit within 1 s after trainer-node0 finished"]


def test_a_prepare_step_that_hangs_fails_within_its_bound(tmp_path):
    plan = server_plan(tmp_path, [], [])
    plan["prepare"] = [{"name": "slow-model", "argv": [sys.executable, "-c", "print('building', flush=True); "
                                                                           "import time; time.sleep(60)"],
                        "creates": "model", "cache_key": None, "timeout_s": 1.0}]
    result, out = run(plan, tmp_path)
    assert result.code == 1, out
    assert [str(f) for f in result.failures] == ["slow-model did not finish within 1 s"]
    assert "building" in out  # its log tail
    assert not (tmp_path / "logs" / "vllm.log").exists()


def test_the_plan_states_every_bound():
    """What the supervisor waits on, and for how long, is in plan.json (`grpo plan --json`)."""
    plan = Plan.from_json(plan_json("recipe=tiny-cpu-async-lora", "run.health_interval_s=2",
                                    "run.health_failures=4", "placement.async_lora.restart_reset_s=120"))
    for p in plan.processes:
        assert (p.liveness is not None) == (p.ready_url is not None), p.name
        if p.ready_url:
            assert (p.liveness.interval_s, p.liveness.timeout_s, p.liveness.failures) == (2, 2, 4)
            assert p.liveness.bound_s == 16 and p.ready_timeout_s
    assert {p.restart.reset_after_s for p in plan.processes if p.restart} == {120}
    assert all(step.timeout_s > 0 for step in plan.prepare)
    assert "a ready server is dead after 4 unanswered probes in a row, one every 2 s (noticed within 16 s)" in \
        bounds_line(plan)  # what `grpo plan` shows
    two = Plan.from_json(plan_json("cluster.nodes=2", "run.exit_timeout_s=90"))
    assert [p.exit_timeout_s for p in two.processes] == [90, 90]
    assert Plan.from_json(plan_json()).process("trainer").exit_timeout_s is None  # one trainer: nothing to wait for
    slurm = Plan.from_json(plan_json("cluster.nodes=2", "scheduler=slurm", "run.exit_timeout_s=90.5"))
    steps = [line for line in slurm.files["job.sbatch"].splitlines() if line.startswith("srun ")]
    assert steps and all("--wait=91" in line for line in steps)
