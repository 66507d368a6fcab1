"""The run directory's contract (`contracts.rundir`): every record it writes reads back as it was, and a run
directory written by the previous release (tests/data/run-dirs-8b4bc63, written by main at 8b4bc63: plan.json
version 1) is read by this one: `grpo report` gives the numbers that release gave, `grpo compare` and `grpo run
--resume` take it, and its plan comes up to this release's schema with the facts a plan built today has."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from fault_matrix import REFUSED, FaultRow, record_fault

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts import rundir
from grpo_launch.contracts.phases import PREDICTED, Phase
from grpo_launch.contracts.plan import PLAN_VERSION, READY_TIMEOUT_S
from grpo_launch.contracts.schedulers import SkyPilotSettings
from grpo_launch.plan import build_plan

OLD = Path(__file__).parent / "data" / "run-dirs-8b4bc63"
OLD_RUNS = ("tiny-cpu", "tiny-cpu-async-lora")
# The start-to-last-record wall time counts from config.yaml's modification time, which a clone does not keep; the
# run directory is named as given.
WHERE_AND_WHEN = ("run_wall_s", "run_dir")
NEW_IN_THE_REPORT = ("metrics_unreadable_lines",)  # keys the report has had since 8b4bc63


@pytest.mark.parametrize("name", OLD_RUNS)
def test_the_previous_releases_run_directory_reports_as_it_did(name, capsys):
    assert main(["report", str(OLD / name), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    then = json.loads((OLD / f"{name}.report.json").read_text())
    assert {k: v for k, v in report.items() if k not in WHERE_AND_WHEN + NEW_IN_THE_REPORT} == \
        {k: v for k, v in then.items() if k not in WHERE_AND_WHEN}
    assert report["metrics_unreadable_lines"] == 0
    assert report["run_dir"] == str(OLD / name)
    assert main(["report", str(OLD / name), "--no-plots"]) == 0
    assert "finished" in capsys.readouterr().out


def test_the_previous_releases_run_directory_compares_and_resumes(tmp_path, capsys):
    again = shutil.copytree(OLD / "tiny-cpu", tmp_path / "tiny-cpu")
    assert main(["compare", str(OLD / "tiny-cpu"), str(again), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert main(["run", "--resume", str(again), "--dry-run"]) == 2  # tiny-cpu saves no checkpoint: it says so
    assert "there is no checkpoint to resume from" in capsys.readouterr().err
    assert main(["run", "--resume", str(again), "--dry-run", "--from-scratch"]) == 0
    assert f"would write {again}/" in capsys.readouterr().out


@pytest.mark.parametrize("name", [*OLD_RUNS, "qwen7b-server-skypilot"])
def test_a_version_1_plan_has_the_facts_a_plan_built_today_has(name):
    old = rundir.read_plan(OLD / name)
    stored = rundir.read_overrides(OLD / name)
    today = build_plan(compose([o for o in stored.overrides if not o.startswith("run.dir=")]))
    assert (old.trainer_facts, old.trainer_nodes) == (today.trainer_facts, today.trainer_nodes)
    assert old.scheduler.settings == today.scheduler.settings
    assert all(p.ready_timeout_s == (q.ready_timeout_s if q.ready_url else READY_TIMEOUT_S)
               for p, q in zip(old.processes, today.processes, strict=True))


def test_a_version_1_prediction_is_read_in_the_one_phase_vocabulary():
    old = rundir.read_plan(OLD / "qwen7b-server-skypilot")
    assert tuple(p.name for p in old.prediction.phases) == PREDICTED
    assert old.prediction.phase(Phase.GENERATE).seconds > 0
    assert isinstance(old.scheduler.settings, SkyPilotSettings)  # from the run's config.yaml, as v1 kept it


def test_a_plan_from_a_newer_release_is_refused_with_the_reason(tmp_path, capsys):
    run_dir = shutil.copytree(OLD / "tiny-cpu", tmp_path / "run")
    data = json.loads((run_dir / rundir.PLAN_FILE).read_text())
    (run_dir / rundir.PLAN_FILE).write_text(json.dumps({**data, "version": PLAN_VERSION + 1}))
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"plan.json version {PLAN_VERSION + 1}" in err and "Traceback" not in err


def test_every_record_reads_back_as_written(tmp_path):
    plan = build_plan(compose(["recipe=tiny-cpu-async-lora"]))
    (tmp_path / rundir.PLAN_FILE).write_text(rundir.plan_text(plan))
    read = rundir.read_plan(tmp_path)  # the memory estimate's JSON is rounded: its sums come back 0.001 off
    assert dataclasses.replace(read, memory=plan.memory) == plan and rundir.same_plan(tmp_path, plan)
    record = rundir.Overrides("tiny-cpu", ("seed=3", "trainer.max_steps=4"), ("/recipes",))
    (tmp_path / rundir.OVERRIDES_FILE).write_text(rundir.overrides_text(record))
    assert rundir.read_overrides(tmp_path) == record
    config = rundir.ComposedConfig("tiny-cpu", {"placement": "colocate"}, {"seed": 3, "run": {"root": "runs"}})
    (tmp_path / rundir.CONFIG_FILE).write_text(rundir.config_text(config))
    assert rundir.read_config(tmp_path) == config
    submitted = rundir.Submitted("hf-jobs", ("a", "b"), 1.5, namespace="me", bucket="me/b", folder="f")
    rundir.write_submitted(tmp_path, submitted)
    assert rundir.read_submitted(tmp_path) == submitted
    (tmp_path / rundir.LOGS_DIR).mkdir()
    failure = rundir.TrainerFailure(1, "training", 3, 2.5, "ValueError: x", "Traceback ...")
    rundir.write_trainer_failure(tmp_path, failure)
    assert rundir.read_trainer_failure(tmp_path, 1) == failure and rundir.read_trainer_failure(tmp_path, 0) is None
    rundir.write_node_failure(tmp_path, rundir.NodeFailure(0, 7, 10, "trainer", "exited with code 7"))
    assert rundir.failure_records(tmp_path) == ("node-0.failure.json", "trainer-rank1.failure.json")
    rundir.clear_trainer_failure(tmp_path, 1)
    assert rundir.failure_records(tmp_path) == ("node-0.failure.json",)
    rundir.append_timeline(tmp_path, 0, 1, [[Phase.TRAIN, 0.0, 1.0]])
    assert rundir.read_timelines(tmp_path) == {0: {1: [["train", 0.0, 1.0]]}}


def test_metrics_are_one_record_per_step_of_each_kind_and_a_line_being_written_waits(tmp_path):
    tail = rundir.MetricsTail(tmp_path)
    for record in ({"step": 1, "loss": 0.5}, {"step": 1, "step_s": 0.2}, {"step": 1, "loss": 0.4},
                   {"step": 1, "eval_reward": 0.3}, {"step": 1, "train_runtime": 9.0}):
        rundir.append_metrics(tmp_path, record)
    with (tmp_path / rundir.METRICS_FILE).open("a") as f:
        f.write('{"step": 2, "lo')
    metrics = rundir.read_metrics(tmp_path)
    assert metrics.training == [{"step": 1, "loss": 0.4}] and metrics.measures == [{"step": 1, "step_s": 0.2}]
    assert metrics.evals == [{"step": 1, "eval_reward": 0.3}] and metrics.closed and not metrics.empty
    assert len(tail.new_records()) == 5 and tail.new_records() == []
    assert rundir.read_metrics(tmp_path / "elsewhere").empty


@pytest.mark.parametrize(("reader", "message"), [
    (lambda d: rundir.read_plan(d), "is not a grpo-launch run directory (no plan.json)"),
    (lambda d: rundir.read_overrides(d, key="--resume"), "is not a grpo-launch run directory (no overrides.yaml)"),
    (lambda d: rundir.read_submitted(d), "holds no record of a started run (submitted.json)"),
])
def test_a_missing_record_is_a_user_error(tmp_path, reader, message):
    from grpo_launch.errors import UserError

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        reader(tmp_path)
    assert rundir.read_overrides(tmp_path, missing_ok=True) is None


# -- metrics.jsonl survives a cut line (issue 27, 4) -----------------------------------------------------------------
def test_a_line_cut_by_a_full_disk_is_skipped_counted_and_not_continued(tmp_path):
    """A run stopped while writing (ENOSPC, a node killed) leaves a partial last line; `--resume` appended the next
    record onto it, and every reader then raised on the joined line: `grpo report` and `compare` failed for good,
    the live view froze, `grpo run` ended in a traceback. The writer ends the cut line first; readers skip it."""
    rundir.append_metrics(tmp_path, {"step": 1, "loss": 0.5})
    with (tmp_path / rundir.METRICS_FILE).open("a") as f:
        f.write('{"step": 2, "lo')              # the disk filled here
    tail = rundir.MetricsTail(tmp_path)
    rundir.append_metrics(tmp_path, {"step": 2, "loss": 0.4})  # the resumed run's first record
    rundir.append_metrics(tmp_path, {"step": 3, "loss": 0.3})
    metrics = rundir.read_metrics(tmp_path)
    assert [r["step"] for r in metrics.training] == [1, 2, 3] and metrics.bad_lines == 1
    assert [r["step"] for r in tail.new_records()] == [1, 2, 3] and tail.bad_lines == 1


@pytest.mark.parametrize("line", ['{"step": 2, "lo', "[1, 2]", '{"loss": 0.1}', '{"step": "2"}', "\x00\x00"])
def test_a_line_that_is_not_a_record_is_skipped_and_counted(tmp_path, line, capsys):
    run_dir = shutil.copytree(OLD / "tiny-cpu", tmp_path / "run")
    text = (run_dir / rundir.METRICS_FILE).read_text().splitlines(keepends=True)
    (run_dir / rundir.METRICS_FILE).write_text("".join(text[:3] + [line + "\n"] + text[3:]))
    assert main(["report", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["metrics_unreadable_lines"] == 1 and report["steps"] == 6
    assert main(["report", str(run_dir), "--no-plots"]) == 0
    assert "metrics.jsonl lines unreadable (skipped)" in capsys.readouterr().out
    assert main(["compare", str(run_dir), str(OLD / "tiny-cpu")]) == 0


def test_the_live_view_reads_on_past_a_cut_line(tmp_path):
    from grpo_launch.launch.display import TrainingView

    view = TrainingView(tmp_path, total_steps=3)
    rundir.append_metrics(tmp_path, {"step": 1, "time": 1.0, "reward": 0.1})
    with (tmp_path / rundir.METRICS_FILE).open("a") as f:
        f.write('{"step": 2, "rew\n')
    rundir.append_metrics(tmp_path, {"step": 3, "time": 3.0, "reward": 0.3})
    assert view.update() and view.step == 3
    assert "unreadable metrics lines 1" in view.plain()


# -- checkpoints (issue 27, 6) ---------------------------------------------------------------------------------------
def _checkpoint(output, step, files, *, mark=True, trainer_state=True):
    path = output / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name, size in files.items():
        (path / name).write_bytes(b"x" * size)
    if trainer_state:
        (path / rundir.TRAINER_STATE).write_text("{}")
    if mark:
        rundir.mark_checkpoint(path, step)
    return path


def test_a_run_resumes_only_from_a_checkpoint_marked_whole_with_its_files_as_listed(tmp_path):
    """transformers writes trainer_state.json last, from rank 0: a checkpoint with it can still lack another rank's
    files, or hold files a crash cut short (nothing was synced). Resume takes the newest checkpoint grpo-launch marked
    once every rank's files were on disk, and whose files are still as the marker lists them."""
    _checkpoint(tmp_path, 4, {"model.safetensors": 100, "rng_state_1.pth": 10})
    eight = _checkpoint(tmp_path, 8, {"model.safetensors": 100, "rng_state_1.pth": 10})
    _checkpoint(tmp_path, 12, {"model.safetensors": 100}, mark=False)  # a rank killed while saving
    (eight / "model.safetensors").write_bytes(b"x" * 40)               # what a crash left of it
    (tmp_path / "final").mkdir()
    assert [p.name for p in rundir.resumable_checkpoints(tmp_path)] == ["checkpoint-4"]
    assert rundir.resumable_checkpoints(tmp_path / "missing") == []


def test_a_checkpoint_that_fails_to_load_is_set_aside(tmp_path):
    _checkpoint(tmp_path, 4, {"model.safetensors": 100})
    eight = _checkpoint(tmp_path, 8, {"model.safetensors": 100})
    rundir.set_checkpoint_aside(eight, "SafetensorError: invalid header")
    assert [p.name for p in rundir.resumable_checkpoints(tmp_path)] == ["checkpoint-4"]
    assert "invalid header" in (eight / rundir.SET_ASIDE_MARKER).read_text()


def test_checkpoints_of_a_release_before_the_marker_are_taken_as_it_took_them(tmp_path):
    _checkpoint(tmp_path, 5, {"model.safetensors": 10}, mark=False)
    _checkpoint(tmp_path, 10, {"model.safetensors": 10}, mark=False)
    _checkpoint(tmp_path, 15, {"model.safetensors": 10}, mark=False, trainer_state=False)  # stopped while saving
    assert [p.name for p in rundir.resumable_checkpoints(tmp_path, marked=False)] == ["checkpoint-10",
                                                                                      "checkpoint-5"]
    assert rundir.resumable_checkpoints(tmp_path) == []  # this release marks every checkpoint it writes
    assert not rundir.read_plan(OLD / "tiny-cpu").marks_checkpoints


@pytest.mark.parametrize(("recipe", "why"), [
    ("tiny-cpu", "it saves none, trainer.save_strategy=no"),
    ("tiny-cpu-async-lora", "it saves none, trainer.save_strategy=no"),
    ("qwen7b-server", "the run stopped before its first save"),
])
@pytest.mark.fault
def test_resuming_a_run_without_a_checkpoint_takes_from_scratch(tmp_path, recipe, why, capsys):
    """Issue 27, 9 and 10: --resume of a run that has no checkpoint silently trained again from step 0 (and
    overwrote checkpoints/final); the async CPU loop never checkpoints at all."""
    from grpo_launch.materialize import materialize

    composed = compose([f"recipe={recipe}", f"run.dir={tmp_path / 'run'}"])
    run_dir = materialize(composed, build_plan(composed), [])
    assert main(["run", "--resume", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "there is no checkpoint to resume from" in err and why in err and "--from-scratch" in err
    record_fault(FaultRow(f"9, 10 --resume of {recipe} with no checkpoint", 1, REFUSED, REFUSED))
    assert main(["run", "--resume", str(run_dir), "--dry-run", "--from-scratch"]) == 0
    capsys.readouterr()
    if recipe == "qwen7b-server":  # with a checkpoint there, --from-scratch is refused and a resume goes ahead
        _checkpoint(run_dir / "checkpoints", 100, {"model.safetensors": 10})
        assert main(["run", "--resume", str(run_dir), "--dry-run", "--from-scratch"]) == 2
        assert "has checkpoint-100 to resume from" in capsys.readouterr().err
        assert main(["run", "--resume", str(run_dir), "--dry-run"]) == 0


def test_from_scratch_goes_with_resume(capsys):
    assert main(["run", "--dry-run", "--from-scratch"]) == 2
    assert "--from-scratch goes with --resume" in capsys.readouterr().err
