"""`grpo report` and `grpo compare` on run directories: the real plans of shipped recipes, and measure records made
by the trainer's own writer (`trainer.measure.step_record`) from given phase times, so each number can be checked
by hand. Real runs are reported and compared in test_report_e2e."""

import json
import math

import pytest
from conftest import grpo

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts import measures as m
from grpo_launch.contracts import rundir
from grpo_launch.contracts.phases import Phase
from grpo_launch.errors import UserError
from grpo_launch.plan import build_plan
from grpo_launch.report import compare, diagnosis, run, summary
from grpo_launch.trainer import measure


def share(start, phases, *, completions=0, tokens=(0, 0), samples=0, flops=0.0, staleness=()):
    """One rank's share of a step, as `StepMeter.close` hands it over, its phases laid end to end."""
    segments, t = [], start
    for phase, seconds in phases.items():
        segments.append([phase, t, t + seconds])
        t += seconds
    return {"start": start, "end": t, "phases": {p: phases.get(p, 0.0) for p in Phase}, "segments": segments,
            "counts": {m.COMPLETIONS: completions, m.PROMPT_TOKENS: tokens[0], m.COMPLETION_TOKENS: tokens[1],
                       m.SAMPLES_TRAINED: samples, m.TRAIN_FLOPS: flops},
            "staleness": [sum(staleness), max(staleness, default=0), len(staleness)]}


def write_run(path, overrides, steps, *, rewards=None, partial=False):
    """A run directory of `overrides`' real plan; `steps`: per step, the list of rank shares' keyword arguments."""
    composed = compose(overrides)
    plan = build_plan(composed)
    path.mkdir(parents=True)
    (path / "plan.json").write_text(rundir.plan_text(plan))
    (path / "overrides.yaml").write_text(rundir.overrides_text(rundir.Overrides(composed.recipe, tuple(overrides),
                                                                                ())))
    t = 1000.0
    for step, ranks in enumerate(steps, 1):
        shares = [share(t, **rank) for rank in ranks]
        for r, one in enumerate(shares):  # each rank's timeline, in its own file
            rundir.append_timeline(path, r, step, one.pop("segments"))
        record = measure.step_record(step, shares)
        t = record["time"]
        rundir.append_metrics(path, record)
        reward = rewards[step - 1] if rewards else step / 10
        rundir.append_metrics(path, {"step": step, "time": t, "reward": reward, "reward_std": 0.1, "loss": 0.0})
    if partial:
        with (path / "metrics.jsonl").open("a") as f:
            f.write('{"step": 99, "time"')
    return path


def steady_steps(n, ranks, phases, **counts):
    return [[dict(phases=phases, **counts)] * ranks for _ in range(n)]


# -- measuring ------------------------------------------------------------------------------------------------------
def test_the_phase_clock_gives_each_moment_to_the_innermost_phase(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(measure.time, "time", lambda: now[0])
    clock = measure.PhaseClock()
    clock.start()
    now[0] = 11.0                               # 1 s outside any mark: other
    with clock.phase("train"):
        now[0] = 12.0
        with clock.phase("score"):
            now[0] = 12.5
            with clock.phase("generate"):
                now[0] = 14.0
                with clock.phase("sync"):
                    now[0] = 14.25
            now[0] = 14.5
        now[0] = 15.0
        with clock.phase("eval"):               # evaluation generates too, and all of it is eval time
            now[0] = 15.5
            with clock.phase("generate"):
                now[0] = 16.5
    clock.rebase("train")                       # the optimizer step after the last micro-batch
    now[0] = 17.0
    closed = clock.close()
    assert closed["phases"] == {"generate": 1.5, "score": 0.75, "sync": 0.25, "train": 2.0, "wait": 0.0,
                                "eval": 1.5, "save": 0.0, "other": 1.0}
    assert sum(closed["phases"].values()) == closed["end"] - closed["start"] == 7.0
    assert [s[0] for s in closed["segments"]] == ["other", "train", "score", "generate", "sync", "score", "train",
                                                  "eval", "train"]


def test_a_step_record_is_rank_0s_time_the_ranks_mean_phases_and_their_summed_counts():
    shares = [share(0.0, {"generate": 2.0, "train": 1.0}, completions=8, tokens=(40, 60), samples=8, flops=1e9),
              share(0.0, {"generate": 1.0, "wait": 1.0, "train": 1.0}, completions=8, tokens=(40, 50), samples=8,
                    flops=1e9, staleness=(1, 3))]
    for one in shares:  # what rank 0 gathers: the numbers, packed into a tensor's values and back
        one.pop("segments")
        assert measure._unpack(measure._pack(one)) == one
    record = measure.step_record(4, shares)
    assert record["step"] == 4 and record[m.STEP_S] == 3.0
    assert (record["phase/generate_s"], record["phase/wait_s"], record["phase/train_s"]) == (1.5, 0.5, 1.0)
    assert (record[m.COMPLETIONS], record[m.PROMPT_TOKENS], record[m.COMPLETION_TOKENS]) == (16, 80, 110)
    assert (record[m.SAMPLES_TRAINED], record[m.TRAIN_FLOPS]) == (16, 2e9)
    assert (record[m.STALENESS_MEAN], record[m.STALENESS_MAX]) == (2.0, 3)
    assert [r["rank"] for r in record[m.RANKS]] == [0, 1] and m.is_measure(record)


# -- the report ------------------------------------------------------------------------------------------------------
def test_the_report_is_the_steady_state_in_both_normalisations(tmp_path):
    """qwen1.5b-server: 7 training GPUs of the 8 held. The first step (one-time costs) is left out of the rates and
    the split; wall times and counts keep it."""
    first = [dict(phases={"generate": 30.0, "train": 10.0}, completions=64, tokens=(6400, 12800), samples=64)] * 7
    steady = dict(phases={"generate": 6.0, "score": 0.5, "sync": 1.0, "train": 2.0, "wait": 0.5}, completions=64,
                  tokens=(6400, 12800), samples=64, flops=64 * 19200 * 1e9)
    path = write_run(tmp_path / "server", ["recipe=qwen1.5b-server"], [first] + [[steady] * 7] * 4)
    report = summary.summarize(run.read_run(path))
    assert (report.units.name, report.units.training, report.units.in_use, report.units.held) == ("GPU", 7, 8, 8)
    assert report.wall_s == 40 + 4 * 10 and report.median_step_s == 10.0 and report.steady_steps == (2, 5)
    assert report.samples_trained == report.completions == 5 * 7 * 64
    assert report.completion_rate(7) == pytest.approx(4 * 7 * 64 / 40 / 7)       # per training GPU
    assert report.completion_rate(8) == pytest.approx(4 * 7 * 64 / 40 / 8)       # per GPU held
    assert report.token_rate(7) == pytest.approx(4 * 7 * 19200 / 40 / 7)
    assert report.phase_share["generate"] == pytest.approx(0.6) and report.phase_share["train"] == pytest.approx(0.2)
    # MFU: the FLOPs over the train phase's time on the 7 training GPUs at H100's dense bf16 peak
    assert report.mfu == pytest.approx(100 * 4 * 7 * 64 * 19200e9 / (4 * 2.0 * 7 * 989.4e12))
    rows = {r.key: r.value for r in summary.rows(report)}
    assert rows["units"] == "7 / 8 / 8" and rows["phase/generate"] == "60.0%" and rows["steady"] == "steps 2-5"
    assert {r.label.strip() for r in summary.rows(report)} >= {"completions/s per training GPU",
                                                               "completions/s per GPU held"}


def test_on_a_cpu_the_unit_is_the_cpu_process_and_mfu_is_not_invented(tmp_path):
    path = write_run(tmp_path / "cpu", ["recipe=tiny-cpu-server"],
                     steady_steps(3, 2, {"generate": 0.3, "train": 0.1}, completions=32, samples=32, flops=1e9))
    report = summary.summarize(run.read_run(path))
    assert (report.units.name, report.units.training, report.units.held) == ("CPU process", 2, 3)
    rows = {r.key: (r.label, r.value) for r in summary.rows(report)}
    assert rows["mfu"][1] == "n/a (a CPU)" and report.mfu is None
    assert rows["completions_per_s_held"][0].strip() == "completions/s per CPU process held"


def test_a_running_run_is_reported_as_far_as_it_got(tmp_path, capsys):
    path = write_run(tmp_path / "going", ["recipe=tiny-cpu"], steady_steps(3, 2, {"generate": 0.1, "train": 0.1},
                                                                          completions=32), partial=True)
    data = run.read_run(path)
    assert data.state == "running (or stopped)" and data.steps == 3  # the line being written is left for later
    assert main(["report", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 3 and out["max_steps"] == 20 and out["state"] == "running (or stopped)"
    assert main(["report", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "3 of 20" in shown and (path / "phase_timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    result = grpo("report", str(tmp_path))
    assert result.returncode == 2 and "is not a grpo-launch run directory (no plan.json)" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_skypilot_run_says_how_its_metrics_come_here(tmp_path):
    plan = build_plan(compose(["recipe=tiny-cpu", "scheduler=skypilot"]))
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    with pytest.raises(UserError) as found:
        run.read_run(tmp_path)
    assert "grpo report --fetch" in found.value.hint and "on node 0" in found.value.message
    from grpo_launch.contracts.schedulers import skypilot_cluster
    from grpo_launch.launch.schedulers import LAUNCHERS

    fetch = LAUNCHERS["skypilot"].logs(plan, tmp_path).fetch  # the run's own cluster (issue 27, 13)
    assert fetch[0] == "rsync" and f"{skypilot_cluster('tiny-cpu', tmp_path)}:~/sky_workdir/" in fetch


# -- the diagnosis -----------------------------------------------------------------------------------------------------
def test_generation_bound_a_server_run_names_the_ping_pong(tmp_path):
    path = write_run(tmp_path / "server", ["recipe=qwen7b-server"],
                     steady_steps(4, 6, {"generate": 6.0, "sync": 1.0, "train": 2.0}))
    found = diagnosis.diagnose(summary.summarize(run.read_run(path)))
    assert found[0].kind == "generation-bound" and "67%" in found[0].text and "ping-pong" in found[0].text
    assert (found[0].knob, found[0].value) == ("placement", "server")
    assert (found[1].knob, found[1].value) == ("vllm.tensor_parallel_size", 2)


def test_generation_bound_without_vllm_names_vllm(tmp_path):
    path = write_run(tmp_path / "plain", ["recipe=tiny-cpu"], steady_steps(4, 2, {"generate": 0.3, "train": 0.1}))
    (found,) = diagnosis.diagnose(summary.summarize(run.read_run(path)))
    assert found.kind == "generation-bound" and (found.knob, found.value) == ("vllm.enabled", False)


def test_trainer_bound_names_gradient_checkpointing_and_micro_batches_of_one(tmp_path):
    """The async post's Run 1: batch 1, no token budget, gradient checkpointing on (TRL's default); the trainer
    works longer than it waits for rollouts."""
    overrides = ["recipe=qwen1.5b-async-lora", "trainer.per_device_train_batch_size=1", "trainer.token_budget=null",
                 "trainer.gradient_checkpointing=true", "trainer.max_inflight_tasks=-1"]
    path = write_run(tmp_path / "run1", overrides,
                     steady_steps(4, 2, {"wait": 2.0, "train": 20.0, "sync": 0.9}, samples=128, staleness=(1, 2)))
    found = diagnosis.diagnose(summary.summarize(run.read_run(path)))
    assert found[0].kind == "trainer-bound" and "waited for rollouts 9%" in found[0].text
    assert ("trainer.gradient_checkpointing", True) in [(f.knob, f.value) for f in found]
    assert ("trainer.token_budget", None) in [(f.knob, f.value) for f in found]


def test_a_trainer_bound_grpo_run_of_micro_batches_of_one_names_the_batch(tmp_path):
    """GRPOTrainer has no token budget: the diagnosis once looked `token_budget` up among GRPOConfig's fields and
    failed with a KeyError for every trainer-bound run of one sequence per micro-batch."""
    overrides = ["recipe=qwen7b-server", "trainer.per_device_train_batch_size=1", "trainer.steps_per_generation=4"]
    path = write_run(tmp_path / "run", overrides, steady_steps(4, 6, {"generate": 1.0, "train": 9.0}))
    found = diagnosis.diagnose(summary.summarize(run.read_run(path)))
    assert found[0].kind == "trainer-bound"
    assert ("trainer.per_device_train_batch_size", 1) in [(f.knob, f.value) for f in found]


def test_async_starved_names_the_requests_in_flight(tmp_path):
    path = write_run(tmp_path / "starved", ["recipe=tiny-cpu-async-lora"],
                     steady_steps(4, 1, {"wait": 2.0, "train": 0.2, "sync": 0.2}, samples=8, staleness=(0, 1)))
    found = diagnosis.diagnose(summary.summarize(run.read_run(path)))
    assert found[0].kind == "async starved" and "waited for rollouts 83%" in found[0].text
    assert (found[0].knob, found[0].value) == ("trainer.max_inflight_tasks", 4)
    assert (found[1].knob, found[1].value) == ("placement.async_lora.replicas", 2)


# -- compare ---------------------------------------------------------------------------------------------------------
def test_colocate_against_server_normalised_by_8_over_7_from_the_plans(tmp_path):
    """The colocate post's terms: per training GPU, the server run's 7 trainer GPUs against colocate's 8."""
    colocate = write_run(tmp_path / "colocate", ["recipe=qwen1.5b-colocate"],
                         steady_steps(3, 8, {"generate": 4.0, "train": 4.0}, completions=64, samples=64))
    server = write_run(tmp_path / "server", ["recipe=qwen1.5b-server"],
                       steady_steps(3, 7, {"generate": 6.0, "train": 4.0}, completions=64, samples=64))
    reports = [summary.summarize(run.read_run(p)) for p in (colocate, server)]
    (found,) = compare.compare(reports).ratios
    by_label = {r.label: r for r in found}
    whole = by_label["throughput of the whole layout (completions/s)"].value
    assert whole == pytest.approx((7 * 64 / 10) / (8 * 64 / 8))
    per_training = by_label["throughput per training GPU (completions/s)"]
    assert per_training.value == pytest.approx(whole * 8 / 7) and "x 8/7" in per_training.how
    per_held = by_label["throughput per GPU held (completions/s)"]
    assert per_held.value == pytest.approx(whole) and "x 8/8" in per_held.how
    assert by_label["median step time"].value == pytest.approx(10 / 8)
    # 1,344 samples: all 3 server steps (30 s); colocate's 512 a step reach them 5/8 into its third (21 s)
    assert by_label["wall time for the same 1,344 samples"].value == pytest.approx(30 / 21)


def test_an_incomparable_pair_is_refused_with_its_reason(tmp_path):
    a = write_run(tmp_path / "a", ["recipe=tiny-cpu"], steady_steps(3, 2, {"train": 0.1}))
    b = write_run(tmp_path / "b", ["recipe=tiny-cpu-async-lora"], steady_steps(3, 1, {"train": 0.1}))
    result = grpo("compare", str(a), str(b))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is not comparable with" in result.stderr and "a different task or reward" in result.stderr
    assert "data.system_prompt: None vs 'Write a seven" in result.stderr
    c = write_run(tmp_path / "c", ["recipe=tiny-cpu", "rewards=[{fn:length_penalty}]"],
                  steady_steps(3, 2, {"train": 0.1}))
    assert "rewards: [('sevens', 1.0)] vs [('length_penalty', 1.0)]" in grpo("compare", str(a), str(c)).stderr


def test_runs_of_other_seeds_and_placements_compare_and_seeds_pool_by_layout(tmp_path, capsys):
    # the seeds ran side by side, on ports of their own: the ports a run listens on are no part of its layout
    runs = [write_run(tmp_path / f"colocate-{seed}", ["recipe=tiny-cpu-colocate", f"seed={seed}",
                                                       f"vllm.port={8000 + 10 * seed}"],
                      steady_steps(8, 2, {"generate": 0.1, "train": 0.1}, completions=32, samples=32),
                      rewards=[0.1 * s + 0.01 * seed for s in range(8)]) for seed in (1, 2)]
    runs.append(write_run(tmp_path / "plain", ["recipe=tiny-cpu", "trainer.max_steps=8"],
                          steady_steps(8, 2, {"generate": 0.3, "train": 0.1}, completions=32, samples=32),
                          rewards=[0.1 * s for s in range(8)]))
    out = tmp_path / "overlay.png"
    assert main(["compare", *map(str, runs), "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "layout tiny-cpu-colocate: 2 run(s), seed(s) 1, 2" in shown
    assert "layout tiny-cpu trainer.max_steps=8: 1 run(s), seed(s) 42" in shown
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert main(["compare", *map(str, runs), "--json"]) == 0
    (parity,) = json.loads(capsys.readouterr().out)["parity"]
    # one run of the plain layout: the draws are last-quarter steps (2 of its 8), pooled for colocate's 2 seeds
    assert (parity["unit"], parity["n"]) == ("step", [4, 2]) and parity["statistic"] == compare.STATISTIC


# -- parity --------------------------------------------------------------------------------------------------------
def test_welchs_t_against_a_hand_computation():
    a, b = [0.80, 0.85, 0.90, 0.82], [0.70, 0.74, 0.69]
    ma, mb = sum(a) / 4, sum(b) / 3
    va = sum((x - ma) ** 2 for x in a) / 3
    vb = sum((x - mb) ** 2 for x in b) / 2
    se = math.sqrt(va / 4 + vb / 3)
    df = (va / 4 + vb / 3) ** 2 / ((va / 4) ** 2 / 3 + (vb / 3) ** 2 / 2)
    found = compare.parity([_rewards(a)], [_rewards(b)], ("a", "b"))
    assert found.t == pytest.approx((mb - ma) / se) and found.df == pytest.approx(df)
    assert found.verdict == "different" and found.p < 0.05
    # the t distribution itself: known two-sided tails and quantiles
    assert compare.t_two_sided_p(2.0, 10) == pytest.approx(0.07339, abs=1e-5)
    assert compare.t_critical(10) == pytest.approx(2.2281, abs=1e-4)
    assert compare.t_critical(2) == pytest.approx(4.3027, abs=1e-4)
    same = compare.parity([_rewards(a)], [_rewards([x + 0.001 for x in a])], ("a", "a+"))
    assert same.verdict == "parity (no difference found)" and abs(same.difference) < same.half_width
    assert compare.parity([_rewards([0.5])], [_rewards([0.6])], ("a", "b")).verdict.startswith("too few steps")


def test_seeds_are_the_draws_when_both_layouts_repeat():
    """Three seeds a side: each seed's last-quarter mean is one draw (its steps are not independent of each other),
    so one seed that learned slower weighs as one seed, not as its every step."""
    colocate = [_rewards([0.90, 0.91, 0.89]), _rewards([0.80, 0.81, 0.79]), _rewards([0.60, 0.61, 0.59])]
    server = [_rewards([0.61, 0.60, 0.61]), _rewards([0.81, 0.80, 0.82]), _rewards([0.60, 0.59, 0.60])]
    by_seed = compare.parity(colocate, server, ("colocate", "server"))
    assert (by_seed.unit, by_seed.n) == ("run", (3, 3)) and by_seed.verdict == "parity (no difference found)"
    assert by_seed.means == pytest.approx((0.767, 0.671), abs=1e-3) and by_seed.half_width > 0.2
    by_step = compare.parity(colocate[:1], server[:1], ("colocate seed 1", "server seed 1"))
    assert (by_step.unit, by_step.verdict) == ("step", "different")  # one seed each: its steps are the draws


def _rewards(last_quarter):
    """A report whose last quarter of steps has these rewards."""
    class Fake:
        rewards = [(i, 0.0) for i in range(3 * len(last_quarter))] + [(i, v) for i, v in enumerate(last_quarter)]
    return Fake()


# -- evaluation ------------------------------------------------------------------------------------------------------
def test_a_built_in_tasks_held_out_rows_are_never_trained_on():
    from grpo_launch.contracts.inputs import Data
    from grpo_launch.trainer.data import load_training_dataset

    data = Data(source="builtin", path="sevens", num_samples=512, eval="held-out", eval_samples=16)
    held_out = {seed: [r["prompt"] for r in load_training_dataset(data, seed, held_out=True)] for seed in (1, 2)}
    for seed, prompts in held_out.items():
        trained = {r["prompt"] for r in load_training_dataset(data, seed)}
        assert len(prompts) == 16 and not trained & set(prompts)
    assert len(set(held_out[1]) & set(held_out[2])) >= 12  # the same held-out set for every seed, but for overlaps


def test_held_out_rows_of_a_files_dataset_are_its_last_rows_which_training_skips(tmp_path):
    from grpo_launch.contracts.inputs import Data
    from grpo_launch.trainer.data import load_training_dataset

    rows = tmp_path / "sums.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(40)))
    data = Data(source="files", path=str(rows), eval="held-out", eval_samples=8)
    trained = [r["prompt"] for r in load_training_dataset(data, 42)]
    held_out = [r["prompt"] for r in load_training_dataset(data, 42, held_out=True)]
    assert trained == [f"{i}+1=" for i in range(32)] and held_out == [f"{i}+1=" for i in range(32, 40)]


def test_data_eval_turns_trls_evaluation_on():
    args = build_plan(compose(["recipe=tiny-cpu"])).trainer_args
    assert (args["eval_strategy"], args["eval_steps"], args["per_device_eval_batch_size"]) == ("steps", 5, 16)
    assert "eval_strategy" not in build_plan(compose(["recipe=tiny-cpu-colocate"])).trainer_args


def test_a_gpu_runs_report_puts_the_plans_prediction_beside_what_was_measured(tmp_path, capsys):
    """`grpo plan`'s step-time model (plan.json's prediction) becomes a column over the same rows: step time, each
    measured phase's share and MFU; a CPU run has no prediction and no such column."""
    steady = dict(phases={"generate": 6.0, "score": 0.5, "sync": 1.0, "train": 2.0, "wait": 0.5}, completions=64,
                  tokens=(6400, 12800), samples=64, flops=64 * 19200 * 1e9)
    path = write_run(tmp_path / "server", ["recipe=qwen1.5b-server"], [[steady] * 7] * 4)
    prediction = run.read_run(path).plan.prediction
    predicted = {r.key: r.value for r in summary.predicted_rows(prediction)}
    assert predicted["phase/generate"] == f"{100 * prediction.phase(Phase.GENERATE).seconds / prediction.step_s:.1f}%"
    assert predicted["mfu"] == f"{100 * prediction.mfu:.1f}%"
    assert set(predicted) <= {r.key for r in summary.rows(summary.summarize(run.read_run(path)))}
    assert main(["report", str(path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "predicted" in out and "measured" in out and predicted["phase/generate"] in out
    assert json.loads(grpo("report", str(path), "--json").stdout)["predicted"]["step_s"] == prediction.step_s
    cpu = write_run(tmp_path / "cpu", ["recipe=tiny-cpu-server"],
                    steady_steps(3, 2, {"generate": 0.3, "train": 0.1}, completions=32, samples=32))
    assert main(["report", str(cpu), "--no-plots"]) == 0
    assert "predicted" not in capsys.readouterr().out
