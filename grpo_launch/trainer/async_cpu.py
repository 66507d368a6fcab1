"""async-lora on a CPU-only machine, for smoke tests: the trainer's loop made of TRL's own async pieces.

TRL's AsyncGRPOTrainer cannot be constructed without CUDA (it sizes MFU from the GPU and packs rows for a
FlashAttention kernel). On such a machine the trainer entrypoint runs this loop instead, which keeps everything that
crosses a process boundary real and TRL's own:
- TRL's AsyncRolloutWorker, a spawned child that generates through the routing proxy with the newest adapter
  version (`trl-policy-vN`) and scores each group with the recipe's rewards;
- TRL's async VLLMClient, which pauses and resumes the replicas and loads and unloads versioned adapters (through
  the proxy, which broadcasts them to every replica);
- TRL's save_lora_adapter, which writes each version to a temporary directory and renames it into place;
- the same clipped objective as AsyncGRPOTrainer, on the rollouts' token ids, old log-probs and advantages.
It is not AsyncGRPOTrainer: no FSDP2, no token-budget packing, one process. On a GPU machine the same placement runs
the real trainer.

It checkpoints as `trainer.save_strategy: steps` says, what a resume needs and in AsyncGRPOTrainer's own terms: the
adapter, the optimizer's state, and TRL's rollout_state.json (the prompt the worker goes on from, the adapter
version the names count on from). A resume starts the worker there and publishes the resumed adapter as the next
version before the first step.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.phases import Phase
from grpo_launch.contracts.plan import Plan
from grpo_launch.contracts.rundir import (
    FINAL_MODEL_DIR,
    append_metrics,
    checkpoint_dir,
    mark_checkpoint,
    resumable_checkpoints,
    sync_checkpoint,
)
from grpo_launch.contracts.vllm import ADAPTER_NAME, ADAPTER_SUBDIR, adapter_version_name
from grpo_launch.trainer.measure import StepMeter, flops_per_token, step_record
from grpo_launch.trainer.progress import PROGRESS
from grpo_launch.trainer.response_templates import ensure_response_template


def clipped_loss(policy, samples, epsilon_low: float, epsilon_high: float):
    """AsyncGRPOTrainer's token-level clipped surrogate, averaged over every completion token of the batch."""
    import torch

    losses, tokens = [], 0
    for sample in samples:
        input_ids = torch.as_tensor(sample.input_ids).unsqueeze(0)
        mask = torch.as_tensor(sample.completion_mask[1:], dtype=torch.bool)
        logits = policy(input_ids=input_ids).logits[0, :-1].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, input_ids[0, 1:, None])[:, 0][mask]
        old = torch.as_tensor(sample.old_log_probs, dtype=torch.float32)[1:][mask]
        ratio = torch.exp(log_probs - old)
        advantage = float(sample.advantage)
        surrogate = torch.minimum(ratio * advantage,
                                  torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantage)
        losses.append(-surrogate.sum())
        tokens += int(mask.sum())
    return torch.stack(losses).sum() / max(tokens, 1)


class AdapterPublisher:
    """AsyncGRPOTrainer._sync_weight_lora: pause, save vN (temporary dir + rename), load vN everywhere, resume,
    unload the version that left the staleness window and delete the one before it, then move the version on."""

    def __init__(self, policy, accelerator, client, worker, lora_dir: Path, max_staleness: int) -> None:
        self.policy, self.accelerator, self.client, self.worker = policy, accelerator, client, worker
        self.lora_dir, self.max_staleness = lora_dir, max_staleness
        self.version = 0

    def publish(self) -> dict[str, Any]:
        from trl.experimental.async_grpo.async_grpo_trainer import save_lora_adapter

        start = time.time()
        version = self.version + 1
        name = adapter_version_name(version)
        self.client.pause()
        save_lora_adapter(self.policy, self.accelerator, "default", str(self.lora_dir / name))
        self.client.load_lora_adapter(name, str(self.lora_dir / name))
        self.client.resume()
        stale = version - (self.max_staleness + 1)
        if stale > 0:
            self.client.unload_lora_adapter(adapter_version_name(stale))
        if stale > 1:
            shutil.rmtree(self.lora_dir / adapter_version_name(stale - 1), ignore_errors=True)
        self.version = version
        self.worker.update_model_version(version)
        return {"published": name, "publish_s": round(time.time() - start, 3)}


ROLLOUT_STATE = "rollout_state.json"   # AsyncGRPOTrainer's file and fields: prompt_index, model_version
OPTIMIZER_STATE = "optimizer.pt"       # transformers' name for it


@dataclass(frozen=True)
class Resumed:
    step: int            # the last step trained
    prompt_index: int    # the first prompt of a group not trained yet
    model_version: int   # the adapter version published last


@dataclass(frozen=True)
class Checkpoints:
    output: Path                                             # the trainer's output_dir
    marked: bool                                             # Plan.marks_checkpoints
    set_aside: Callable[[Path, BaseException], Exception]    # a checkpoint that fails to load: the run's error

    def save(self, step: int, policy, optimizer, prompt_index: int, model_version: int) -> None:
        """One process writes every file: synced, then marked whole."""
        import torch

        checkpoint = checkpoint_dir(self.output, step)
        policy.save_pretrained(checkpoint)
        torch.save(optimizer.state_dict(), checkpoint / OPTIMIZER_STATE)
        (checkpoint / ROLLOUT_STATE).write_text(json.dumps({"prompt_index": prompt_index,
                                                             "model_version": model_version}))
        sync_checkpoint(checkpoint)
        mark_checkpoint(checkpoint, step)

    def resume(self, policy, optimizer) -> Resumed | None:
        """The newest whole checkpoint loaded into `policy` and `optimizer`; None: there is none."""
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        found = resumable_checkpoints(self.output, marked=self.marked)
        if not found:
            return None
        checkpoint = found[0]
        print(f"[grpo-launch] resuming from {checkpoint}", flush=True)
        try:
            state = json.loads((checkpoint / ROLLOUT_STATE).read_text())
            set_peft_model_state_dict(policy, load_file(checkpoint / "adapter_model.safetensors"))
            optimizer.load_state_dict(torch.load(checkpoint / OPTIMIZER_STATE, weights_only=True))
            return Resumed(int(checkpoint.name.rsplit("-", 1)[1]), int(state["prompt_index"]),
                           int(state["model_version"]))
        except Exception as error:
            raise self.set_aside(checkpoint, error) from error


def _count(meter: StepMeter, batch, config) -> None:
    """What a step trained: its samples, their prompt and completion tokens, the forward and backward FLOPs."""
    completion = sum(int(sum(sample.completion_mask)) for sample in batch)
    tokens = sum(len(sample.input_ids) for sample in batch)
    meter.count(**{m.COMPLETIONS: len(batch), m.SAMPLES_TRAINED: len(batch), m.PROMPT_TOKENS: tokens - completion,
                   m.COMPLETION_TOKENS: completion,
                   m.TRAIN_FLOPS: flops_per_token(config, tokens / len(batch)) * tokens})


def train_on_cpu(plan: Plan, dataset, reward_funcs, peft_config, run_dir: Path, server_url: str,
                 checkpoints: Checkpoints) -> None:
    import torch
    from accelerate import Accelerator
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.async_grpo import AsyncGRPOConfig, async_rollout_worker
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    args = AsyncGRPOConfig(**plan.trainer_args)
    model_path = plan.trainer_inputs.model
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ensure_response_template(tokenizer)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), peft_config)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  betas=(args.adam_beta1, args.adam_beta2), weight_decay=args.weight_decay)
    resumed = checkpoints.resume(policy, optimizer)
    client = VLLMClient(server_url, server_timeout=args.vllm_server_timeout)
    client.wait_for_server_ready()
    # The worker only speaks HTTP to the server, but asks that the vllm package be importable; it is not here.
    async_rollout_worker.is_vllm_available = lambda: True
    worker = async_rollout_worker.AsyncRolloutWorker(
        model_name=model_path, lora_name=ADAPTER_NAME, dataset=dataset, reward_funcs=reward_funcs,
        processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id], num_generations=args.num_generations,
        max_inflight_tasks=args.max_inflight_tasks, queue_maxsize=args.queue_maxsize,
        vllm_server_url=server_url, max_tokens=args.max_completion_length,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, request_timeout=args.request_timeout,
        dataset_start_index=resumed.prompt_index if resumed else 0)
    publisher = AdapterPublisher(policy, Accelerator(cpu=True), client, worker,
                                 Path(args.output_dir).resolve() / ADAPTER_SUBDIR, args.max_staleness)
    publisher.version = resumed.model_version if resumed else 0
    print(f"[grpo-launch] CPU async loop (AsyncGRPOTrainer needs CUDA): {json.dumps(publisher.publish())}",
          flush=True)
    worker.start()
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    dropped = 0
    trained_groups: set[int] = set()   # of this start's worker, whose groups count from its first prompt
    first_step = resumed.step + 1 if resumed else 1
    meter = StepMeter(run_dir)
    meter.timeline = 0
    clock = meter.clock
    try:
        for step in range(first_step, args.max_steps + 1):
            PROGRESS.at_step(step)
            batch = []
            with clock.phase(Phase.WAIT):  # for the rollout worker's scored samples
                while len(batch) < per_step:
                    sample = worker.rollout_buffer.get(timeout=args.request_timeout)
                    if publisher.version - sample.model_version > args.max_staleness:
                        dropped += 1  # generated by a policy older than the staleness window allows
                        continue
                    batch.append(sample)
            with clock.phase(Phase.TRAIN):
                loss = clipped_loss(policy, batch, args.epsilon, epsilon_high)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            trained_groups.update(s.group_id for s in batch)
            meter.staleness.extend(publisher.version - s.model_version for s in batch)
            _count(meter, batch, policy.config)
            record = {m.LOSS: float(loss), m.REWARD: sum(s.metrics["reward"] for s in batch) / len(batch),
                      "model_versions": sorted({s.model_version for s in batch}), "dropped_stale": dropped}
            if step % args.weight_sync_steps == 0:
                with clock.phase(Phase.SYNC):
                    record.update(publisher.publish())
            record = {**step_record(step, [meter.close(step)]), **record}
            append_metrics(run_dir, record)
            print(f"[grpo-launch] {json.dumps({k: v for k, v in record.items() if k != m.RANKS})}", flush=True)
            if args.save_strategy == "steps" and step % args.save_steps == 0:
                untrained = next(g for g in count() if g not in trained_groups)
                checkpoints.save(step, policy, optimizer, (resumed.prompt_index if resumed else 0) + untrained,
                                 publisher.version)
        worker.check_health(stale_after_s=args.heartbeat_stale_after_s)
    finally:
        worker.stop()
    policy.save_pretrained(Path(args.output_dir) / FINAL_MODEL_DIR)
    print(f"[grpo-launch] training finished at step {args.max_steps}", flush=True)
