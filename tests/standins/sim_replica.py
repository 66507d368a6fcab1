"""A simulated `vllm serve` replica for the proxy's tests and benchmark: vLLM's HTTP shapes, no GPU.

It keeps a real LRU prefix cache of full blocks (keyed like vLLM's: chained, seeded with the adapter name) and
charges time for uncached prompt tokens (one prefill at a time, like a GPU busy with one forward) and for generated
tokens (decoding overlaps across requests, like continuous batching, but stalls while the replica prefills).
Faults on demand: adapter directories that appear late (a lagging shared mount), refused loads or state changes,
failed health probes, a connection dropped before or after the call took effect, death in the middle of a request,
a held stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from grpo_launch.proxy.router import block_hashes


@dataclass
class SimStats:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    busy_s: float = 0.0                      # prefill + decode time charged
    authorization: list[str | None] = field(default_factory=list)  # Authorization header of each call

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "generated_tokens": self.generated_tokens, "busy_s": self.busy_s}


class SimReplica:
    def __init__(self, name: str = "sim", *, model: str = "sim/base", max_model_len: int = 4096,
                 tensor_parallel_size: int = 1, block_size: int = 16, cache_blocks: int = 100_000,
                 prefill_s_per_token: float = 0.0, decode_s_per_token: float = 0.0, base_latency_s: float = 0.0,
                 max_lora_rank: int = 32, max_loras: int = 6) -> None:
        self.name, self.model, self.max_model_len = name, model, max_model_len
        self.tensor_parallel_size, self.block_size, self.cache_blocks = tensor_parallel_size, block_size, cache_blocks
        self.prefill_s_per_token, self.decode_s_per_token = prefill_s_per_token, decode_s_per_token
        self.base_latency_s = base_latency_s
        self.max_lora_rank, self.max_loras = max_lora_rank, max_loras
        # Faults, set by a test.
        self.adapter_lag_s = 0.0             # a directory becomes visible this long after it was first asked for
        self.refuse_loads = False            # every load fails with a 500 (an engine error)
        self.refuse: set[str] = set()        # these paths answer 500 and change nothing
        # path -> how its next call goes unanswered: "before" it takes effect (the connection closes), "after" it,
        # "cut" (takes effect, then the answer stops halfway), "hang" (takes effect, then no answer at all).
        self.unanswered: dict[str, str] = {}
        self.health_failures = 0             # the next N /health probes answer 503
        self.die_on_request = False          # the next generation request kills the server before answering
        self.stream_gate: asyncio.Event | None = None  # streams send their first event, then wait for this
        self.stats = SimStats()
        self.adapters: dict[str, str] = {}
        self.paused = False
        self.calls: list[str] = []           # paths of every non-generation call, in order
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._first_asked: dict[str, float] = {}
        self._prefill = asyncio.Lock()
        self._prefill_s_total = 0.0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._record])
        app.router.add_get("/health", self.health)
        app.router.add_get("/is_paused", lambda r: web.json_response({"is_paused": self.paused}))
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_world_size", self.world_size)
        app.router.add_post("/v1/load_lora_adapter", self.load_adapter)
        app.router.add_post("/v1/unload_lora_adapter", self.unload_adapter)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/pause", self.set_paused)
        app.router.add_post("/resume", self.set_paused)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/sleep", self.reset_prefix_cache)  # vLLM drops its prefix cache on sleep
        app.router.add_post("/wake_up", lambda r: web.Response())
        app.router.add_get("/sim/stats", lambda r: web.json_response(self.stats.to_json()))
        app.router.add_post("/sim/reset", self.reset)
        return app

    async def start(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Listen (again, after `stop`, on the same port unless told otherwise); returns the port."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port or self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        """Die: stop listening and drop every open connection."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @web.middleware
    async def _record(self, request: web.Request, handler) -> web.StreamResponse:
        self.stats.authorization.append(request.headers.get("Authorization"))
        if request.path not in ("/v1/completions", "/v1/chat/completions", "/health"):
            self.calls.append(request.path)
        if request.path in self.refuse:
            return _error(500, f"simulated engine failure on {request.path}", "InternalServerError")
        how = self.unanswered.pop(request.path, None)
        if how is None:
            return await handler(request)
        if how != "before":
            await handler(request)
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "cut":
            response = web.StreamResponse(headers={"Content-Length": "100", "Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"status":')
        request.transport.close()  # the caller sees the connection end without a (whole) answer
        return web.Response()      # never sent: the transport is closed

    async def health(self, request: web.Request) -> web.Response:
        if self.health_failures:
            self.health_failures -= 1
            return web.Response(status=503)
        return web.Response()

    # -- vLLM's endpoints -----------------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        cards = [{"id": self.model, "object": "model", "root": self.model, "parent": None,
                  "max_model_len": self.max_model_len}]
        cards += [{"id": n, "object": "model", "root": p, "parent": self.model, "max_model_len": self.max_model_len}
                  for n, p in self.adapters.items()]
        return web.json_response({"object": "list", "data": cards})

    async def server_info(self, request: web.Request) -> web.Response:
        tp = self.tensor_parallel_size
        config = {
            "model_config": {"model": self.model, "dtype": "torch.bfloat16", "max_model_len": self.max_model_len},
            "cache_config": {"block_size": self.block_size, "enable_prefix_caching": True},
            "parallel_config": {"tensor_parallel_size": tp, "pipeline_parallel_size": 1, "data_parallel_size": 1,
                                "data_parallel_size_local": 1, "world_size": tp},
            "lora_config": {"max_lora_rank": self.max_lora_rank, "max_loras": self.max_loras,
                            "max_cpu_loras": self.max_loras},
        }
        if request.query.get("config_format") != "json":
            return web.json_response({"vllm_config": str(config)})
        return web.json_response({"vllm_config": config})

    async def world_size(self, request: web.Request) -> web.Response:
        return web.json_response({"world_size": self.tensor_parallel_size})

    async def load_adapter(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "BadRequestError")
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                               f"in place, set 'load_inplace' to True.", "InvalidUserInput")
        if self.refuse_loads:
            return _error(500, f"simulated engine failure loading {name}", "InternalServerError")
        first = self._first_asked.setdefault(path, time.monotonic())
        if not os.path.isdir(path) or time.monotonic() - first < self.adapter_lag_s:
            return _error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        self.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_adapter(self, request: web.Request) -> web.Response:
        name = (await request.json()).get("lora_name")
        if self.adapters.pop(name, None) is None:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def set_paused(self, request: web.Request) -> web.Response:
        self.paused = request.path == "/pause"
        return web.json_response({"status": "paused" if self.paused else "resumed"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self._cache.clear()
        return web.json_response({"success": True})

    async def reset(self, request: web.Request) -> web.Response:
        """Forget everything (cache, adapters, counters), then take new costs if given: between benchmark runs."""
        settings = await request.json() if request.can_read_body else {}
        for key in ("prefill_s_per_token", "decode_s_per_token", "base_latency_s"):
            if key in settings:
                setattr(self, key, float(settings[key]))
        self._cache.clear()
        self._first_asked.clear()
        self.adapters.clear()
        self.paused = False
        self.stats = SimStats()
        return web.json_response({})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.die_on_request:
            self.die_on_request = False
            asyncio.get_running_loop().call_soon(asyncio.ensure_future, self.stop())
            await asyncio.sleep(3600)  # cancelled by the shutdown: the client never gets an answer
        model = body.get("model")
        if model != self.model and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        tokens = _prompt_tokens(body)
        generated = int(body.get("max_tokens") or 16)
        cached = self._lookup_and_cache(model, tokens)
        self.stats.requests += 1
        self.stats.prompt_tokens += len(tokens)
        self.stats.cached_tokens += cached
        self.stats.generated_tokens += generated
        prefill_s = (len(tokens) - cached) * self.prefill_s_per_token
        decode_s = generated * self.decode_s_per_token
        self.stats.busy_s += prefill_s + decode_s
        if prefill_s:
            async with self._prefill:
                await asyncio.sleep(prefill_s)
                self._prefill_s_total += prefill_s
        if self.base_latency_s or decode_s:
            await self._decode(self.base_latency_s + decode_s)
        chat = request.path.endswith("chat/completions")
        if body.get("stream"):
            return await self._stream(request, model, generated, chat)
        usage = {"prompt_tokens": len(tokens), "completion_tokens": generated,
                 "total_tokens": len(tokens) + generated, "prompt_tokens_details": {"cached_tokens": cached}}
        token_ids = [7] * generated
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": "7" * generated},
                      "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": "7" * generated, "token_ids": token_ids,
                      "logprobs": {"token_logprobs": [-0.5] * generated}, "finish_reason": "length"}
        return web.json_response({"id": f"cmpl-{self.name}-{self.stats.requests}", "object":
                                  "chat.completion" if chat else "text_completion", "model": model,
                                  "choices": [choice], "usage": usage}, headers={"x-sim-replica": self.name})

    async def _stream(self, request: web.Request, model: str, generated: int, chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-sim-replica": self.name})
        await response.prepare(request)
        for i in range(generated):
            delta = {"index": 0, "delta": {"content": "7"}} if chat else {"index": 0, "text": "7"}
            event = {"id": f"cmpl-{self.name}", "model": model, "choices": [delta]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            if i == 0 and self.stream_gate is not None:
                await self.stream_gate.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _decode(self, seconds: float) -> None:
        """Decoding overlaps across requests, but a GPU runs one step at a time: prefill that ran meanwhile on this
        replica delayed every step, so it delays this request too (a few rounds catch prefill during the stall)."""
        seen = self._prefill_s_total
        await asyncio.sleep(seconds)
        for _ in range(3):
            stall, seen = self._prefill_s_total - seen, self._prefill_s_total
            if stall <= 0:
                return
            await asyncio.sleep(stall)

    def _lookup_and_cache(self, model: str, tokens: list[int]) -> int:
        """Prompt tokens found in the cache (leading full blocks), then the prompt's blocks cached, LRU-bounded."""
        hashes = block_hashes(model, tokens, self.block_size)
        hits = 0
        for h in hashes:
            if h not in self._cache:
                break
            hits += 1
        for h in hashes:
            self._cache[h] = None
            self._cache.move_to_end(h)
        while len(self._cache) > self.cache_blocks:
            self._cache.popitem(last=False)
        # Like vLLM, the last prompt token is always computed: it produces the first output token.
        return min(hits * self.block_size, max(len(tokens) - 1, 0))


def _prompt_tokens(body: dict[str, Any]) -> list[int]:
    """Token ids as sent; text as its UTF-8 bytes (the simulation needs a tokenization, not the model's)."""
    if "messages" in body:
        return list("".join(str(m.get("content", "")) for m in body["messages"]).encode())
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    return list(prompt.encode()) if isinstance(prompt, str) else list(prompt)


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)
