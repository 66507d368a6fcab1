"""Built-in reward functions (rewards[].fn names them; see grpo_launch.contracts.builtins.REWARDS).

TRL calls each as f(prompts=..., completions=..., completion_ids=..., **dataset_columns) and expects one float per
completion. Completions are strings, or lists of chat messages for chat-formatted prompts.
"""

from __future__ import annotations

from typing import Any


def _text(completion: Any) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def sevens(completions: list, **_: Any) -> list[float]:
    """Share of '7's among the first four characters: trivial to learn, so a tiny model shows learning fast."""
    return [sum(ch == "7" for ch in _text(c)[:4]) / 4 for c in completions]


def length_penalty(completion_ids: list[list[int]], **_: Any) -> list[float]:
    """-tokens/1024, floored at -1: prefers shorter completions; add it beside an accuracy reward."""
    return [max(-1.0, -len(ids) / 1024) for ids in completion_ids]
