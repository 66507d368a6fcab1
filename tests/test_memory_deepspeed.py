"""The model-state numbers agree with DeepSpeed's own estimators (pure arithmetic in deepspeed/runtime/zero)."""

import pytest
from conftest import replanned

from grpo_launch.compose import compose
from grpo_launch.contracts.memory import GIB
from grpo_launch.estimate import catalog

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: E402

MODELS = ["Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B",
          "meta-llama/Llama-3.1-70B", "Qwen/Qwen2.5-Math-72B"]
ZERO = {"2": (2, False, False), "2-offload": (2, True, False), "3": (3, False, False),
        "3-offload": (3, True, False), "3-offload-param": (3, True, True)}
MODEL_STATES = {"weights", "gradients", "fp32 gradients", "fp32 master weights", "optimizer states",
                "ZeRO-3 gathered layer"}
# DeepSpeed assumes every rank loads the model in fp32: plan with float32 weights so the host numbers compare.
NO_BUFFER = 1.0  # DeepSpeed's additional_buffer_factor (1.5 by default) is a safety margin, not an allocation


@pytest.fixture(scope="module")
def base():
    return compose(["recipe=qwen72b-server", "vllm.tensor_parallel_size=2"])  # a TP every model here splits


def _plan(base, model, zero, nodes):
    return replanned(base, model=model, dtype="float32", nodes=nodes, zero=ZERO[zero])[1]


def _ours(plan):
    memory = plan.memory
    (trainer,) = [b for b in memory.gpus if b.role == "trainer"]
    training = next(p for p in trainer.phases if p.name == "training")
    gpu = sum(c.gib for c in training.components if c.name in MODEL_STATES)
    trainer_nodes = {p.node for p in plan.processes if p.role == "trainer"}
    (host,) = [b for b in memory.hosts if b.members[0][0] in trainer_nodes]
    model_host = {p.name: sum(c.gib for c in p.components if c.name != "processes") for p in host.phases}
    return gpu, model_host, len(trainer_nodes), plan.world_size // len(trainer_nodes)


@pytest.mark.parametrize("zero", ZERO)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("nodes", [2, 5])  # qwen72b-server: 1 or 4 trainer nodes of 8 GPUs (vLLM on the last node)
def test_model_states_agree_with_deepspeed_within_5_percent(base, model, zero, nodes):
    plan = _plan(base, model, zero, nodes)
    gpu, host, trainer_nodes, per_node = _ours(plan)
    shape = catalog.CATALOG[model]
    stage, offload_optimizer, offload_param = ZERO[zero]
    if stage == 2:
        cpu, expected_gpu = estimate_zero2_model_states_mem_needs(
            shape.parameters, num_gpus_per_node=per_node, num_nodes=trainer_nodes, cpu_offload=offload_optimizer,
            additional_buffer_factor=NO_BUFFER)
    else:
        cpu, expected_gpu, _ = estimate_zero3_model_states_mem_needs(
            shape.parameters, shape.largest_layer_parameters, num_gpus_per_node=per_node, num_nodes=trainer_nodes,
            cpu_offload=offload_optimizer, cpu_offload_params=offload_param, zero_init=True,
            additional_buffer_factor=NO_BUFFER)
    assert gpu == pytest.approx(expected_gpu / GIB, rel=0.05)
    # DeepSpeed's host figure is the larger of the load copies and the offloaded states, except for ZeRO-3 with
    # offload, where it is the offloaded states alone (zero.Init's one-module-at-a-time load copies left out).
    ours = host["training"] if stage == 3 and offload_optimizer else max(host.values())
    # Its ZeRO-2 offload figure counts the fp32 load copies of every GPU of every node (4 x total_gpus) against one
    # node's memory; a node holds only its own ranks' copies, so compare single-node layouts there.
    if not (stage == 2 and offload_optimizer and trainer_nodes > 1):
        assert ours == pytest.approx(cpu / GIB, rel=0.05)


def _tiny(kind: str, vocab: int):
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    config_cls, model_cls = classes[kind]
    config = config_cls(**shape, head_dim=16, tie_word_embeddings=kind != "llama")
    torch.manual_seed(0)
    return model_cls(config), config.to_dict()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("vocab", [1000, 50])  # the embedding, or an MLP projection, is the largest module
def test_counts_from_config_match_deepspeed_on_a_live_model(kind, vocab):
    model, config = _tiny(kind, vocab)
    total, largest = model_to_params(model)
    shape = catalog.shape_from_config(config)
    assert (shape.parameters, shape.largest_layer_parameters) == (total, largest)
