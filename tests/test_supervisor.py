"""Orchestration with stand-in processes: order, health gating, failures seen whenever they happen, restarts,
Ctrl-C, teardown. The stand-ins speak vLLM's health endpoint but are not vLLM; no training happens here."""

import io
import signal
import socket
import sys
from pathlib import Path

import pytest
from conftest import plan_json
from fault_matrix import FINISHED, FaultRow, record_fault
from rich.console import Console
from supervised import (
    assert_all_dead,
    read_until,
    recorded_pids,
    run,
    server_plan,
    supervise_in_subprocess,
    two_replica_plan,
    with_processes,
)

from grpo_launch.contracts.plan import Plan
from grpo_launch.errors import UserError
from grpo_launch.launch.preflight import check_ports_free
from grpo_launch.launch.supervisor import supervise


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


@pytest.mark.fault
def test_a_kept_entry_copied_onto_a_full_disk_is_not_taken_as_prepared(tmp_path, monkeypatch, small_disk):
    """Issue 27, 7: the copy of a kept entry that a full disk cut left the entry half there, and every later start
    skipped the step as done. Here the run directory is a real file system of 256 KiB and the entry 400 KiB."""
    monkeypatch.setenv("GRPO_MODEL_CACHE_DIR", str(tmp_path / "kept"))
    entry = tmp_path / "kept" / "thing-1"
    entry.mkdir(parents=True)
    for i in range(4):
        (entry / f"part{i}").write_bytes(b"x" * 100_000)
    run_dir = small_disk(256)
    counter = tmp_path / "builds"
    result, out = run(prepare_plan(run_dir, counter), run_dir)
    assert result.code == 1 and "copying the kept thing into the run directory failed: No space left" in out
    assert not (run_dir / "thing").exists() and not list(run_dir.glob(".thing.*"))
    small_disk.grow(run_dir, 2048)  # space again: the next start copies it whole
    result, out = run(prepare_plan(run_dir, counter), run_dir)
    assert result.code == 0, out
    assert sorted(p.name for p in (run_dir / "thing").iterdir()) == [f"part{i}" for i in range(4)]
    assert not counter.exists()  # copied, never built
    record_fault(FaultRow("7 disk full while restoring a prepared model", 1, FINISHED,
                          FINISHED if result.code == 0 else f"exit {result.code}"))


def test_the_prepare_steps_run_alone_for_a_scheduler_that_starts_processes_elsewhere(tmp_path, monkeypatch):
    """scheduler=hf-jobs prepares the run directory here and starts nothing else (it once crashed here: the prepare
    steps had no process groups to join)."""
    import asyncio

    from grpo_launch.launch.supervisor import Supervisor

    monkeypatch.setenv("GRPO_MODEL_CACHE", "0")
    (run_dir := tmp_path / "run").mkdir()
    (run_dir / "logs").mkdir()
    supervisor = Supervisor(Plan.from_json(prepare_plan(run_dir, tmp_path / "builds")), run_dir, nodes=(),
                            console=Console(file=io.StringIO()))
    asyncio.run(supervisor.prepare_only())
    assert supervisor.failures == [] and (run_dir / "thing" / "made").read_text() == "x"
    assert supervisor.groups.watchdog.poll() is not None  # the watchdog was told the steps ended, and left


def test_no_task_of_the_supervisor_outlives_it(tmp_path, monkeypatch):
    """Every task the supervisor starts (exit watchers, readiness and liveness probes, timers, output pumps, the
    prepare steps' stop watch, the ticker) has ended when its run returns: none is left to an event loop that goes
    on (the ticker and the prepare steps' stop watch once were cancelled but never awaited)."""
    import asyncio

    from grpo_launch.launch.supervisor import Supervisor

    monkeypatch.setenv("GRPO_MODEL_CACHE", "0")

    async def tasks_left(run_dir: Path, how) -> set:
        (run_dir / "logs").mkdir(parents=True)
        supervisor = Supervisor(Plan.from_json(prepare_plan(run_dir, tmp_path / "builds")), run_dir,
                                console=Console(file=io.StringIO()))
        result = await how(supervisor)
        assert not supervisor.failures and (result is None or result.code == 0)
        return asyncio.all_tasks() - {asyncio.current_task()}

    assert asyncio.run(tasks_left(tmp_path / "run", Supervisor.run)) == set()
    assert asyncio.run(tasks_left(tmp_path / "prepared", Supervisor.prepare_only)) == set()


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
    # It dies once the supervisor probed it ready and probed it again: the trainer started in between.
    plan = server_plan(tmp_path, ["--die-after-probes", "2", "--code", "9", "--pid-dir", str(pids)],
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


def test_a_process_dying_while_another_is_awaited_is_named_at_once(tmp_path):
    """The reported bug: replica 0 died while the supervisor waited for replica 1, and the run said only that
    vllm-1 did not answer (after the whole health timeout). Every exit is an event, whatever is awaited: had the
    supervisor waited for vllm-1, the run would fail by vllm-1's readiness timeout instead."""
    plan = two_replica_plan(tmp_path, ["--ready-after", "300", "--die-after", "0.5", "--code", "9"],
                            ["--never-ready"], ready_timeout=120)
    result, out = run(plan, tmp_path)
    assert result.code == 9
    assert [str(f) for f in result.failures] == ["vllm-0 exited with code 9 before it was ready"]
    assert "vllm-1 did not answer" not in out
    assert not (tmp_path / "logs" / "trainer.log").exists()


def test_a_replica_that_dies_mid_run_is_restarted(tmp_path):
    """A replaceable replica (restart in its spec) that dies after it was ready comes back; the run goes on. The
    first incarnation dies once probed ready and probed again; the trainer ends when the second has started."""
    incarnations = tmp_path / "vllm-1"
    incarnations.mkdir()
    plan = two_replica_plan(tmp_path, [], ["--die-after-probes", "2", "--deaths", "1", "--code", "9", "--pid-dir",
                                           str(incarnations)], ["--until-started", str(incarnations), "2"])
    result, out = run(plan, tmp_path)
    assert result.code == 0, out
    assert result.restarts == {"vllm-1": 1}
    assert "vllm-1 exited with code 9: restarting it (1 of 3)" in out
    log = (tmp_path / "logs" / "vllm-1.log").read_text()
    assert log.count("stand-in server listening") >= 2  # one log, both incarnations


def test_restarts_are_bounded(tmp_path):
    plan = two_replica_plan(tmp_path, [], ["--die-after-probes", "2", "--code", "9"],
                            **{"vllm-1": {"restart": {"max_restarts": 2, "backoff_s": 0.1}}})
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


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_every_process(tmp_path, presses):
    pids = tmp_path / "pids"
    pids.mkdir()
    # The server ignores SIGTERM: one Ctrl-C sends it SIGTERM, waits the grace period and kills it; a second
    # Ctrl-C kills at once, so the grace period (60 s) never runs out within the test's 30 s.
    plan = server_plan(tmp_path, ["--pid-dir", str(pids), "--ignore-sigterm"],
                       ["--run-for", "60", "--pid-dir", str(pids)])
    proc = supervise_in_subprocess(plan, tmp_path, grace_s=3 if presses == 1 else 60)
    seen: list[str] = []
    read_until(proc, "started trainer", seen)
    proc.send_signal(signal.SIGINT)
    read_until(proc, "stopping (Ctrl-C again to kill at once)", seen)
    if presses == 2:
        read_until(proc, "stand-in server ignoring SIGTERM", seen)  # the first press's SIGTERM arrived
        proc.send_signal(signal.SIGINT)
        read_until(proc, "killing every process now", seen)
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
