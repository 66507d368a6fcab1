"""The run directory's contract (`contracts.rundir`): every record it writes reads back as it was, and a run
directory written by the previous release (tests/data/run-dirs-8b4bc63, written by main at 8b4bc63: plan.json
version 1) is read by this one: `grpo report` gives the numbers that release gave, `grpo compare` and `grpo run
--resume` take it, and its plan comes up to this release's schema with the facts a plan built today has."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("name", OLD_RUNS)
def test_the_previous_releases_run_directory_reports_as_it_did(name, capsys):
    assert main(["report", str(OLD / name), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    then = json.loads((OLD / f"{name}.report.json").read_text())
    assert {k: v for k, v in report.items() if k not in WHERE_AND_WHEN} == \
        {k: v for k, v in then.items() if k not in WHERE_AND_WHEN}
    assert report["run_dir"] == str(OLD / name)
    assert main(["report", str(OLD / name), "--no-plots"]) == 0
    assert "finished" in capsys.readouterr().out


def test_the_previous_releases_run_directory_compares_and_resumes(tmp_path, capsys):
    again = shutil.copytree(OLD / "tiny-cpu", tmp_path / "tiny-cpu")
    assert main(["compare", str(OLD / "tiny-cpu"), str(again), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert main(["run", "--resume", str(again), "--dry-run"]) == 0
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
