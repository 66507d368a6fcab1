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


def main() -> None:
    model_dir, max_steps, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rng = random.Random(42)
    prompts = Dataset.from_list([{"prompt": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="} for _ in range(512)])
    args = GRPOConfig(output_dir=out_dir, max_steps=max_steps, learning_rate=0.01, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=8, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to="none", gradient_checkpointing=False, use_cpu=True, bf16=False, seed=42,
                      model_init_kwargs={"dtype": "float32"})
    trainer = GRPOTrainer(model=model_dir, reward_funcs=sevens, args=args, train_dataset=prompts)
    trainer.train()
    trainer.save_model(os.path.join(out_dir, "final"))
    import torch.distributed as dist

    if dist.is_initialized():  # the known exit-time abort of multi-process CPU runs (see grpo_launch/train.py)
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
