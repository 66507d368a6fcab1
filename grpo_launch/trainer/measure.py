"""Every optimizer step measured on every trainer rank: wall-clock marks around TRL's own phases.

The marks wrap the trainer object's own methods (this instance only, never TRL's classes), each with the phase it
is (`contracts.phases.Phase`): TRL's generation call, its weight sync into vLLM, its scoring of a generation
batch, transformers' training step, its fetch of the next batch, the accelerator's gathers, evaluation and
checkpointing. A `PhaseClock` gives each moment to the innermost phase open then, so the phases of a step add up to
its wall time. At the end of each step every rank hands its numbers to rank 0 (one gather of a small tensor, where
the ranks meet anyway after the optimizer step), which appends the step's measure record to metrics.jsonl, and
appends what it did when (its timeline) to a file of its own. Nothing here changes what TRL computes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_launch.contracts import measures as m
from grpo_launch.contracts.phases import ABSORBING, BASE, Phase
from grpo_launch.contracts.rundir import append_metrics, append_timeline


class PhaseClock:
    """Wall time per phase, exclusive: the innermost open phase gets each moment; outside any, the base phase."""

    def __init__(self, base: Phase = BASE) -> None:
        self.stack = [base]
        self.since = self.started = time.time()
        self.totals: dict[Phase, float] = defaultdict(float)
        self.segments: list[list] = []

    def start(self) -> None:
        """Forget what was measured so far (model loading, the trainer's setup): the first step starts now."""
        self.since = self.started = time.time()
        self.totals.clear()
        self.segments.clear()

    def _switch(self, now: float) -> None:
        phase = self.stack[-1]
        spent = now - self.since
        if spent > 0:
            self.totals[phase] += spent
            last = self.segments[-1] if self.segments else None
            if last is not None and (last[0] == phase or spent < m.SEGMENT_S) and last[2] == self.since:
                last[2] = now
            else:
                self.segments.append([phase, self.since, now])
        self.since = now

    @contextmanager
    def phase(self, name: Phase) -> Iterator[None]:
        self._switch(time.time())
        self.stack.append(self.stack[-1] if self.stack[-1] in ABSORBING else name)
        try:
            yield
        finally:
            self._switch(time.time())
            self.stack.pop()

    def rebase(self, name: Phase) -> None:
        """From now on, time outside any marked call counts for `name` (the optimizer step after the last
        micro-batch is training; what follows the step's end is not)."""
        self._switch(time.time())
        self.stack[0] = name

    def close(self) -> dict[str, Any]:
        """This rank's share of the step that ends now; the clock goes on with the next step."""
        now = time.time()
        self._switch(now)
        share = {"start": self.started, "end": now,
                 "phases": {p: round(self.totals.get(p, 0.0), 6) for p in Phase},
                 "segments": [[p, round(a, 4), round(b, 4)] for p, a, b in self.segments]}
        self.started = now
        self.totals.clear()
        self.segments.clear()
        return share


COUNTS = (m.COMPLETIONS, m.PROMPT_TOKENS, m.COMPLETION_TOKENS, m.SAMPLES_TRAINED, m.TRAIN_FLOPS)


class StepMeter:
    """One rank's clock and counts for the step under way; its timeline goes to its own file of the run directory
    (`timeline`: this rank's, once training starts)."""

    def __init__(self, run_dir: Path, base: Phase = BASE) -> None:
        self.run_dir = run_dir
        self.clock = PhaseClock(base)
        self.counts: dict[str, float] = defaultdict(float)
        self.staleness: list[float] = []
        self.timeline: int | None = None

    def count(self, **counts: float) -> None:
        for key, value in counts.items():
            self.counts[key] += value

    def close(self, step: int) -> dict[str, Any]:
        """This rank's share of the step that ends now (numbers only: what rank 0 gathers); its segments are
        appended to its timeline file."""
        share = self.clock.close()
        segments = share.pop("segments")
        if self.timeline is not None:
            append_timeline(self.run_dir, self.timeline, step, segments)
        share["counts"] = {key: self.counts.get(key, 0.0) for key in COUNTS}
        s = self.staleness
        share["staleness"] = [sum(s), max(s, default=0.0), len(s)]
        self.counts.clear()
        self.staleness.clear()
        return share


def step_record(step: int, shares: list[dict[str, Any]]) -> dict[str, Any]:
    """The measure record of a step from every rank's share (rank order); rank 0's wall time is the step's."""
    ranks = len(shares)
    record: dict[str, Any] = {"step": step, "time": shares[0]["end"],
                              m.STEP_S: round(shares[0]["end"] - shares[0]["start"], 6)}
    for phase in Phase:
        record[phase.key] = round(sum(s["phases"][phase] for s in shares) / ranks, 6)
    for key in COUNTS:
        total = sum(s["counts"][key] for s in shares)
        record[key] = int(total) if key != m.TRAIN_FLOPS else float(total)
    staleness = [s["staleness"] for s in shares if s["staleness"][2]]
    if staleness:
        record[m.STALENESS_MEAN] = round(sum(x[0] for x in staleness) / sum(x[2] for x in staleness), 4)
        record[m.STALENESS_MAX] = max(x[1] for x in staleness)
    record[m.RANKS] = [{"rank": r, "start": s["start"], "end": s["end"], "phases": s["phases"]}
                       for r, s in enumerate(shares)]
    return record


def _pack(share: dict[str, Any]) -> list[float]:
    return [share["start"], share["end"], *(share["phases"][p] for p in Phase),
            *(share["counts"][k] for k in COUNTS), *share["staleness"]]


def _unpack(values: list[float]) -> dict[str, Any]:
    phases, rest = values[2:2 + len(Phase)], values[2 + len(Phase):]
    return {"start": values[0], "end": values[1], "phases": dict(zip(Phase, phases, strict=True)),
            "counts": dict(zip(COUNTS, rest[:len(COUNTS)], strict=True)), "staleness": rest[len(COUNTS):]}


def flops_per_token(config, seq_len: float) -> float:
    from trl.trainer.utils import compute_flops_per_token

    return float(compute_flops_per_token(config, max(1, round(seq_len))))


def batch_tokens(batch: dict) -> tuple[int, int, int] | None:
    """(completions, prompt tokens, completion tokens) of a GRPOTrainer batch; None for another trainer's batch."""
    if not isinstance(batch, dict) or "prompt_mask" not in batch or "completion_mask" not in batch:
        return None
    return (int(batch["completion_mask"].shape[0]), int(batch["prompt_mask"].sum()),
            int(batch["completion_mask"].sum()))


def _timed(clock: PhaseClock, phase: Phase, call: Callable, after: Phase | None = None) -> Callable:
    def timed(*args, **kwargs):
        with clock.phase(phase):
            out = call(*args, **kwargs)
        if after is not None:
            clock.rebase(after)
        return out

    return timed


def _counted(trainer, call: Callable, count: Callable[[int, int, int], None]) -> Callable:
    """`call`, passing the sizes of each GRPO batch it returns while the model trains (not evaluates) to `count`."""
    def counted(*args, **kwargs):
        batch = call(*args, **kwargs)
        sizes = batch_tokens(batch) if trainer.model.training else None
        if sizes is not None:
            count(*sizes)
        return batch

    return counted


def instrument(trainer, meter: StepMeter) -> None:
    """Wall-clock marks on this trainer's own phases (GRPOTrainer's, AsyncGRPOTrainer's), and the counts of what it
    generated and trained."""
    clock = meter.clock
    marks = (  # (object, method, phase, the base phase after it returns)
        (trainer, "training_step", Phase.TRAIN, Phase.TRAIN),  # forward + backward; TRL generates inside it
        (trainer, "_generate_and_score_completions", Phase.SCORE, None),
        (trainer, "_generate_single_turn", Phase.GENERATE, None),
        (getattr(trainer, "vllm_generation", None), "sync_weights", Phase.SYNC, None),
        (trainer, "_sync_weight", Phase.SYNC, None),            # AsyncGRPOTrainer's adapter or weight publish
        (trainer, "get_batch_samples", Phase.WAIT, None),       # the next batch: rollouts, in async
        (trainer.accelerator, "gather", Phase.WAIT, None),
        (trainer, "evaluate", Phase.EVAL, None),
        (trainer, "_save_checkpoint", Phase.SAVE, None),
    )
    for owner, name, phase, after in marks:
        if owner is not None and callable(getattr(owner, name, None)):
            setattr(owner, name, _timed(clock, phase, getattr(owner, name), after))

    config = trainer.model.config

    def count_generated(completions: int, prompt_tokens: int, completion_tokens: int) -> None:
        meter.count(**{m.COMPLETIONS: completions, m.PROMPT_TOKENS: prompt_tokens,
                       m.COMPLETION_TOKENS: completion_tokens})

    def count_trained(rows: int, prompt_tokens: int, completion_tokens: int) -> None:
        if rows:
            tokens = prompt_tokens + completion_tokens
            meter.count(**{m.SAMPLES_TRAINED: rows, m.TRAIN_FLOPS: flops_per_token(config, tokens / rows) * tokens})

    if callable(getattr(trainer, "_generate_and_score_completions", None)):
        trainer._generate_and_score_completions = _counted(trainer, trainer._generate_and_score_completions,
                                                           count_generated)
    trainer._prepare_inputs = _counted(trainer, trainer._prepare_inputs, count_trained)


def gather_shares(share: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's share on rank 0 (None on the others); this rank's alone without a process group. One gather of
    a small tensor: a fifth of a millisecond here, where gathering the shares as Python objects took 2.5 ms."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [share]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    mine = torch.tensor(_pack(share), dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())] if dist.get_rank() == 0 else None
    dist.gather(mine, out, dst=0)
    return [_unpack(t.tolist()) for t in out] if out is not None else None


def measure_callback(meter: StepMeter):
    """A transformers callback that starts the clock with training and writes each step's measure record."""
    from transformers import TrainerCallback

    class MeasureSteps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            meter.timeline = args.process_index
            meter.clock.start()

        def on_step_end(self, args, state, control, **kwargs):
            meter.clock.rebase(BASE)  # logging and saving follow; the next step's marks say the rest
            share = meter.close(state.global_step)
            with meter.clock.phase(Phase.WAIT):  # the ranks meet here anyway, after the optimizer step
                shares = gather_shares(share)
            if shares is not None:
                append_metrics(meter.run_dir, step_record(state.global_step, shares))

    return MeasureSteps()
