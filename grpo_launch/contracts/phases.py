"""The phases of an optimizer step: one vocabulary for what the trainer measures (metrics.jsonl's `phase/<name>_s`,
`contracts.measures`), what the step-time model predicts (`contracts.performance`), the report's split and the
bottleneck diagnosis. Nothing else names a phase: the architecture test refuses a phase's name as a bare string
outside this module.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """A phase of a step, in the order every table and plot shows them. Its value is its name in metrics.jsonl."""

    GENERATE = "generate"
    SCORE = "score"
    SYNC = "sync"
    TRAIN = "train"
    WAIT = "wait"
    EVAL = "eval"
    SAVE = "save"
    OTHER = "other"

    @property
    def key(self) -> str:
        """The measure record's key for its seconds: 'phase/generate_s'."""
        return f"phase/{self.value}_s"

    @property
    def about(self) -> str:
        """What a moment of it is, in words."""
        return _ABOUT[self]

    @property
    def noun(self) -> str:
        """Its name in a sentence: 'generation took 40% of the step'."""
        return _NOUNS[self]


_ABOUT = {
    Phase.GENERATE: "generating completions: vLLM in the rank (colocate), the rank waiting on the vLLM server's answer "
                    "(server), or transformers' generate (vllm.enabled=false)",
    Phase.SCORE: "scoring them: the reward functions, the old and reference policies' log-probabilities, advantages",
    Phase.SYNC: "moving trained weights (or a LoRA adapter) into vLLM",
    Phase.TRAIN: "forward, backward and the optimizer step (gradient all-reduce and clipping included)",
    Phase.WAIT: "waiting: for rollouts (async), for the other ranks at a collective (TRL's gathers), for data",
    Phase.EVAL: "evaluation (data.eval): generating and scoring the held-out prompts",
    Phase.SAVE: "writing a checkpoint",
    Phase.OTHER: "the rest of the step: logging, callbacks, the trainer's own bookkeeping",
}
_NOUNS = {Phase.GENERATE: "generation", Phase.SCORE: "scoring", Phase.SYNC: "weight sync", Phase.TRAIN: "training",
          Phase.WAIT: "waiting", Phase.EVAL: "evaluation", Phase.SAVE: "saving", Phase.OTHER: "the rest"}

# A phase inside which every nested mark counts for it: evaluation generates and scores too, and that is eval time.
ABSORBING = (Phase.EVAL, Phase.SAVE)
# What a step's time counts for outside any marked call (logging, callbacks), and before training starts.
BASE = Phase.OTHER
# The phases the step-time model predicts, in its order. Its TRAIN also holds the old policy's log-probability forward
# that the trainer measures as SCORE; its GENERATE, for a placement that generates beside the trainer, is the
# replicas' busy time for one step's samples.
PREDICTED = (Phase.GENERATE, Phase.SYNC, Phase.TRAIN, Phase.WAIT)
# What the bottleneck of a synchronous run is chosen among (the step is their sum).
SEQUENTIAL = (Phase.GENERATE, Phase.SCORE, Phase.SYNC, Phase.TRAIN, Phase.WAIT)
