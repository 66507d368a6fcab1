"""The tokens a generation request's prompt starts with: what the router hashes.

Token-id prompts (TRL's rollout worker sends these) are used as they are. Text prompts and chat messages are
tokenized here with the model's tokenizer, loaded on the first text prompt; the replica tokenizes again itself, the
proxy only needs the same text to give the same tokens. Chat messages are joined role by role without the model's
chat template: block boundaries shift by the template's few tokens, which moves no prompt to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from typing import Any

from grpo_launch.proxy.config import tokenizer_file

log = logging.getLogger("grpo_launch.proxy")


def routing_tokens(body: dict[str, Any]) -> list[int] | str | None:
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
    """Loads the tokenizer off the event loop when the first text prompt arrives. Prompts wait for it at most
    `patience_s` from then (a local tokenizer.json loads well within); a hub download that takes longer, or fails,
    leaves text prompts routed by load alone instead of holding them."""

    def __init__(self, source: str | None, patience_s: float = 2.0) -> None:
        self.source = source
        self.patience_s = patience_s
        self._loading: asyncio.Future | None = None
        self._patience_until = 0.0

    async def encode(self, text: str) -> list[int] | None:
        if self.source is None:
            return None
        loop = asyncio.get_running_loop()
        if self._loading is None:
            self._loading = _in_daemon_thread(loop, _load, self.source)
            self._patience_until = loop.time() + self.patience_s
        if not self._loading.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._loading), self._patience_until - loop.time())
            except Exception:  # still loading (TimeoutError) or failed
                return None
        try:
            tokenizer = self._loading.result()
        except Exception:  # logged once by _load
            return None
        return tokenizer.encode(text).ids


def _in_daemon_thread(loop: asyncio.AbstractEventLoop, fn, *args) -> asyncio.Future:
    """`fn(*args)` in a daemon thread: unlike asyncio.to_thread, a hub download still retrying never holds up
    the proxy's exit."""
    future = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            (future.set_exception if failed else future.set_result)(outcome)

    def work() -> None:
        try:
            outcome, failed = fn(*args), False
        except Exception as e:
            outcome, failed = e, True
        with contextlib.suppress(RuntimeError):  # the loop closed while we worked: nobody is waiting
            loop.call_soon_threadsafe(settle, outcome, failed)

    threading.Thread(target=work, name="grpo-proxy-tokenizer", daemon=True).start()
    return future


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
