"""`grpo report` and `grpo compare` on real runs of two placements: tiny-cpu-colocate (vLLM's CPU build inside both
trainer ranks, under torchrun) and tiny-cpu-server (a real `vllm serve`, reported while it runs), every number
checked against their metrics.jsonl. The suite's one compare of real runs; the 3-seeds x 3-layouts parity
experiment is `make bench` (or `make bench-parity` alone)."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import RUN_ENV, free_ports, grpo, grpo_run
from engine import SYNC_CHECK, assert_generation_followed_training

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.phases import Phase
from grpo_launch.report import run, summary

pytestmark = pytest.mark.slow
STEPS = 12
# A rank's phases add up to its own step window (to the records' rounding); the record's phases are the ranks'
# mean, and the ranks end a step a few milliseconds apart (the gather after the optimizer step).
RANK_TOLERANCE_S = 1e-4


def pause(launcher: int) -> list[psutil.Process]:
    """SIGSTOP the trainer's launcher and every rank (torch's elastic agent starts each rank in a session of its
    own, out of the launcher's process group)."""
    found = psutil.Process(launcher)
    processes = [found, *found.children(recursive=True)]
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    return processes


def measure_records(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m.STEP_S in r]


def assert_phases_add_up(records: list[dict], ranks: int) -> None:
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert [r["rank"] for r in record[m.RANKS]] == list(range(ranks))
        for rank in record[m.RANKS]:
            assert abs(sum(rank["phases"].values()) - (rank["end"] - rank["start"])) < RANK_TOLERANCE_S, rank
        # the step's phases are the ranks' mean, so they add up to the mean window (the ranks end a step a few ms
        # apart, more on a loaded machine); the step's time is rank 0's window
        phases = sum(record[p.key] for p in Phase)
        windows = [rank["end"] - rank["start"] for rank in record[m.RANKS]]
        assert abs(phases - sum(windows) / ranks) < RANK_TOLERANCE_S, record
        assert abs(record[m.STEP_S] - windows[0]) < RANK_TOLERANCE_S, record


def assert_report_matches(run_dir: Path, units: tuple[int, int]) -> dict:
    """`grpo report --json` against a computation from the raw records: steady state = the steps after the first."""
    result = grpo("report", str(run_dir), "--json", env=RUN_ENV)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    steady = measure_records(run_dir)[1:]
    seconds = sum(r[m.STEP_S] for r in steady)
    completions = sum(r[m.COMPLETIONS] for r in steady)
    tokens = sum(r[m.PROMPT_TOKENS] + r[m.COMPLETION_TOKENS] for r in steady)
    training, held = units
    assert (shown["unit"], shown["units"]["training"], shown["units"]["held"]) == ("CPU process", training, held)
    assert shown["completions_per_s"]["per_training_unit"] == pytest.approx(completions / seconds / training)
    assert shown["completions_per_s"]["per_unit_held"] == pytest.approx(completions / seconds / held)
    assert shown["tokens_per_s"]["per_training_unit"] == pytest.approx(tokens / seconds / training)
    generate = sum(r["phase/generate_s"] for r in steady)
    phases = sum(r[p.key] for r in steady for p in Phase)
    assert shown["phase_share"]["generate"] == pytest.approx(generate / phases)
    assert shown["samples_trained"] == sum(r[m.SAMPLES_TRAINED] for r in measure_records(run_dir)) \
        == STEPS * 2 * 16  # 2 ranks x 16 completions a step
    assert shown["mfu_percent"] is None and shown["state"] == "finished" and shown["steps"] == STEPS
    rewards = [r["reward"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if "reward" in r]
    assert shown["reward_final"] == rewards[-1] and shown["reward_best"] == max(rewards)
    assert (run_dir / "phase_timeline.png").read_bytes()[:4] == b"\x89PNG"  # drawn as the run ended
    return shown


def test_report_and_compare_a_colocate_and_a_server_run(tmp_path):
    # colocate, under torchrun (colocate under accelerate, with ZeRO-3 and offload on 2 nodes, is the rehearsal of
    # qwen72b-colocate in test_rehearse)
    result, colocate = grpo_run(tmp_path, "recipe=tiny-cpu-colocate", "launcher=torchrun", timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert_generation_followed_training(colocate, steps=STEPS)
    log = (colocate / "logs" / "trainer.log").read_text()
    assert SYNC_CHECK.findall(log) == ["colocate", "colocate"]  # each rank's own engine
    assert sorted(p.name for p in (colocate / "weight-sync").iterdir()) == ["rank-0", "rank-1"]
    assert "steady state (after the first step)" in result.stdout  # the run ends with the report's table
    assert_phases_add_up(measure_records(colocate), ranks=2)
    shown = assert_report_matches(colocate, units=(2, 2))
    assert shown["phase_share"]["sync"] > 0  # each step's weights reloaded into the rank's engine

    # server, reported while it runs: the trainer is paused at its first step's line, the report read, resumed
    cmd = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "run",
           "recipe=tiny-cpu-server", f"run.root={tmp_path / 'runs'}", *free_ports()]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **RUN_ENV})
    seen, trainer, reported = [], None, None
    try:
        for line in proc.stdout:
            seen.append(line)
            if found := re.search(r"started trainer \(pid (\d+)", line):
                trainer = int(found.group(1))
            if reported is None and trainer and "[grpo] step " in line:
                (server,) = (tmp_path / "runs" / "tiny-cpu-server").iterdir()
                paused = pause(trainer)
                try:
                    reported = summary.summarize(run.read_run(server))
                    going = grpo("report", str(server), env=RUN_ENV)
                finally:
                    for process in paused:
                        process.send_signal(signal.SIGCONT)
        out = "".join(seen)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
    assert proc.returncode == 0, out[-4000:]
    assert reported is not None and reported.run.state == "running (or stopped)" and 1 <= reported.steps < STEPS
    assert going.returncode == 0 and f"{reported.steps} of {STEPS}" in going.stdout
    assert_phases_add_up(measure_records(server), ranks=2)
    shown = assert_report_matches(server, units=(2, 3))  # 2 trainer ranks, and the server's process slot
    # the trainer waits for the server: a third to a half of the step here (under another test's load, a third: not
    # always more than it trains)
    assert shown["phase_share"]["generate"] > 0.2

    # compare: both normalisations, derived from the two plans; parity stated with its statistic
    result = grpo("compare", str(colocate), str(server), "--out", str(tmp_path / "compare.png"), env=RUN_ENV)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert re.search(r"throughput per training CPU process \(completions/s\)\s+\d+\.\d{3}x\s+the whole layouts' "
                     r"ratio x 2/2", text), text
    assert re.search(r"throughput per CPU process held \(completions/s\)\s+\d+\.\d{3}x\s+the whole layouts' ratio x "
                     r"2/3", text), text
    assert "wall time for the same 384 samples" in text and "Welch's t-test" in text
    assert re.search(r"tiny-cpu-server vs tiny-cpu-colocate launcher=torchrun: last-quarter mean reward .* "
                     r"p = \d\.\d\d: (parity \(no difference found\)|different)", text), text
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    found = json.loads(grpo("compare", str(colocate), str(server), "--json").stdout)
    (ratios,) = found["ratios_against_first"]
    by_label = {r["label"]: r["value"] for r in ratios["ratios"]}
    whole = by_label["throughput of the whole layout (completions/s)"]
    assert by_label["throughput per CPU process held (completions/s)"] == pytest.approx(whole * 2 / 3)
    assert by_label["throughput per training CPU process (completions/s)"] == pytest.approx(whole)
