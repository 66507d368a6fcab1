"""What every run measures, in one place: the names of the per-step measure records in metrics.jsonl, and of TRL's
own records beside them.

The trainer entrypoint (`trainer.measure`) writes one measure record per optimizer step into metrics.jsonl, beside
TRL's own log records; `grpo report`, `grpo compare` and the console's training view read them. A measure record is
the one with `STEP_S` in it:

    {"step": 7, "time": 1767225600.412, "step_s": 0.41,
     "phase/generate_s": 0.18, "phase/score_s": 0.03, "phase/sync_s": 0.02, "phase/train_s": 0.15,
     "phase/wait_s": 0.01, "phase/eval_s": 0.0, "phase/save_s": 0.0, "phase/other_s": 0.02,
     "completions": 32, "tokens/prompt": 192, "tokens/completion": 251, "samples_trained": 32,
     "train_flops": 1.9e9, "staleness/mean": 1.2, "staleness/max": 2,
     "ranks": [{"rank": 0, "start": 1767225600.002, "end": 1767225600.412, "phases": {"generate": 0.18, ...}},
               ...]}

- `step_s`: the step's wall time on rank 0, from the end of the step before (the start of training, for the
  first) to the end of this one: what a user waits per step, logging and data loading included.
- `phase/<name>_s`: seconds of the step spent in each phase, the mean over the trainer ranks. Exclusive: a moment
  counts for the innermost phase open then, so the phases add up to the step time (`contracts.phases.Phase` says
  what each is).
- per rank, under `ranks`: its own step window (`start`, `end`: the ranks end a step a few milliseconds apart) and
  the same seconds (`phases`, adding up to its window).
- what each rank did when, its phase timeline, is in a file of its own (`rundir.TIMELINE_SEGMENTS` under logs/):
  a line a step, `{"step": 7, "segments": [["generate", 1767225600.0, 1767225600.18], ...]}` ([phase, start, end]
  in Unix seconds, segments shorter than `SEGMENT_S` merged into the one before).
- counts, over every rank: `completions` generated for training (and the prompt and completion `tokens/` of
  them), `samples_trained` (completions the optimizer stepped on: each iteration of a reused batch counts),
  `train_flops` (model FLOPs of the training forward and backward passes, TRL's `compute_flops_per_token`
  convention: 6 x parameters per token plus attention, over the real tokens).
- async-lora only: `staleness/mean`, `staleness/max`, the policy versions between the adapter that generated a
  trained sample and the newest one.

Where AsyncGRPOTrainer (GPUs) measures something itself, its own key is read instead: `TRL_FALLBACKS`.
"""

from __future__ import annotations

STEP_S = "step_s"
RANKS = "ranks"
COMPLETIONS = "completions"
PROMPT_TOKENS = "tokens/prompt"
COMPLETION_TOKENS = "tokens/completion"
SAMPLES_TRAINED = "samples_trained"
TRAIN_FLOPS = "train_flops"
STALENESS_MEAN = "staleness/mean"
STALENESS_MAX = "staleness/max"

# Timeline segments shorter than this are merged into the one before.
SEGMENT_S = 0.001

# AsyncGRPOTrainer's own MFU of the forward and backward passes (GPUs), read where a run has no `train_flops`.
TRL_MFU = "perf/mfu_fwd_bwd"
# Our key -> AsyncGRPOTrainer's own log key for the same quantity (its records carry them at every logging step).
TRL_FALLBACKS = {
    SAMPLES_TRAINED: "batch/samples_per_step",
    STALENESS_MEAN: "sample/staleness_mean",
    STALENESS_MAX: "sample/staleness_max",
}


# TRL's own records, beside the measure records: a training step's (with its mean reward, or at least its loss), an
# evaluation's (its metrics prefixed "eval_"), and the one transformers logs once training ends.
REWARD = "reward"
LOSS = "loss"
EVAL_REWARD = "eval_reward"
CLOSING_KEY = "train_runtime"


def is_measure(record: dict) -> bool:
    return STEP_S in record


def is_training(record: dict) -> bool:
    return REWARD in record or LOSS in record


def is_closing(record: dict) -> bool:
    return CLOSING_KEY in record
