"""Response templates for TRL's async rollout worker, which must parse each completion into a chat message.

TRL knows the chat formats of common families (`trl.chat_template_utils.add_response_schema`) and refuses others,
Qwen2.5-Math's and the built-in tiny model's among them. For those, grpo-launch reads ChatML completions up to
`<|im_end|>`, and anything else as plain assistant text up to the end-of-sequence token.
"""

from __future__ import annotations

import re
from typing import Any


def chatml_template() -> dict[str, Any]:
    return {"defaults": {"role": "assistant"}, "start_anchor": "<|im_start|>assistant\n",
            "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*|$", "content": "text"}}}


def plain_template(eos_token: str) -> dict[str, Any]:
    return {"defaults": {"role": "assistant"},
            "fields": {"content": {"close_pattern": rf"{re.escape(eos_token)}\s*|$", "content": "text"}}}


def ensure_response_template(tokenizer) -> None:
    """Give `tokenizer` a response template TRL's rollout worker can parse completions with."""
    if getattr(tokenizer, "response_template", None) is not None:
        return
    from trl.chat_template_utils import add_response_schema

    try:
        add_response_schema(tokenizer)
        return
    except ValueError:  # a chat format TRL does not know
        pass
    template = tokenizer.chat_template or ""
    tokenizer.response_template = chatml_template() if "<|im_start|>" in template else plain_template(
        tokenizer.eos_token)
