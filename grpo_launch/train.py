"""The trainer entrypoint, run by accelerate or torchrun on every rank: `python -m grpo_launch.train --run-dir DIR`.

It reads plan.json from the run directory (it never re-composes the recipe), builds the dataset, reward functions,
LoRA config and TRL trainer the plan names, trains (resuming from the newest checkpoint when there is one), and
logs every step to metrics.jsonl. This is the only module of grpo-launch that imports torch and TRL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from grpo_launch.data import import_target, load_training_dataset
from grpo_launch.rundir import METRICS_FILE, PLAN_FILE, REWARDS_DIR

FINAL_DIR = "final"


def load_reward(target: str):
    """'module:function', or 'path/file.py:function' (copied into the run's rewards/ by `grpo run`)."""
    where, _, func = target.rpartition(":")
    if where.endswith(".py"):
        # Imported by module name from rewards/ (not from a file spec) so it pickles into TRL's worker processes.
        sys.path.insert(0, str(Path(REWARDS_DIR).resolve()))
        return import_target(f"{Path(where).stem}:{func}")
    return import_target(target)


def _metrics_callback(path: Path):
    from transformers import TrainerCallback

    class MetricsToJsonl(TrainerCallback):
        """Appends every log record of the main process to metrics.jsonl (step, wall time, TRL's metrics)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                record = {"step": state.global_step, "time": time.time(), **logs}
                with path.open("a") as f:
                    f.write(json.dumps(record) + "\n")

    return MetricsToJsonl()


def _peft_config(lora: dict[str, Any] | None):
    if lora is None:
        return None
    from peft import LoraConfig

    targets = lora["target_modules"]
    return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"], task_type="CAUSAL_LM",
                      target_modules=targets[0] if targets == ["all-linear"] else targets)


def _untie_output_head(async_grpo_trainer) -> None:
    """FSDP2 cannot place one parameter in two shard groups, and accelerate shards embed_tokens apart from the root
    that holds lm_head: a model with tied embeddings (Qwen2.5-Math-1.5B) dies in prepare ("is shared with a
    parameter already managed by another FSDP group"). Give lm_head its own copy when the model is created. Numerically
    inert for LoRA, which trains neither; the replicas keep serving the original tied checkpoint."""
    import torch

    create = async_grpo_trainer.create_model_from_path

    def create_untied(model_id, **kwargs):
        model = create(model_id, **kwargs)
        if getattr(model.config, "tie_word_embeddings", False):
            model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
            model.config.tie_word_embeddings = False
        return model

    async_grpo_trainer.create_model_from_path = create_untied


def build_trainer(plan: dict[str, Any], dataset, rewards):
    inputs, args = plan["trainer_inputs"], plan["trainer_args"]
    common = dict(model=inputs["model"], reward_funcs=rewards, train_dataset=dataset,
                  peft_config=_peft_config(inputs["lora"]), callbacks=[_metrics_callback(Path(METRICS_FILE))])
    if plan["trainer_class"] == "AsyncGRPOConfig":
        from transformers import AutoTokenizer
        from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

        from grpo_launch.response_templates import ensure_response_template
        from grpo_launch.tree_attention import use_sdpa_tree_attention

        if inputs["attn_implementation"] == "sdpa":
            use_sdpa_tree_attention()
        _untie_output_head(async_grpo_trainer)
        tokenizer = AutoTokenizer.from_pretrained(inputs["model"])
        ensure_response_template(tokenizer)
        return AsyncGRPOTrainer(args=AsyncGRPOConfig(**args), processing_class=tokenizer, **common)
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(args=GRPOConfig(**args), **common)


def _allow_indexed_cpu_locations() -> None:
    """Multi-process CPU runs give each rank the device 'cpu:N', and transformers resumes the optimizer with
    torch.load(map_location=args.device), which torch cannot map ("don't know how to restore data location ...
    tagged with cpu:0"). A deserializer for 'cpu:N' keeps such tensors on the CPU, where they already are."""
    import torch

    def on_cpu(obj, location: str):
        return obj if location.startswith("cpu:") else None

    torch.serialization.register_package(99, lambda obj: None, on_cpu)


def train(plan: dict[str, Any]) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    inputs = plan["trainer_inputs"]
    dataset = load_training_dataset(inputs["data"], plan["trainer_args"]["seed"],
                                    chat=plan["trainer_class"] == "AsyncGRPOConfig")
    rewards = [load_reward(r["target"]) for r in inputs["rewards"]]
    if plan["accelerator"] == "cpu":
        if plan["trainer_class"] == "AsyncGRPOConfig":  # AsyncGRPOTrainer needs CUDA: see grpo_launch.async_cpu
            from grpo_launch.async_cpu import train_on_cpu

            return train_on_cpu(plan, dataset, rewards, _peft_config(inputs["lora"]), Path(METRICS_FILE))
        _allow_indexed_cpu_locations()
    trainer = build_trainer(plan, dataset, rewards)
    state = trainer.accelerator.state
    print(f"[grpo-launch] rank {state.process_index} of {state.num_processes} ({state.distributed_type}, "
          f"{state.device})", flush=True)
    output_dir = trainer.args.output_dir
    checkpoint = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if checkpoint and trainer.accelerator.is_main_process:
        print(f"[grpo-launch] resuming from {checkpoint}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(os.path.join(output_dir, FINAL_DIR))
    if trainer.accelerator.is_main_process:
        print(f"[grpo-launch] training finished at step {trainer.state.global_step}", flush=True)


def _exit(code: int) -> None:
    """Leave without running interpreter teardown: in about 1 of 10 multi-process CPU runs, a joinable C++ thread
    destroyed at teardown aborts rank 0 after training finished (SIGABRT). A barrier, destroy_process_group, a
    flush and os._exit prevented it in 20 of 20 runs."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            if code == 0:
                dist.barrier()
            dist.destroy_process_group()
    except Exception:  # a broken process group must not hide the training result
        traceback.print_exc()
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", default=".", help="the run directory holding plan.json")
    args = parser.parse_args()
    os.chdir(args.run_dir)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    code = 0
    try:
        train(json.loads(Path(PLAN_FILE).read_text()))
    except BaseException:  # noqa: BLE001  (every failure must reach _exit, which passes the code on)
        traceback.print_exc()
        code = 1
    _exit(code)


if __name__ == "__main__":
    main()
