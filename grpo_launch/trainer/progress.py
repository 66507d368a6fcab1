"""Where this trainer rank is (its phase, and the step it is computing), and the record it leaves when it fails.

A rank that raises writes logs/trainer-rank<R>.failure.json: the phase and step it was in, the exception and its
whole traceback. The supervisor names the process, rank and step from it, and shows that traceback rather than
the last log lines, where several ranks' tracebacks and the launcher's own report interleave.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from grpo_launch.contracts.rundir import TrainerFailure, write_trainer_failure
from grpo_launch.contracts.secrets import redact


class Progress:
    def __init__(self) -> None:
        self.phase = "starting"
        self.step: int | None = None   # the step being computed, from 1; None before training

    def enter(self, phase: str) -> None:
        self.phase, self.step = phase, None

    def at_step(self, step: int) -> None:
        self.phase, self.step = "training", step


PROGRESS = Progress()


def step_callback():
    """A transformers callback keeping PROGRESS at the step being computed (rewards are computed within it)."""
    from transformers import TrainerCallback

    class StepProgress(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            PROGRESS.at_step(state.global_step + 1)

        def on_train_end(self, args, state, control, **kwargs):
            PROGRESS.enter("saving the model")

    return StepProgress()


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_failure(error: BaseException, secrets: tuple[str, ...]) -> None:
    """The failure record of this rank, in the run directory (the working directory), without the `secrets`."""
    write_trainer_failure(Path("."), TrainerFailure(
        rank=rank(), phase=PROGRESS.phase, step=PROGRESS.step, time=time.time(),
        error=redact("".join(traceback.format_exception_only(error)).strip(), secrets),
        traceback=redact("".join(traceback.format_exception(error)), secrets)))
