"""The baseline of benchmarks/run_overhead.py: the hand-written TRL script a user would launch with
`accelerate launch --multi_gpu --num_processes 2 plain_grpo.py MODEL_DIR MAX_STEPS OUT_DIR`, with the tiny-cpu recipe's
model, data, reward and arguments, and no grpo-launch code."""

import os
import random
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


def sevens(completions, **kwargs):
    return [sum(ch == "7" for ch in c[:4]) / 4 for c in completions]


def sums(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=" for _ in range(n)]


def main() -> None:
    model_dir, max_steps, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    train = sums(512, 42)
    # 16 held-out prompts of the same task, scored every 5 steps and at the end
    held_out = [p for p in sums(512 + 16, 1_000_003) if p not in set(train)][:16]
    args = GRPOConfig(output_dir=out_dir, max_steps=max_steps, learning_rate=0.01, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=8, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to="none", gradient_checkpointing=False, use_cpu=True, bf16=False, seed=42,
                      model_init_kwargs={"dtype": "float32"}, eval_strategy="steps", eval_steps=5,
                      per_device_eval_batch_size=16)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=sevens, args=args,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in train]),
                          eval_dataset=Dataset.from_list([{"prompt": p} for p in held_out]))
    trainer.train()
    if trainer.state.global_step % 5:
        trainer.evaluate()
    trainer.save_model(os.path.join(out_dir, "final"))
    import torch.distributed as dist

    if dist.is_initialized():  # the known exit-time abort of multi-process CPU runs (see grpo_launch/train.py)
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
