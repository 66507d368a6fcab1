"""Reading what a real vLLM engine says about itself: its /metrics (Prometheus text, kept by the supervisor in
logs/<process>.metrics when a run stops) and its log."""

from __future__ import annotations

import json
import re
from pathlib import Path

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric `name`: (labels, value)."""
    out = []
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found and found.group("name") == name:
            out.append((dict(LABEL.findall(found.group("labels") or "")), float(found.group("value"))))
    return out


def total(text: str, name: str) -> float:
    return sum(value for _, value in samples(text, name))


def final_metrics(run_dir: Path, process: str) -> str:
    return (run_dir / "logs" / f"{process}.metrics").read_text()


def adapters_run(text: str) -> set[str]:
    """The LoRA adapters the engine ran requests with: vLLM's lora_requests_info keeps a series per set of adapters
    running together (their names joined by commas)."""
    return {name for labels, _ in samples(text, "vllm:lora_requests_info")
            for name in labels["running_lora_adapters"].split(",")} - {""}


def adapters_loaded(log: str) -> list[str]:
    return re.findall(r"Loaded new LoRA adapter: name '([^']+)'", log)


def adapters_removed(log: str) -> list[str]:
    return re.findall(r"Removed LoRA adapter: name '([^']+)'", log)


def metrics_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# TRL's own measure of whether vLLM generated with the trainer's weights: |trainer log-prob - vLLM's| per token.
LOGP_DIFFERENCE = "sampling/sampling_logp_difference/max"
SYNC_CHECK = re.compile(r"weight sync check: vLLM \((\w+)\) generates with the trained weights")


def assert_generation_followed_training(run_dir: Path, steps: int) -> None:
    records = [r for r in metrics_records(run_dir) if LOGP_DIFFERENCE in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    # Every step generated with the weights of the step before: the trainer and vLLM agree to float32 precision
    # while training moves the weights (the loss is not zero throughout).
    assert max(r[LOGP_DIFFERENCE] for r in records) < 1e-4, [r[LOGP_DIFFERENCE] for r in records]
    assert any(abs(r["loss"]) > 0 for r in records)
