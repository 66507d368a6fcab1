"""The estimate's arithmetic on small cases checked by hand."""

from dataclasses import replace

import pytest
from conftest import replanned

from grpo_launch.compose import compose
from grpo_launch.contracts.memory import GIB
from grpo_launch.contracts.plan import Colocated
from grpo_launch.estimate.catalog import CATALOG
from grpo_launch.estimate.memory import estimate
from grpo_launch.plan import build_plan
from grpo_launch.plan.model import resolve_model
from grpo_launch.plan.placements import PLACEMENTS

QWEN_05B = CATALOG["Qwen/Qwen2.5-0.5B"]
P = QWEN_05B.parameters  # 494,032,768


@pytest.fixture(scope="module")
def colocate():
    return compose(["recipe=qwen1.5b-colocate"])


def _plan(composed, *, model="Qwen/Qwen2.5-0.5B", zero=(2, False, False), sleep=0, **changes):
    return replanned(composed, model=model, zero=zero, sleep_level=sleep, **changes)[1]


def _phase(plan, name, role="trainer + vLLM"):
    (budget,) = [b for b in plan.memory.gpus if b.role == role]
    return {c.name: c.gib for c in next(p for p in budget.phases if p.name == name).components}


def test_zero2_model_states_by_hand(colocate):
    training = _phase(_plan(colocate), "training")  # 8 ranks
    assert training["weights"] == pytest.approx(2 * P / GIB)
    assert training["gradients"] == pytest.approx(2 * P / 8 / GIB)
    assert training["fp32 gradients"] == pytest.approx(4 * P / 8 / GIB)
    assert training["fp32 master weights"] == pytest.approx(4 * P / 8 / GIB)
    assert training["optimizer states"] == pytest.approx(8 * P / 8 / GIB)
    assert training["DeepSpeed buckets"] == pytest.approx(2 * 5e8 * 2 / GIB)  # overlap_comm off at stage 2


def test_activations_and_logits_by_hand(colocate):
    # qwen1.5b-colocate: 8 sequences of max_model_len 4096 per micro-batch, completions of 3000 tokens.
    s, tokens = QWEN_05B, 8 * 4096
    per_layer = 2 * (4 * 896 + 3 * 896 + 2 * 128 + 4 * 4864)  # bytes per token and layer, bf16
    checkpointed = _phase(_plan(colocate), "training")
    assert checkpointed["activations"] == pytest.approx(tokens * (24 * 2 * 896 + per_layer) / GIB)
    full = _phase(_plan(colocate, trainer={"gradient_checkpointing": False}), "training")
    assert full["activations"] == pytest.approx(tokens * 24 * per_layer / GIB)
    assert full["logits"] == pytest.approx(2 * 2 * 8 * 3000 * s.vocab / GIB)


def test_zero3_offload_moves_states_to_host(colocate):
    plan = _plan(colocate, zero=(3, True, False))
    training = _phase(plan, "training")
    assert training["weights"] == pytest.approx(2 * P / 8 / GIB)
    assert training["ZeRO-3 gathered layer"] == pytest.approx(4 * QWEN_05B.largest_layer_parameters / GIB)
    assert not {"gradients", "fp32 gradients", "fp32 master weights", "optimizer states"} & set(training)
    (host,) = plan.memory.hosts
    offloaded = sum(c.gib for c in host.phases[1].components if c.name.startswith("offloaded"))
    assert offloaded == pytest.approx(16 * P / GIB)  # one node: 4 + 4 + 8 B per parameter


def test_sleep_levels_decide_what_training_shares_with_vllm(colocate):
    awake, asleep = _plan(colocate, sleep=0), _plan(colocate, sleep=2, gpu_memory_utilization=0.3)
    vllm_share = 0.3 * 80  # the vLLM components fill exactly gpu_memory_utilization x the GPU
    for plan in (awake, asleep):
        generation = _phase(plan, "generation")
        assert sum(v for k, v in generation.items() if k.startswith("vLLM")) == pytest.approx(vllm_share)
    assert sum(v for k, v in _phase(awake, "training").items() if k.startswith("vLLM")) == pytest.approx(vllm_share)
    assert not [k for k in _phase(asleep, "training") if k.startswith("vLLM")]


def test_sleep_level_1_keeps_vllm_weights_in_host_memory(colocate):
    # TRL rejects level 1; the estimate still knows what it would cost
    composed, plan = replanned(colocate, model="Qwen/Qwen2.5-0.5B", zero=(2, False, False), sleep_level=2)
    memory = estimate(composed.config, replace(plan, vllm=replace(plan.vllm, colocated=Colocated(sleep_level=1))),
                      PLACEMENTS["colocate"], resolve_model(composed.config).resolved)
    (host,) = memory.hosts
    training = {c.name: c.gib for c in host.phases[1].components}
    assert training["vLLM weights asleep (level 1)"] == pytest.approx(8 * 2 * P / GIB)  # 8 GPUs, TP 1


def test_kv_cache_tokens_by_hand():
    plan = build_plan(compose(["recipe=qwen72b-colocate"]))
    (budget,) = plan.memory.gpus
    kv = budget.kv_cache
    assert kv.bytes_per_token == 2 * 80 * 1 * 128 * 2  # 8 KV heads over TP 8: one per GPU
    kv_gib = next(c.gib for c in budget.phases[1].components if c.name == "vLLM KV cache")
    assert kv.tokens == int(kv_gib * GIB // kv.bytes_per_token)
    assert kv.sequences == kv.tokens // 4096 and kv.max_num_seqs == 32  # P 1 x TP 8 x steps_per_generation 4


def test_vllm_that_cannot_hold_one_sequence_does_not_fit(colocate):
    plan = _plan(colocate, model="Qwen/Qwen2.5-7B", gpu_memory_utilization=0.18)  # 14.4 GiB, weights 14.2 GiB
    (budget,) = plan.memory.gpus
    assert not budget.fits and budget.headroom_gib > 0
    assert "vLLM cannot start" in budget.problems[0]


def test_reference_model_only_with_beta_and_without_lora(colocate):
    with_beta = _phase(_plan(colocate, trainer={"beta": 0.04}), "training")
    assert with_beta["reference model"] == pytest.approx(2 * P / GIB)
    assert "reference model" not in _phase(_plan(colocate), "training")
    sharded = _phase(_plan(colocate, zero=(3, False, False), trainer={"beta": 0.04}), "training")
    assert sharded["reference model"] == pytest.approx(2 * P / 8 / GIB)


def test_lora_trains_a_small_part_over_a_frozen_base():
    plan = build_plan(compose(["recipe=qwen1.5b-async-lora"]))
    memory, s = plan.memory, CATALOG["Qwen/Qwen2.5-Math-1.5B"]
    lora = s.lora_parameters(1, ["all-linear"])
    assert memory.trainable_parameters == lora
    training = _phase(plan, "training", role="trainer")
    assert training["weights"] == pytest.approx(2 * (s.parameters + lora) / 2 / GIB)  # FSDP2 over 2 ranks
    assert training["optimizer states"] == pytest.approx(2 * 2 * lora / 2 / GIB)
    # token_budget 16384, no gradient checkpointing: every packed token through all 28 layers and the head
    per_layer = 2 * (4 * 1536 + 3 * 1536 + 2 * 256 + 4 * 8960)
    assert training["activations"] == pytest.approx(16384 * 28 * per_layer / GIB)


def test_cpu_recipe_is_estimated_in_host_memory():
    memory = build_plan(compose([])).memory  # tiny-cpu
    assert memory.gpus == () and memory.fits
    assert "cpu" in memory.notes[0]
    (host,) = memory.hosts
    assert host.capacity_gib == 24 and host.peak_gib < 24


def test_unknown_model_is_not_estimated_and_not_refused(colocate):
    memory = _plan(colocate, model="someone/SomeModel-3B").memory
    assert not memory.estimated and memory.fits
    assert "not in the catalog" in memory.notes[0]
