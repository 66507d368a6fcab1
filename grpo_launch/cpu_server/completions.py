"""/v1/completions: the request fields TRL's rollout worker sends, validated as vLLM validates them, and the response
fields it reads back (choices[i].token_ids and choices[i].logprobs.token_logprobs), in vLLM's shapes.

Fields vLLM knows but this engine does not implement are refused with 400 when set to anything but their default,
rather than silently ignored; unknown fields are ignored, as vLLM ignores them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from grpo_launch.cpu_server.api_error import bad_request
from grpo_launch.cpu_server.engine import Engine, GenerationJob
from grpo_launch.cpu_server.generation import SequenceOutput
from grpo_launch.cpu_server.lora import Adapter
from grpo_launch.cpu_server.sampling import SamplingParams
from grpo_launch.cpu_server.settings import ServerSettings

UNSUPPORTED_FIELDS = ("stream", "echo", "use_beam_search", "best_of", "prompt_logprobs", "presence_penalty",
                      "frequency_penalty", "logit_bias", "stop", "suffix", "min_tokens", "allowed_token_ids",
                      "bad_words", "response_format", "structured_outputs", "logprob_token_ids", "prompt_embeds")
DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions, also when max_tokens is null
INT64 = 2**63
EMPTY_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."
# What an OpenAI client may receive for a logprob of a masked token: JSON has no -inf.
LOWEST_LOGPROB = -9999.0


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[list[int]]
    n: int
    params: SamplingParams
    seed: int | None
    return_token_ids: bool
    tokens_as_token_ids: bool
    skip_special_tokens: bool

    def job(self, adapter: Adapter | None) -> GenerationJob:
        return GenerationJob(prompts=self.prompts, n=self.n, params=self.params, seed=self.seed, adapter=adapter)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], key: str, default: float | None, low: float, high: float, *, integer: bool = False,
            low_open: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not (_is_int(value) if integer else _is_int(value) or isinstance(value, float)):
        raise bad_request(f"`{key}` must be {'an integer' if integer else 'a number'}, got {value!r}.", key)
    if not (low < value if low_open else low <= value) or value > high:
        raise bad_request(f"`{key}` must be in {'(' if low_open else '['}{low}, {high}], got {value}.", key)
    return value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"`{key}` must be a boolean, got {value!r}.", key)
    return value


def _token_list(value: Any, vocab_size: int) -> list[int] | None:
    if not isinstance(value, list) or not all(_is_int(t) for t in value):
        return None
    if not value:
        raise bad_request(EMPTY_PROMPT, "prompt")
    out_of_vocabulary = [t for t in value if not 0 <= t < vocab_size]
    if out_of_vocabulary:
        raise bad_request(f"Token id {max(out_of_vocabulary)} is out of vocabulary", "prompt")
    return value


def _prompts(value: Any, engine: Engine) -> list[list[int]]:
    """A string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(value, str):
        value = [value]
    single = _token_list(value, engine.vocab_size)
    if single is not None:
        return [single]
    if not isinstance(value, list) or not value:
        raise bad_request(EMPTY_PROMPT if not value else "`prompt` must be a string, a list of strings, a list of "
                          "token ids or a list of lists of token ids.", "prompt")
    prompts = []
    for item in value:
        ids = engine.tokenize(item) if isinstance(item, str) and item else _token_list(item, engine.vocab_size)
        if not ids:
            raise bad_request(EMPTY_PROMPT if item in ("", []) else f"Not a prompt: {item!r}", "prompt")
        prompts.append(ids)
    return prompts


def _check_lengths(prompts: list[list[int]], max_tokens: int, max_model_len: int) -> None:
    for prompt in prompts:
        if len(prompt) >= max_model_len:
            raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your request "
                              f"has {len(prompt)} input tokens. Please reduce the length of the input messages.",
                              "prompt")
        if len(prompt) + max_tokens > max_model_len:
            raise bad_request(f"'max_tokens' is too large: {max_tokens}. This model's maximum context length is "
                              f"{max_model_len} tokens and your request has {len(prompt)} input tokens ({max_tokens} "
                              f"> {max_model_len} - {len(prompt)}).", "max_tokens")


def _logprobs(body: dict[str, Any], max_logprobs: int) -> int | None:
    value = body.get("logprobs")
    if value is None:
        return None
    if not _is_int(value) or value < -1:
        raise bad_request("`logprobs` must be a positive value or -1.", "logprobs")
    if max_logprobs != -1 and (value == -1 or value > max_logprobs):
        raise bad_request(f"Requested sample logprobs of {value}, which is greater than max allowed: {max_logprobs}",
                          "logprobs")
    return value


def parse_completion_request(body: Any, settings: ServerSettings, engine: Engine) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) not in (None, False, 0, "", [], {}):
            raise bad_request(f"`{key}` is not supported by this CPU engine (grpo_launch.cpu_server is not vLLM).",
                              key)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("`model` must be a string.", "model")
    prompts = _prompts(body.get("prompt"), engine)
    max_tokens = _number(body, "max_tokens", DEFAULT_MAX_TOKENS, 1, settings.max_model_len, integer=True)
    _check_lengths(prompts, max_tokens, settings.max_model_len)
    top_k = _number(body, "top_k", 0, -1, INT64, integer=True)
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list) or not all(_is_int(t) for t in stop_token_ids):
        raise bad_request("`stop_token_ids` must be a list of token ids.", "stop_token_ids")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, float("inf")),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=max(top_k, 0),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, float("inf"), low_open=True),
        ignore_eos=_flag(body, "ignore_eos", False),
        stop_token_ids=tuple(stop_token_ids),
        logprobs=_logprobs(body, settings.max_logprobs))
    return CompletionRequest(
        model=model, prompts=prompts, n=_number(body, "n", 1, 1, INT64, integer=True), params=params,
        seed=_number(body, "seed", None, -INT64, INT64 - 1, integer=True),
        return_token_ids=_flag(body, "return_token_ids", False),
        tokens_as_token_ids=_flag(body, "return_tokens_as_token_ids", False),
        skip_special_tokens=_flag(body, "skip_special_tokens", True))


def _logprobs_block(out: SequenceOutput, request: CompletionRequest, engine: Engine) -> dict[str, Any]:
    def text(token_id: int) -> str:
        return f"token_id:{token_id}" if request.tokens_as_token_ids else engine.token_text(token_id)

    tokens = [text(t) for t in out.token_ids]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "text_offset": offsets,
        "token_logprobs": [max(lp, LOWEST_LOGPROB) for lp in out.logprobs],
        "tokens": tokens,
        "top_logprobs": [{text(t): max(lp, LOWEST_LOGPROB) for t, lp in top.items()} for top in out.top_logprobs],
    }


def completion_response(request: CompletionRequest, model_name: str, outputs: list[list[SequenceOutput]],
                        engine: Engine) -> dict[str, Any]:
    """Choices in vLLM's order: prompt by prompt, then sample by sample (index = prompt * n + sample)."""
    choices = []
    for prompt, samples in zip(request.prompts, outputs, strict=True):
        for out in samples:
            choices.append({
                "index": len(choices),
                "text": engine.decode(out.token_ids, skip_special_tokens=request.skip_special_tokens),
                "logprobs": _logprobs_block(out, request, engine) if request.params.logprobs is not None else None,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
                "token_ids": out.token_ids if request.return_token_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if request.return_token_ids else None,
            })
    prompt_tokens = sum(len(p) for p in request.prompts)
    completion_tokens = sum(len(out.token_ids) for samples in outputs for out in samples)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": model_name, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": None},
    }
