"""The training dataset: a built-in task, a hub dataset or local files, mapped to TRL's columns.

TRL wants a `prompt` column (text, or chat messages); the recipe's answer column reaches reward functions as
`solution` (the name TRL's accuracy reward reads). Other columns pass through to reward functions as keywords.
"""

from __future__ import annotations

import importlib
from typing import Any

from grpo_launch.contracts.builtins import TASKS
from grpo_launch.contracts.inputs import Data

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def import_target(target: str) -> Any:
    """Import 'module:attribute' (module may be dotted)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _dig(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        value = value[part]
    return value


def load_training_dataset(data: Data, seed: int, *, chat: bool = False):
    """The dataset with TRL's columns; `chat=True` makes every prompt a list of chat messages (AsyncGRPOTrainer's
    rollout worker renders each prompt through the chat template and cannot take plain text)."""
    from datasets import Dataset, load_dataset

    if data.source == "builtin":
        rows = import_target(TASKS[data.path])(data.num_samples, seed)
        dataset = Dataset.from_list(rows)
    elif data.source == "hub":
        dataset = load_dataset(data.path, data.config, split=data.split)
    else:
        suffix = next(s for s in FILE_BUILDERS if data.path.endswith(s))
        dataset = load_dataset(FILE_BUILDERS[suffix], data_files=data.path, split="train")
    if data.max_samples is not None:
        dataset = dataset.select(range(min(data.max_samples, len(dataset))))

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
