"""The step-time prediction in the plan: its phases and how each placement combines them, what it says when it
cannot predict, the run's GPU-hours and cost, and plan.json's copy of it."""

import json

import pytest
from conftest import grpo

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts.phases import PREDICTED, Phase
from grpo_launch.contracts.plan import Plan
from grpo_launch.estimate.step_time import ADAPTER_SYNC_S
from grpo_launch.plan import build_plan


def predicted(*overrides):
    return build_plan(compose(list(overrides))).prediction


def seconds(prediction) -> dict[str, float]:
    return {p.name: p.seconds for p in prediction.phases}


@pytest.mark.parametrize("recipe", ["qwen1.5b-colocate", "qwen7b-server", "qwen72b-colocate", "qwen72b-server"])
def test_synchronous_placements_take_the_phases_one_after_another(recipe):
    p = predicted(f"recipe={recipe}")
    assert tuple(ph.name for ph in p.phases) == PREDICTED
    split = seconds(p)
    assert split[Phase.WAIT] == 0 and all(ph.on_trainer_clock for ph in p.phases)
    assert p.step_s == pytest.approx(split[Phase.GENERATE] + split[Phase.SYNC] + split[Phase.TRAIN])
    assert p.median_step_s == p.step_s


def test_async_overlaps_generation_with_training_and_adds_the_sync():
    p = predicted("recipe=qwen1.5b-async-lora")
    split = seconds(p)
    assert not p.phase(Phase.GENERATE).on_trainer_clock
    assert split[Phase.SYNC] == pytest.approx(ADAPTER_SYNC_S / 4)  # every weight_sync_steps=4 steps
    assert p.median_step_s == pytest.approx(max(split[Phase.TRAIN], split[Phase.GENERATE]))
    assert p.step_s == pytest.approx(p.median_step_s + split[Phase.SYNC])
    assert split[Phase.WAIT] == pytest.approx(max(0.0, split[Phase.GENERATE] - split[Phase.TRAIN]))


def test_async_generation_bound_when_in_flight_requests_starve_the_replicas():
    fed = predicted("recipe=qwen1.5b-async-lora")
    starved = predicted("recipe=qwen1.5b-async-lora", "trainer.max_inflight_tasks=16")
    assert fed.bottleneck.startswith("training") and starved.bottleneck.startswith("generation")
    assert seconds(starved)[Phase.WAIT] > 0 and starved.step_s > fed.step_s
    assert "trainer.max_inflight_tasks, now 16" in starved.bottleneck


def test_server_broadcasts_across_nodes_when_its_gpus_are_on_another_node():
    one_node = predicted("recipe=qwen7b-server").phase(Phase.SYNC).detail
    apart = predicted("recipe=qwen72b-server").phase(Phase.SYNC).detail
    assert "inside the node" in one_node and "across nodes" in apart


def test_knobs_move_the_prediction_the_way_the_seeds_say():
    base = predicted("recipe=qwen1.5b-colocate")
    assert predicted("recipe=qwen1.5b-colocate", "trainer.gradient_checkpointing=false").phase(Phase.TRAIN).seconds \
        < base.phase(Phase.TRAIN).seconds
    # ZeRO offload moves the optimizer to the CPU: slower
    assert predicted("recipe=qwen7b-colocate", "zero=3-offload").step_s > predicted("recipe=qwen7b-colocate").step_s
    # a longer completion budget makes every phase longer
    assert predicted("recipe=qwen1.5b-colocate", "trainer.max_completion_length=1000").step_s < base.step_s


def test_max_steps_gpu_hours_and_a_price():
    p = predicted("recipe=qwen72b-server", "cluster.gpu_hour_price=2.5")
    assert p.gpus_held == 40 and p.gpus_in_use == 36  # the fifth node's four idle GPUs are paid for too
    assert p.max_steps == 200
    assert p.gpu_hours == pytest.approx(p.step_s * 200 * 40 / 3600)
    assert p.cost == pytest.approx(2.5 * p.gpu_hours)
    assert p.samples_per_hour_per_gpu == pytest.approx(3600 * 128 / p.step_s / 40)
    assert predicted("recipe=qwen72b-server").cost is None


@pytest.mark.parametrize(("overrides", "says"), [
    ((), "no step-time prediction for CPUs"),
    (("recipe=qwen1.5b-colocate", "cluster.gpu_type=TPUv5"), "gpu_type 'TPUv5' is not in the accelerator table"),
    (("recipe=qwen1.5b-colocate", "model.name_or_path=acme/unknown-7b"), "the model's size is unknown"),
    (("recipe=qwen1.5b-colocate", "vllm.enabled=false"), "generation runs in transformers"),
])
def test_no_numbers_where_the_tables_cannot_say_and_it_says_why(overrides, says):
    p = predicted(*overrides)
    assert not p.predicted and p.step_s is None and p.gpu_hours is None and says in p.note


def test_without_vllm_only_the_training_phase_is_predicted():
    p = predicted("recipe=qwen1.5b-colocate", "vllm.enabled=false")
    assert [ph.name for ph in p.phases] == [Phase.TRAIN] and p.phase(Phase.TRAIN).seconds > 0
    assert p.accelerator == "H100" and p.mfu > 0


def test_an_unknown_gpu_type_still_gets_suggestions_ranked_without_a_prediction():
    from grpo_launch.plan.advisor import advise

    composed = compose(["recipe=qwen7b-server", "cluster.gpu_type=B300"])
    advice = advise(composed, build_plan(composed))
    assert advice.suggestions and "not in the accelerator table" in advice.unranked


def test_the_advisor_ranks_by_predicted_time():
    from grpo_launch.plan.advisor import advise, gpu_seconds_per_sample

    composed = compose(["recipe=qwen7b-server"])
    advice = advise(composed, build_plan(composed))
    costs = [gpu_seconds_per_sample(s.plan) for s in advice.suggestions]
    assert costs[0] <= min(costs) * 1.02  # the first is the fastest, up to a tie
    assert gpu_seconds_per_sample(advice.suggestions[0].plan) < gpu_seconds_per_sample(build_plan(composed))


def test_plan_json_carries_the_prediction_and_reads_it_back():
    plan = build_plan(compose(["recipe=qwen1.5b-async-lora", "cluster.gpu_hour_price=3"]))
    data = json.loads(json.dumps(plan.to_json()))
    p = data["prediction"]
    assert [ph["name"] for ph in p["phases"]] == list(PREDICTED) and p["predicted"] is True
    assert p["gpu_hours"] == pytest.approx(plan.prediction.gpu_hours, rel=1e-3) and p["cost"] is not None
    back = Plan.from_json(data).prediction
    assert back.phases[0].name == Phase.GENERATE and back.step_s == pytest.approx(plan.prediction.step_s, rel=1e-3)


def test_plan_view_shows_the_split_and_the_run(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "recipe=qwen72b-colocate", "cluster.gpu_hour_price=2"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "predicted on H100" in out
    for phase in PREDICTED:
        assert f"  {phase}" in out
    assert "200 steps:" in out and "GPU-hours, cost" in out
    assert main(["plan"]) == 0
    assert "no step-time prediction for CPUs" in capsys.readouterr().out


def test_a_negative_price_is_refused():
    result = grpo("plan", "recipe=qwen1.5b-colocate", "cluster.gpu_hour_price=-1")
    assert result.returncode == 2 and "cluster.gpu_hour_price" in result.stderr and "Traceback" not in result.stderr
