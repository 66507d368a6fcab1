"""The console view of a run, fed lines and metrics records as the supervisor feeds it: the compact views keep
what processes say and replace TRL's raw records and progress bars; --verbose keeps everything."""

import io
import json
import time

import pytest
from rich.console import Console

from grpo_launch.launch import display
from grpo_launch.launch.display import ConsoleDisplay, TrainingView, echoed_part
from grpo_launch.launch.result import RunResult

RECORD = ("{'loss': '0.01', 'grad_norm': '0.43', 'completions/mean_length': '7.5', 'reward': '0.01562', "
          "'step_time': '0.1174', 'epoch': '0.01562'}")
LINES = {
    # what a trainer prints                                                            what the compact view shows
    RECORD: None,
    "  0%|          | 0/20 [00:00<?, ?it/s]\r" + RECORD: None,
    "Map: 100%|██████████| 512/512 [00:00<00:00, 39867.15 examples/s]": None,
    " 45%|████▌     | 9/20 [00:01<00:01,  8.90it/s]": None,
    "  0%|          | 0/20 [00:00<?, ?it/s][rank0]:[W1201] Warning: find_unused_parameters=True":
        "[rank0]:[W1201] Warning: find_unused_parameters=True",
    "[grpo-launch] rank 0 of 2 (DistributedType.MULTI_CPU, cpu:0)":
        "[grpo-launch] rank 0 of 2 (DistributedType.MULTI_CPU, cpu:0)",
    "Traceback (most recent call last):": "Traceback (most recent call last):",
    "ValueError: 100% of the {'a': 1} budget": "ValueError: 100% of the {'a': 1} budget",
    # evaluation's progress bar, nested in training's: tqdm moves the cursor up before the eval record
    "\r  0%|          | 0/4 [00:00<?, ?it/s]\x1b[A": None,
    "\r 75%|███████▌  | 3/4 [00:00<00:00, 21.97it/s]\x1b[A\r                    \r": None,
    "\r                    \r\x1b[A{'eval_loss': '-0.008699', 'eval_reward': '0.9355'}": None,
    "": "",
}


@pytest.mark.parametrize("line", list(LINES))
def test_what_the_compact_view_echoes(line):
    assert echoed_part(line) == LINES[line]


def records(path, steps, *, start=1000.0, step_s=2.0, total=None):
    with path.open("a") as f:
        for step in steps:
            f.write(json.dumps({"step": step, "time": start + step * step_s, "loss": 0.5 / step, "kl": 0.01 * step,
                                "reward": step / 10, "completions/mean_length": 7.0 + step / 10}) + "\n")
        if total:
            f.write(json.dumps({"step": total, "time": start, "train_runtime": 1.0}) + "\n")


def test_the_training_view_reads_step_reward_trend_loss_kl_length_pace_and_eta(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    view = TrainingView(tmp_path, total_steps=20)
    assert not view.update()  # no file yet
    records(metrics, range(1, 11))
    with metrics.open("a") as f:
        f.write('{"step": 11, "time"')  # a record being written waits for the next update
    assert view.update()
    assert view.plain() == ("step 10/20 · reward 1.000 (trend +0.500) · loss 0.05 · kl 0.1 · length 8.0 · "
                            "step time 2.00 s · ETA 20 s")
    assert not view.update()


def test_the_training_view_shows_the_measured_split_and_throughput(tmp_path):
    """From the trainer's measure records: the latest step's phases and the completions per second per training
    process since the first step (which carries one-time costs)."""
    from grpo_launch.trainer.measure import COUNTS, step_record

    metrics = tmp_path / "metrics.jsonl"
    view = TrainingView(tmp_path, total_steps=20, per=(2, "CPU process"))
    with metrics.open("a") as f:
        for step, (generate, train, wait) in enumerate([(5.0, 1.0, 0.0), (0.5, 0.3, 0.2), (0.6, 0.2, 0.0)], 1):
            start = 100.0 + step
            share = {"start": start, "end": start + generate + train + wait,
                     "phases": {"generate": generate, "score": 0.0, "sync": 0.0, "train": train, "wait": wait,
                                "eval": 0.0, "save": 0.0, "other": 0.0},
                     "counts": {key: 16 if key == "completions" else 0 for key in COUNTS}, "staleness": [0, 0, 0]}
            f.write(json.dumps(step_record(step, [share, share])) + "\n")
            f.write(json.dumps({"step": step, "time": start, "reward": 0.5, "loss": 0.1}) + "\n")
    assert view.update()
    # steps 2 and 3: 2 x 2 x 16 completions in 1.0 + 0.8 s, per each of the 2 training processes
    assert view.plain().endswith("step time 0.80 s · phases generate 75% train 25% · throughput 17.8 completions/s "
                                 "per training CPU process · ETA 17 s")


def _display(verbose=False, terminal=False):
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=terminal, color_system=None)
    return ConsoleDisplay(console, ["trainer"], verbose=verbose), out


def test_without_a_terminal_plain_lines_at_a_steady_cadence(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    shown, out = _display()
    metrics = tmp_path / "metrics.jsonl"
    shown.training(tmp_path, 30)
    for line in LINES:
        shown.line("trainer", line)
    for step in range(1, 31):
        records(metrics, [step])
        clock[0] += 2.0  # a step every 2 s, a tick after each: a line every PLAIN_EVERY_S, and the last step
        shown.tick()
    records(metrics, [], total=30)
    shown.finished(RunResult(code=0, failures=(), interrupted=False, restarts={}))
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert "{'loss'" not in text and "it/s]" not in text
    assert "trainer │ [rank0]:[W1201] Warning: find_unused_parameters=True" in text
    assert "trainer │ Traceback (most recent call last):" in text
    steps = [line.split()[2] for line in text.splitlines() if line.startswith("[grpo] step ")]
    assert steps == ["1/30", "6/30", "11/30", "16/30", "21/30", "26/30", "30/30"]


def test_verbose_shows_the_raw_stream(tmp_path):
    shown, out = _display(verbose=True)
    for line in LINES:
        shown.line("trainer", line)
    text = out.getvalue()
    assert text.count("trainer │ {'loss': '0.01'") == 2 and "trainer │ Map: 100%|" in text


def test_in_a_terminal_the_view_is_redrawn_in_place(tmp_path):
    shown, out = _display(terminal=True)
    metrics = tmp_path / "metrics.jsonl"
    with shown:
        shown.training(tmp_path, 20)
        records(metrics, range(1, 5))
        shown.tick()
        shown.line("trainer", RECORD)
        shown.line("trainer", "[grpo-launch] rank 0 of 2")
        records(metrics, range(5, 9))
        shown.tick()
    text = out.getvalue()
    assert "\x1b[2K" in text  # the live region erased and drawn again
    assert "4/20" in text and "8/20" in text and "reward 0.800 (trend +0.400)" in text and "ETA 24 s" in text
    assert "trainer │ [grpo-launch] rank 0 of 2" in text and "{'loss'" not in text


def wait_until(condition, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.01)


def test_the_curve_is_drawn_once_training_logs_its_closing_record(tmp_path):
    """While the trainer's processes tear down, not after: the plotter draws on the closing record by itself."""
    from grpo_launch.report.plots import CurvePlotter

    metrics = tmp_path / "metrics.jsonl"
    records(metrics, range(1, 4), total=3)  # a resumed run's earlier segment: its closing record is old
    plotter = CurvePlotter(tmp_path, "test")
    records(metrics, range(4, 8))
    wait_until(lambda: plotter.records_read == 4 or not plotter.thread.is_alive())
    assert plotter.thread.is_alive() and plotter.curve is None  # it read the steps, and waits: still training
    records(metrics, [], total=7)
    plotter.thread.join(timeout=30)
    assert not plotter.thread.is_alive() and plotter.curve == tmp_path / "reward_curve.png"
    assert plotter.finish() == tmp_path / "reward_curve.png"


def test_a_run_without_a_closing_record_is_drawn_when_it_ends(tmp_path):
    from grpo_launch.report.plots import CurvePlotter

    plotter = CurvePlotter(tmp_path, "test")
    assert plotter.finish() is None  # nothing logged: nothing to draw
    records(tmp_path / "metrics.jsonl", range(1, 3))
    assert CurvePlotter(tmp_path, "test").finish() == tmp_path / "reward_curve.png"
