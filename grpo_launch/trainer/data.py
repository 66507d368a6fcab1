"""The training dataset: a built-in task, a hub dataset or local files, mapped to TRL's columns.

TRL wants a `prompt` column (text, or chat messages); the recipe's answer column reaches reward functions as
`solution` (the name TRL's accuracy reward reads). Other columns pass through to reward functions as keywords.
"""

from __future__ import annotations

import importlib
from typing import Any

from grpo_launch.contracts.builtins import HELD_OUT, HELD_OUT_ROWS, TASKS
from grpo_launch.contracts.inputs import Data

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
HELD_OUT_SEED = 1_000_003  # a built-in task's held-out rows: a seed no recipe trains with by default (42)


def import_target(target: str) -> Any:
    """Import 'module:attribute' (module may be dotted)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _dig(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        value = value[part]
    return value


def _rows(data: Data, seed: int, split: str | None = None):
    """The raw rows of the training data, or of another split or file of it."""
    from datasets import Dataset, load_dataset

    if data.source == "builtin":
        return Dataset.from_list(import_target(TASKS[data.path])(data.num_samples, seed))
    if data.source == "hub":
        return load_dataset(data.path, data.config, split=split or data.split)
    path = split or data.path
    suffix = next(s for s in FILE_BUILDERS if path.endswith(s))
    return load_dataset(FILE_BUILDERS[suffix], data_files=path, split="train")


def _held_out(data: Data, seed: int):
    """The evaluation rows `data.eval` names."""
    from datasets import Dataset

    if data.eval != HELD_OUT:
        return _rows(data, seed, data.eval)
    wanted = data.eval_samples or HELD_OUT_ROWS
    if data.source == "builtin":
        # Rows of the task's generator with a seed of their own, the same for every run (so runs of any seed
        # evaluate alike), less any prompt this run trains on.
        make = import_target(TASKS[data.path])
        trained = {row["prompt"] for row in make(data.num_samples, seed)}
        fresh = [row for row in make(data.num_samples + wanted, HELD_OUT_SEED) if row["prompt"] not in trained]
        return Dataset.from_list(fresh[:wanted])
    rows = _rows(data, seed)
    return rows.select(range(max(0, len(rows) - wanted), len(rows)))  # the last rows, which training skips


def load_training_dataset(data: Data, seed: int, *, chat: bool = False, held_out: bool = False):
    """The dataset with TRL's columns (`held_out`: the evaluation rows `data.eval` names); `chat=True` makes every
    prompt a list of chat messages (AsyncGRPOTrainer's rollout worker renders each prompt through the chat template
    and cannot take plain text)."""
    if held_out:
        dataset = _held_out(data, seed)
        limit = data.eval_samples
    else:
        dataset = _rows(data, seed)
        if data.eval == HELD_OUT and data.source != "builtin":  # its last rows are held out for evaluation
            dataset = dataset.select(range(max(0, len(dataset) - (data.eval_samples or HELD_OUT_ROWS))))
        limit = data.max_samples
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))

    prompt_column, answer_column, system = data.prompt_column, data.answer_column, data.system_prompt
    if prompt_column not in dataset.column_names:
        raise KeyError(f"data.prompt_column '{prompt_column}' is not a column of {data.path}: "
                       f"{dataset.column_names}")

    def to_trl(row: dict) -> dict:
        prompt = row[prompt_column]
        if system is not None or chat:
            prompt = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if system is not None:
            prompt = [{"role": "system", "content": system}, *prompt]
        out = {"prompt": prompt}
        if answer_column is not None:
            out["solution"] = _dig(row, answer_column)
        return out

    return dataset.map(to_trl)
