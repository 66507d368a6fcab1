"""Trained weights into vLLM where TRL's own way cannot work: a CPU machine (the plan's weight_sync "reload").

TRL pushes weights to a vLLM server over NCCL (CUDA only: `VLLMClient.init_communicator` refuses a CPU), and
loads them into a colocated engine tensor by tensor (`load_weights`), which vLLM's CPU linear layers cannot take:
they repack their weights at load and keep no `weight_loader`. Instead, each sync writes the parameters TRL itself
gathers (`VLLMGeneration._iter_named_params`: PEFT merged, ZeRO-3/FSDP gathered, names as vLLM's) as one
safetensors file into the run directory, and the engine reloads it with vLLM's `reload_weights` (through the
server's dev-mode /collective_rpc, or the in-process engine's `collective_rpc`), which redoes the CPU repacking.
Everything else of TRL's sync stays: when it syncs, which ranks take part, the prefix-cache reset.

`check_engine_follows` then proves it at the end of a run: the engine's greedy completions of a few prompts must be
the trainer's final weights' own, token for token and log-probability for log-probability.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from grpo_launch.contracts.devices import WeightSync
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import WEIGHT_SYNC_DIR

WEIGHTS_FILE = "model.safetensors"  # vLLM's loader reads *.safetensors of the directory it is given
CHECK_PROMPTS = 3
CHECK_TOKENS = 6
LOGPROB_TOLERANCE = 1e-3  # float32 on both sides agree to about 1e-6


def reloads(plan: Plan) -> bool:
    """Whether the plan's trained weights reach vLLM this way (its weight_sync, contracts.devices.WeightSync)."""
    return plan.trainer_inputs.weight_sync == WeightSync.RELOAD


def write_weights(named_params, directory: Path) -> str:
    """Every (name, tensor) into directory/model.safetensors, replaced whole (a reader never sees half a file)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in named_params}
    partial = directory / f"{WEIGHTS_FILE}.partial"
    save_file(tensors, str(partial))
    os.replace(partial, directory / WEIGHTS_FILE)
    return str(directory.resolve())


def _sync_weights(self) -> None:
    """VLLMGeneration.sync_weights, through files."""
    if self.mode == "server":
        params = self._iter_named_params()
        if self.accelerator.is_main_process:
            path = write_weights(params, Path(WEIGHT_SYNC_DIR))
            self.vllm_client._post(f"{self.vllm_client.base_url}/collective_rpc",
                                   json={"method": "reload_weights", "kwargs": {"weights_path": path}})
            self.vllm_client.reset_prefix_cache()
        else:
            for _ in params:  # take part in the gather collectives
                pass
    else:  # colocate: every rank has an engine of its own
        directory = Path(WEIGHT_SYNC_DIR) / f"rank-{self.accelerator.process_index}"
        path = write_weights(self._iter_named_params(), directory)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self.llm.reset_prefix_cache()


def _init_communicator(self, device=0) -> None:
    """No NCCL group: only check the server is there and answers (its dev-mode routes included)."""
    self.get_server_info()


def use_reload_sync() -> None:
    """Make TRL's weight sync go through files and vLLM's reload."""
    from trl.generation import vllm_client, vllm_generation

    vllm_generation.VLLMGeneration.sync_weights = _sync_weights
    vllm_client.VLLMClient.init_communicator = _init_communicator
    vllm_client.VLLMClient.close_communicator = lambda self: None


def configure_colocated_engine(**engine_args) -> None:
    """Add to the LLM(...) TRL builds in each rank (colocate) the plan's settings that its call leaves out."""
    from trl.generation import vllm_generation

    if engine_args:
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, **engine_args)


def _token_ids(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, list):  # chat messages, rendered as the trainer renders them
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def check_engine_follows(trainer, prompts: list) -> None:
    """Sync the final weights once more, then require the engine's greedy completions of `prompts` (as the dataset
    holds them) to be the trained weights' own: each token the argmax of the trainer's next-token distribution, with
    the same log-probability. Every rank takes part (the sync and the forward passes may gather); each rank checks
    its own engine (colocate), or the server's answer to rank 0 (server)."""
    import torch

    generation = trainer.vllm_generation
    generation.sync_weights()
    model = trainer.accelerator.unwrap_model(trainer.model)
    prompts = [_token_ids(trainer.processing_class, p) for p in prompts[:CHECK_PROMPTS]]
    if generation.mode == "server":
        from accelerate.utils import broadcast_object_list

        answer = [None]
        if trainer.accelerator.is_main_process:
            out = generation.vllm_client.generate(prompts=prompts, temperature=0.0, max_tokens=CHECK_TOKENS,
                                                  logprobs=0)
            answer = [(out["completion_ids"], [[row[0] for row in seq] for seq in out["logprobs"]])]
        # Every rank scores the server's answer: under ZeRO-3 a forward pass gathers parameters from all ranks, and
        # rank 0 alone would wait for the others for ever.
        completions, engine_logprobs = broadcast_object_list(answer)[0]
    else:
        from vllm import SamplingParams

        outputs = generation.llm.generate([{"prompt_token_ids": p} for p in prompts], use_tqdm=False,
                                          sampling_params=SamplingParams(temperature=0.0, max_tokens=CHECK_TOKENS,
                                                                         logprobs=0))
        completions = [list(o.outputs[0].token_ids) for o in outputs]
        engine_logprobs = [[step[t].logprob for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids,
                                                                strict=True)] for o in outputs]
    worst = 0.0
    with torch.no_grad():
        for prompt, completion, logprobs in zip(prompts, completions, engine_logprobs, strict=True):
            ids = torch.tensor([prompt + completion], device=model.device)
            scores = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
            if scores.argmax(dim=-1).tolist() != completion:
                raise RuntimeError(f"weight sync check failed: vLLM's greedy completion {completion} of {prompt} is "
                                   f"not the trained weights' ({scores.argmax(dim=-1).tolist()})")
            trained = scores.gather(-1, torch.tensor(completion, device=model.device)[:, None])[:, 0]
            worst = max(worst, (trained - torch.tensor(logprobs, device=model.device)).abs().max().item())
    if worst > LOGPROB_TOLERANCE:
        raise RuntimeError(f"weight sync check failed: vLLM's log-probabilities differ from the trained weights' by "
                           f"up to {worst:.2e}")
    if generation.mode != "server" or trainer.accelerator.is_main_process:
        print(f"[grpo-launch] weight sync check: vLLM ({generation.mode}) generates with the trained weights: "
              f"{len(prompts)} greedy completions, log-probabilities within {worst:.1e}", flush=True)
