"""The tokens a generation request's prompt starts with: what the router hashes.

Token-id prompts (TRL's rollout worker sends these) are used as they are. Text prompts and chat messages are
tokenized here with the model's tokenizer, loaded on the first text prompt; the replica tokenizes again itself, the
proxy only needs the same text to give the same tokens. Chat messages are joined role by role without the model's
chat template: block boundaries shift by the template's few tokens, which moves no prompt to another replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from grpo_launch.proxy.config import tokenizer_file

log = logging.getLogger("grpo_launch.proxy")


def prompt_of(body: dict[str, Any]) -> list[int] | str | None:
    """The routing prompt of a /v1/completions or /v1/chat/completions body; a batch routes on its first prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(f"<{m.get('role', '')}>{_text(m.get('content'))}" for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, (str, list)):
        return prompt
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts; only text parts shape the prefix we can see
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class LazyTokenizer:
    """Loads the tokenizer once, off the event loop, when the first text prompt arrives; None if it cannot."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self._loading: asyncio.Task | None = None

    async def encode(self, text: str) -> list[int] | None:
        if self.source is None:
            return None
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(_load, self.source))
        try:
            tokenizer = await asyncio.shield(self._loading)
        except Exception:  # already logged once by _load; text prompts route by load alone
            return None
        return tokenizer.encode(text).ids


def _load(source: str):
    from tokenizers import Tokenizer

    try:
        local = tokenizer_file(source)
        if local is not None:
            tokenizer = Tokenizer.from_file(str(local))
        else:
            tokenizer = Tokenizer.from_pretrained(source, token=os.environ.get("HF_TOKEN") or None)
    except Exception as e:
        log.warning("cannot load tokenizer %s (%s): text prompts are routed by load only", source, e)
        raise
    log.info("tokenizer %s loaded for text prompts", source)
    return tokenizer
