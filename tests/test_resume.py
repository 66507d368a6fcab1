"""Resume equivalence: a run interrupted after a checkpoint and resumed ends where an uninterrupted run of the same
seed ends (issue 27). Real `grpo run`s on CPU: TRL's GRPOTrainer, and for tiny-cpu-server a real vLLM server."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RUN_ENV, free_ports, grpo
from fault_matrix import FINISHED, REFUSED, FaultRow, record_fault, records_lost, steps_lost

from grpo_launch.contracts.rundir import CHECKPOINT_MARKER, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.fault]

STEPS, SAVE_EVERY = 8, 2
ARGS = (f"trainer.max_steps={STEPS}", "trainer.save_strategy=steps", f"trainer.save_steps={SAVE_EVERY}")


@dataclass(frozen=True)
class Tolerance:
    """How far a resumed run's rewards may be from the uninterrupted run's, from the resume point on."""
    per_step: float | None   # at each step; None: the placement does not sample alike run to run
    mean: float              # their mean over those steps


# tiny-cpu generates with the trainer's own model.generate, from the RNG state the checkpoint holds: exact. vLLM's
# CPU engine does not sample alike run to run, even uninterrupted ones from step 1, and at these early steps the
# rewards are mostly noise: three uninterrupted tiny-cpu-server runs of one seed had means over steps 3-8 of 0.016,
# 0.027 and 0.078. tiny-cpu-async-lora samples in two vLLM replicas, as the rollout worker's requests come: 0.010
# for an uninterrupted run, 0.016 for a resumed one (its LoRA learns slowly on the tiny model, see test_run_e2e).
RECIPES = {"tiny-cpu": Tolerance(0.0, 0.0), "tiny-cpu-server": Tolerance(None, 0.1),
           "tiny-cpu-async-lora": Tolerance(None, 0.1)}


def grpo_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", *args]


def rewards_per_step(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["reward"] for r in read_metrics(run_dir).training}


def run_processes(run_dir: Path) -> list[int]:
    """The processes still running whose command line names the run directory (the trainer ranks, vLLM)."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(run_dir) in (entry / "cmdline").read_text() or str(run_dir) in os.readlink(entry / "cwd"):
                    mine.append(int(entry.name))
            except OSError:
                continue
    return mine


def start(run_dir: Path, recipe: str) -> subprocess.Popen:
    return subprocess.Popen(grpo_command("run", f"recipe={recipe}", f"run.dir={run_dir}", *ARGS, *free_ports()),
                            env={**os.environ, **RUN_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=run_dir.parent)


def wait_for(what: str, seen, proc: subprocess.Popen, bound_s: float = 400) -> None:
    deadline = time.monotonic() + bound_s
    while not seen() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen(), f"{what} never came: {proc.communicate(timeout=60)[0][-3000:]}"


def assert_nothing_left(run_dir: Path) -> None:
    # The watchdog ends what the supervisor started, though SIGKILL let it run no code.
    deadline = time.monotonic() + 60
    while run_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not run_processes(run_dir)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each recipe's rewards per step, run once without a fault."""
    found = {}

    def rewards(recipe: str) -> dict[int, float]:
        if recipe not in found:
            run_dir = tmp_path_factory.mktemp("uninterrupted") / recipe
            proc = start(run_dir, recipe)
            out = proc.communicate(timeout=600)[0]
            assert proc.returncode == 0, out[-3000:]
            found[recipe] = rewards_per_step(run_dir)
        return found[recipe]
    return rewards


def resumed_from(run_dir: Path) -> int:
    """The step of the checkpoint the trainer says it resumed from."""
    log = (run_dir / "logs" / "trainer.log").read_text()
    return int(re.search(r"resuming from checkpoints/checkpoint-(\d+)", log).group(1))


def resumed_row(fault: str, run_dir: Path, expected: dict[int, float], tolerance: Tolerance, resumed_at: int):
    """The fault matrix row of a run resumed from checkpoint-`resumed_at` after `fault`: it finished as the
    uninterrupted run did if its rewards from there on are within `tolerance` of that run's; the steps the readers
    miss or see twice are lost."""
    got = rewards_per_step(run_dir)
    after = [s for s in expected if s > resumed_at and s in got]
    off = [s for s in after if tolerance.per_step is not None and abs(got[s] - expected[s]) > tolerance.per_step]
    mean_off = abs(sum(got[s] - expected[s] for s in after) / max(len(after), 1))
    alike = not off and mean_off <= tolerance.mean
    metrics = read_metrics(run_dir)
    return FaultRow(fault, 1, FINISHED, FINISHED if alike else f"rewards off at steps {off} (mean {mean_off:.3f})",
                    steps_lost=steps_lost(sorted(got), STEPS), records_lost=records_lost(metrics, STEPS),
                    billing=len(run_processes(run_dir)), lines_skipped=metrics.bad_lines)


# The sampled recipes' runs (vLLM servers, 6 and 10 minutes here) are the fault matrix's, in make bench.
@pytest.mark.parametrize("recipe", [r if r == "tiny-cpu" else pytest.param(r, marks=pytest.mark.bench)
                                    for r in RECIPES])
def test_an_interrupted_run_resumed_ends_where_an_uninterrupted_one_ends(tmp_path, recipe, uninterrupted):
    cut = tmp_path / "interrupted"
    proc = start(cut, recipe)
    wait_for("a checkpoint marked whole", (cut / "checkpoints" / f"checkpoint-{SAVE_EVERY}" / CHECKPOINT_MARKER).exists,
             proc)
    proc.send_signal(signal.SIGINT)  # and before it has stopped:
    proc.kill()
    proc.communicate(timeout=60)
    assert_nothing_left(cut)
    # A changed config is refused (showing the change) unless --force.
    changed = grpo("run", "--resume", str(cut), f"trainer.max_steps={STEPS + 4}", env=RUN_ENV, cwd=tmp_path)
    assert changed.returncode == 2 and f"trainer.max_steps: {STEPS} -> {STEPS + 4}" in changed.stderr
    resumed = grpo("run", "--resume", str(cut), env=RUN_ENV, cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]

    resumed_at = resumed_from(cut)
    assert resumed_at >= SAVE_EVERY
    # A trainer that ignored the checkpoint would log steps 1..start again (and, being seeded, with the same
    # rewards): each of them is in metrics.jsonl once, from the first run.
    raw = [json.loads(line)["step"] for line in (cut / "metrics.jsonl").read_text().splitlines()
           if "loss" in json.loads(line)]
    assert all(raw.count(step) == 1 for step in range(1, resumed_at + 1)), raw
    rollout_state = cut / "checkpoints" / f"checkpoint-{resumed_at}" / "rollout_state.json"
    if rollout_state.exists():  # the async loop's: adapter versions count on from the checkpoint's
        published = json.loads(rollout_state.read_text())["model_version"]
        first = read_metrics(cut).training[resumed_at]
        assert min(first["model_versions"]) > published, (published, first)
    record_fault(resumed_row(f"resume of {recipe}: SIGINT, SIGKILL after checkpoint-{resumed_at}", cut,
                             uninterrupted(recipe), RECIPES[recipe], resumed_at))


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The trainer rank's process: it works in the run directory, with RANK set by its launcher."""
    for pid in run_processes(run_dir):
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    return None


def test_a_rank_killed_while_saving_a_checkpoint_resumes_from_the_one_before(tmp_path, uninterrupted):
    """Issue 27, 6: SIGKILL of trainer rank 1 while a checkpoint is being written, before every rank's files are
    durable: the checkpoint is not marked whole, and the resume takes the one before. Both ranks are stopped
    (SIGSTOP) as soon as the checkpoint's directory appears; if rank 0 had already marked it, the save was too
    quick to cut: they go on, and the next checkpoint is tried."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, "tiny-cpu")
    wait_for("both ranks", lambda: rank_pid(run_dir, 0) and rank_pid(run_dir, 1), proc)
    ranks = [rank_pid(run_dir, 0), rank_pid(run_dir, 1)]
    cut = None
    for step in range(2 * SAVE_EVERY, STEPS, SAVE_EVERY):
        saving = run_dir / "checkpoints" / f"checkpoint-{step}"
        deadline = time.monotonic() + 300
        while not saving.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert saving.exists(), proc.communicate(timeout=60)[0][-3000:]
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        if not (saving / CHECKPOINT_MARKER).exists():
            os.kill(ranks[1], signal.SIGKILL)
            os.kill(ranks[0], signal.SIGCONT)
            cut = step
            break
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    assert cut, "every save was over before the ranks could be stopped"
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode not in (0, None), out[-3000:]
    assert_nothing_left(run_dir)
    assert not (run_dir / "checkpoints" / f"checkpoint-{cut}" / CHECKPOINT_MARKER).exists()

    resumed = grpo("run", "--resume", str(run_dir), env=RUN_ENV, cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert resumed_from(run_dir) == cut - SAVE_EVERY
    record_fault(resumed_row("6 trainer rank SIGKILLed while saving a checkpoint", run_dir, uninterrupted("tiny-cpu"),
                             RECIPES["tiny-cpu"], cut - SAVE_EVERY))


def fill(path: Path) -> int:
    """Writes `path` until its file system is full (ENOSPC): how many bytes it took."""
    written = 0
    with path.open("wb") as f:
        try:
            while True:
                written += f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return written


def test_a_disk_that_fills_under_a_run_loses_nothing_once_there_is_room_again(tmp_path, small_disk, uninterrupted):
    """Issue 27, 4 and 6: the run directory's file system fills up right after checkpoint-2 (a real tmpfs, a ballast
    file written to the brim): the run fails with the disk's error, wherever it hit (a metrics line, a log, the next
    checkpoint); once the user has made room, --resume trains on from checkpoint-2 and no step is lost."""
    disk = small_disk(16 * 1024)
    run_dir = disk / "run"
    proc = start(run_dir, "tiny-cpu")
    wait_for("checkpoint-2 marked whole", (run_dir / "checkpoints" / f"checkpoint-{SAVE_EVERY}" /
                                           CHECKPOINT_MARKER).exists, proc)
    ballast = disk / "ballast"
    fill(ballast)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode not in (0, None), out[-3000:]
    assert_nothing_left(run_dir)
    ballast.unlink()  # room again

    resumed = grpo("run", "--resume", str(run_dir), env=RUN_ENV, cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    record_fault(resumed_row("4 disk full under a real run, then room again", run_dir, uninterrupted("tiny-cpu"),
                             RECIPES["tiny-cpu"], resumed_from(run_dir)))


def _agree(rank: int, port: int, output: str, results) -> None:
    """One trainer rank of two (gloo on loopback) choosing its checkpoint: the trainer's own function."""
    import torch.distributed as dist

    from grpo_launch.trainer.main import agreed_checkpoint

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results.put((rank, agreed_checkpoint(output, True)))
    except RuntimeError as error:
        results.put((rank, f"refused: {error}"))
    finally:
        dist.destroy_process_group()


def agreed(outputs: dict[int, Path]) -> dict[int, str | None]:
    import multiprocessing

    from conftest import free_port

    spawn = multiprocessing.get_context("spawn")
    results, port = spawn.Queue(), free_port()
    ranks = [spawn.Process(target=_agree, args=(r, port, str(outputs[r]), results)) for r in (0, 1)]
    for p in ranks:
        p.start()
    answers = dict(results.get(timeout=120) for _ in ranks)
    for p in ranks:
        p.join(timeout=60)
    return answers


def test_the_ranks_resume_from_the_checkpoint_rank_0_chooses_or_refuse_together(tmp_path):
    """Issue 27, 8: each rank chose its newest checkpoint alone; on nodes keeping checkpoints of their own, node 0's
    ranks loaded step N and the others started afresh. Rank 0 chooses and broadcasts; a rank lacking it whole
    refuses with every other."""
    from grpo_launch.contracts.rundir import checkpoint_dir, mark_checkpoint

    def saved(output: Path, step: int) -> None:
        checkpoint_dir(output, step).mkdir(parents=True)
        (checkpoint_dir(output, step) / "model.safetensors").write_bytes(b"w" * 10)
        mark_checkpoint(checkpoint_dir(output, step), step)

    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    saved(node0, 4)
    answers = agreed({0: node0, 1: node1})  # node 1 kept none
    assert all(a.startswith("refused: rank 0 resumes from checkpoint-4, which rank(s) [1] do not have whole")
               for a in answers.values()), answers
    saved(node1, 4)
    saved(node1, 6)  # newer on node 1 alone: rank 0's choice holds
    assert agreed({0: node0, 1: node1}) == {0: str(checkpoint_dir(node0, 4)), 1: str(checkpoint_dir(node1, 4))}
    record_fault(FaultRow("8 ranks whose nodes keep different checkpoints", 2, REFUSED, REFUSED))
