"""The GPU check: a few real GRPO steps of a Qwen2-shaped model (random weights, built offline) on one GPU, under
ZeRO-2 and ZeRO-3, measured beside what the plan predicts for the same layout: the step-time model's training phase
and the memory estimate. One prepared run for the short time a GPU machine is lent.

    make gpu-wheelhouse        # here, with network: the wheels the GPU machine lacks, into .cache/gpu-wheels
    make gpu-check             # there: installs them beside its torch and transformers, then runs this
    make gpu-check GPU_CHECK_RESULTS=DIR   # and copies the two result files to DIR

It plans each layout with `build_plan`, writes its run directory (`materialize`), and runs grpo-launch's own trainer
entrypoint code (TRL's GRPOTrainer, DeepSpeed from the plan's deepspeed.json) in a process of its own, timing the
phases from inside: generation, training (forward, backward and the optimizer step: DeepSpeed steps inside the
backward) and the step, with the peak memory of each phase. The table goes to stdout and, with the raw numbers, to
OUT/gpu_check.md and OUT/gpu_check.json.

Generation runs in transformers inside the trainer (the GPU machine has no vLLM), which the step-time model does not
cover: its time is measured and shown, not compared. The training phase is compared twice: as the plan predicts it
(its assumed lengths, docs/performance-model.md) and at the prompt and completion lengths the run measured, which is
the model's own check. Without CUDA it plans both layouts, builds the model, says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = (2, 3)
WARMUP_STEPS = 2           # the first steps allocate and autotune: left out of the medians
WORKER_TIMEOUT_S = 180     # one layout, model load to last step; the whole check stays under 8 minutes
MEASURED = "measurements.json"
GIB = 1024 ** 3


def gpu() -> dict | None:
    """The GPU's name and memory, asked in a process of its own (this one keeps no CUDA context), or None."""
    probe = ("import json, torch\n"
             "if torch.cuda.is_available():\n"
             "    p = torch.cuda.get_device_properties(0)\n"
             "    print(json.dumps({'name': p.name, 'gib': p.total_memory / 2**30}))\n")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return json.loads(line[0]) if line else None


def gpu_type(name: str) -> str:
    """'NVIDIA H200' -> 'H200', as cluster.gpu_type names a row of the accelerator table."""
    return name.removeprefix("NVIDIA ").strip()


def overrides(args, stage: int, model_dir: Path, device: dict) -> list[str]:
    """The layout: one GPU training a local Qwen2-shaped model with transformers generation, on the tiny-cpu
    recipe's task (built-in data and reward, offline)."""
    return ["recipe=tiny-cpu", "cluster=1x8-h100-80gb", "cluster.gpus_per_node=1",
            f"cluster.gpu_type={gpu_type(device['name'])}", f"cluster.gpu_memory_gib={device['gib']:.1f}",
            f"model.name_or_path={model_dir}", f"zero={stage}", "launcher=torchrun",
            f"trainer.max_steps={args.steps}", f"trainer.per_device_train_batch_size={args.batch}",
            "trainer.num_generations=8", f"trainer.max_completion_length={args.completion}",
            "trainer.gradient_checkpointing=true", "trainer.logging_steps=1", "trainer.learning_rate=1e-6"]


def build_model(args, model_dir: Path) -> dict:
    from grpo_launch.trainer.tiny_model import build

    if model_dir.exists():
        shutil.rmtree(model_dir)
    shape = {"hidden_size": args.hidden, "num_layers": args.layers, "num_heads": args.heads,
             "num_kv_heads": args.kv_heads, "max_position_embeddings": args.context}
    return build(model_dir, shape)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the worker: one layout, timed from inside the trainer process ----

class Device:
    """Synchronisation and peak memory of the GPU; on a CPU (the check's own test) no-ops and zeros."""

    def __init__(self):
        import torch

        self.cuda = torch.cuda if torch.cuda.is_available() else None

    def mark(self) -> float:
        if self.cuda:
            self.cuda.synchronize()
        return time.perf_counter()

    def reset_peak(self) -> None:
        if self.cuda:
            self.cuda.reset_peak_memory_stats()

    def peaks(self) -> tuple[float, float]:
        """(allocated, reserved) peaks since the last reset, GiB."""
        if not self.cuda:
            return 0.0, 0.0
        return self.cuda.max_memory_allocated() / GIB, self.cuda.max_memory_reserved() / GIB

    def used(self) -> float:
        """What the device holds, the CUDA context included, GiB."""
        if not self.cuda:
            return 0.0
        free, total = self.cuda.mem_get_info()
        return (total - free) / GIB


def worker(run_dir: Path) -> None:
    """Train the plan of `run_dir` as the trainer entrypoint does, with the phases timed; writes MEASURED."""
    os.chdir(run_dir)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_launch.contracts.rundir import read_plan
    from grpo_launch.trainer import main as trainer_main

    device = Device()
    mark = device.mark
    steps: list[dict] = []
    now: dict = {}
    generate = GRPOTrainer._generate_and_score_completions

    def timed_generation(self, inputs):
        start = mark()
        device.reset_peak()
        out = generate(self, inputs)
        now["generation_s"] += mark() - start
        now["generation_peak_gib"], now["generation_reserved_gib"] = device.peaks()
        now["prompt_width"] = int(out["prompt_ids"].shape[1])
        now["completion_width"] = int(out["completion_ids"].shape[1])
        now["completion_mean"] = float(out["completion_mask"].sum(1).float().mean())
        device.reset_peak()
        return out

    training_step = GRPOTrainer.training_step

    def timed_training_step(self, model, inputs, num_items_in_batch=None):
        start, generated = mark(), now["generation_s"]
        out = training_step(self, model, inputs, num_items_in_batch)
        now["training_s"] += mark() - start - (now["generation_s"] - generated)
        return out

    GRPOTrainer._generate_and_score_completions = timed_generation
    GRPOTrainer.training_step = timed_training_step

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            now.clear()
            now.update(generation_s=0.0, training_s=0.0, start=mark())
            device.reset_peak()

        def on_step_end(self, args, state, control, **kwargs):
            end = mark()
            allocated, reserved = device.peaks()
            steps.append({"step": state.global_step, "step_s": end - now.pop("start"), **now,
                          "training_peak_gib": allocated, "training_reserved_gib": reserved,
                          "device_used_gib": device.used()})

    common = trainer_main._common

    def with_steps(*args):  # the trainer's own arguments, whatever they are, plus the step timer
        kwargs = common(*args)
        return {**kwargs, "callbacks": [*kwargs["callbacks"], Steps()]}

    trainer_main._common = with_steps
    trainer_main.train(read_plan(trainer_main.RUN_DIR))
    Path(MEASURED).write_text(json.dumps({"steps": steps}, indent=1))


# ---- the check ----

def _median(steps: list[dict], key: str) -> float:
    kept = steps[WARMUP_STEPS:] or steps
    return statistics.median(s[key] for s in kept)


def _predicted_at(composed, plan, measured: list[dict]) -> float:
    """The training phase the model predicts at the measured lengths (padded prompt and completion widths)."""
    from grpo_launch.estimate.accelerators import accelerator
    from grpo_launch.estimate.step_time import Lengths, StepModel
    from grpo_launch.plan.model import resolve_model
    from grpo_launch.plan.placements import placement_of

    kept = measured[WARMUP_STEPS:] or measured
    prompt = statistics.median(s["prompt_width"] for s in kept)
    completion = statistics.median(s["completion_width"] for s in kept)
    lengths = Lengths(prompt=prompt, max_completion=completion, mean_completion=completion)
    config = composed.config
    model = StepModel(config, plan, resolve_model(config).resolved.shape, accelerator(config.cluster.gpu_type),
                      placement_of(config), lengths=lengths)
    return model.training.seconds


def _estimate(plan) -> dict:
    (budget,) = [b for b in plan.memory.gpus if "trainer" in b.role]
    phases = {p.name: p.total_gib for p in budget.phases}
    overhead = sum(c.gib for p in budget.phases[:1] for c in p.components if c.name == "CUDA/NCCL overhead")
    return {"training_gib": phases["training"], "generation_gib": phases["generation"], "overhead_gib": overhead}


def check(args) -> int:
    from grpo_launch.compose import compose
    from grpo_launch.contracts.phases import Phase
    from grpo_launch.materialize import materialize
    from grpo_launch.plan import build_plan

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = gpu()
    planned_for = device or {"name": "H100", "gib": 80.0}
    model_dir = out / "model"
    built = build_model(args, model_dir)
    print(f"model: Qwen2-shaped, {built['parameters'] / 1e6:.0f}M parameters, random weights, in {model_dir}")
    layouts = {}
    for stage in STAGES:
        composed = compose(overrides(args, stage, model_dir, planned_for))
        plan = build_plan(composed)
        training = plan.prediction.phase(Phase.TRAIN)
        estimate = _estimate(plan)
        print(f"ZeRO-{stage} on {planned_for['name']}: training predicted {training.seconds:.2f} s a step "
              f"({training.detail}); memory estimate {estimate['training_gib']:.1f} GiB training, "
              f"{estimate['generation_gib']:.1f} GiB generation")
        layouts[stage] = (composed, plan)
    if device is None:
        print("no CUDA device here: the GPU check planned both layouts and built the model; nothing is measured. "
              "Run `make gpu-check` on a GPU machine.")
        return 0
    results = []
    for stage, (composed, plan) in layouts.items():
        run_dir = out / f"zero{stage}"
        shutil.rmtree(run_dir, ignore_errors=True)
        materialize(composed, plan, [], run_dir)
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": "0",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, __file__, "--worker", str(run_dir)], env=env,
                                  timeout=WORKER_TIMEOUT_S, stdout=(run_dir / "worker.log").open("w"),
                                  stderr=subprocess.STDOUT)
            failed = done.returncode != 0
        except subprocess.TimeoutExpired:
            failed = True
        log_tail = (run_dir / "worker.log").read_text()[-3000:]
        if failed or not (run_dir / MEASURED).exists():
            print(f"ZeRO-{stage}: the run failed after {time.perf_counter() - started:.0f} s; its log ends:\n"
                  f"{log_tail}")
            results.append({"stage": stage, "failed": True, "log_tail": log_tail})
            continue
        measured = json.loads((run_dir / MEASURED).read_text())["steps"]
        results.append({"stage": stage, "failed": False, "wall_s": time.perf_counter() - started,
                        "steps": measured, "predicted_training_s": plan.prediction.phase(Phase.TRAIN).seconds,
                        "predicted_training_at_measured_s": _predicted_at(composed, plan, measured),
                        "estimate": _estimate(plan), "gpu": device})
    table = report(results)
    print(table)
    (out / "gpu_check.md").write_text(table + "\n")
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    if args.results:  # the two result files alone, e.g. where a GPU session's output is collected
        Path(args.results).mkdir(parents=True, exist_ok=True)
        for name in ("gpu_check.md", "gpu_check.json"):
            shutil.copy(out / name, Path(args.results) / name)
    return 1 if any(r["failed"] for r in results) else 0


def report(results: list[dict]) -> str:
    rows = ["| layout | quantity | plan (assumed lengths) | model at measured lengths | measured (median) | "
            "measured / model |", "|---|---|---|---|---|---|"]
    for r in results:
        name = f"ZeRO-{r['stage']}"
        if r["failed"]:
            rows.append(f"| {name} | the run failed (log in gpu_check.json) | | | | |")
            continue
        steps = r["steps"]
        training, at_measured = _median(steps, "training_s"), r["predicted_training_at_measured_s"]
        e = r["estimate"]
        peak = {key: max(s[key] for s in steps) for key in ("training_reserved_gib", "training_peak_gib",
                                                             "device_used_gib", "generation_reserved_gib")}
        # The estimate counts a fixed CUDA/NCCL overhead that the allocator's reserved bytes do not include.
        trained, generated = (peak[f"{p}_reserved_gib"] + e["overhead_gib"] for p in ("training", "generation"))
        rows += [
            f"| {name} | training phase, s | {r['predicted_training_s']:.3f} | {at_measured:.3f} | {training:.3f} | "
            f"{training / at_measured:.2f} |",
            f"| {name} | generation (transformers, not modeled), s | - | - | {_median(steps, 'generation_s'):.3f} "
            f"| - |",
            f"| {name} | step, s | - | - | {_median(steps, 'step_s'):.3f} | - |",
            f"| {name} | peak memory, training: estimate / reserved + overhead, GiB | {e['training_gib']:.2f} | - | "
            f"{trained:.2f} (allocated {peak['training_peak_gib']:.2f}, device {peak['device_used_gib']:.2f}) | "
            f"{trained / e['training_gib']:.2f} |",
            f"| {name} | peak memory, generation: estimate / reserved + overhead, GiB | {e['generation_gib']:.2f} | - "
            f"| {generated:.2f} | {generated / e['generation_gib']:.2f} |",
            f"| {name} | lengths: prompt / completion width, mean completion | - | - | "
            f"{_median(steps, 'prompt_width'):.0f} / {_median(steps, 'completion_width'):.0f}, "
            f"{_median(steps, 'completion_mean'):.0f} | - |"]
    gpu_name = next((r["gpu"]["name"] for r in results if not r["failed"]), "?")
    return (f"GPU check on {gpu_name}: {len(results)} layouts, medians over the steps after the first "
            f"{WARMUP_STEPS}\n\n" + "\n".join(rows))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu-check", help="where the model, run directories and results go")
    parser.add_argument("--results", help="also copy gpu_check.md and gpu_check.json here")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per layout")
    parser.add_argument("--batch", type=int, default=8, help="per-device batch (a multiple of 8 generations)")
    parser.add_argument("--completion", type=int, default=224, help="max_completion_length")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=256, help="max_position_embeddings: prompt + completion")
    parser.add_argument("--worker", metavar="RUN_DIR", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.worker:
        worker(Path(args.worker))
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
