"""The proxy's HTTP face (aiohttp): generation routed by KV prefix, state changes broadcast, the rest answered as one
vLLM server of data-parallel size 1 (TRL turns adapter-only sync off for anything larger)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from grpo_launch.contracts.secrets import key_matches
from grpo_launch.errors import UserError
from grpo_launch.proxy import broadcast
from grpo_launch.proxy.config import ProxyConfig, tokenizer_file
from grpo_launch.proxy.fleet import Fleet, Replica
from grpo_launch.proxy.metrics import ProxyStats
from grpo_launch.proxy.prompts import LazyTokenizer, routing_tokens
from grpo_launch.proxy.router import Decision, PrefixRouter, Prompt, prompt_of
from grpo_launch.proxy.upstream import UNANSWERED, Reply, Upstream, error_reply, response_headers

log = logging.getLogger("grpo_launch.proxy")

ROUTED = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
# NCCL weight sync would reach one replica and leave the others on old weights; TRL syncs adapters instead.
FULL_WEIGHT_SYNC = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                    "/finish_weight_update")
# Digits, spaces and punctuation: where hand-made and rebuilt tokenizers part (one drops the spaces).
TOKENIZER_PROBE = "Check 12 + 7 = 19, then 3 + 4 = 7."
DEFAULT_MAX_TOKENS = 16  # vLLM's /v1/completions default, for a request that does not say
MAX_BODY = 64 * 1024 * 1024  # batched or long prompts; aiohttp's default 1 MiB would answer 413
SHUTDOWN_S = 1.0


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.router = PrefixRouter(len(config.replicas), imbalance=config.imbalance,
                                   max_tracked_blocks=config.max_tracked_blocks)
        self.upstream = Upstream(api_key=config.upstream_api_key, pass_client_auth=config.client_api_key is None,
                                 connect_timeout_s=config.connect_timeout_s,
                                 request_timeout_s=config.request_timeout_s)
        self.fleet = Fleet(config.replicas, self.upstream, self.router, health_interval_s=config.health_interval_s,
                           health_timeout_s=config.health_timeout_s, on_readmit=self._check_tokenizer)
        self.tokenizer = LazyTokenizer(config.tokenizer)
        self.stats = ProxyStats()

    def app(self) -> web.Application:
        middlewares = [self._authenticate] if self.config.client_api_key else []
        app = web.Application(client_max_size=MAX_BODY, middlewares=middlewares)
        for path in ROUTED:
            app.router.add_post(path, self.generate)
        for path in broadcast.BROADCAST_PATHS:
            app.router.add_post(path, self.broadcast)
        for path in FULL_WEIGHT_SYNC:
            app.router.add_post(path, self.full_weight_sync)
        app.router.add_get("/health", self.health)
        app.router.add_get("/proxy/stats", self.proxy_stats)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_world_size", self.world_size)
        app.router.add_route("*", "/{tail:.*}", self.forward_to_one)
        app.cleanup_ctx.append(self._lifetime)
        return app

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        await self.upstream.start()
        watcher = asyncio.create_task(self.fleet.watch())
        yield
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await self.fleet.stop()
        await self.upstream.close()

    async def _check_tokenizer(self, replica: Replica) -> None:
        """Text prompts are routed by this proxy's tokens: they must be the replica's own, or every prefix hash
        misses. Compare a probe with the replica's /tokenize; a mismatch is logged with both, and counted. Only a
        local tokenizer is loaded for it: a hub one loads when the first text prompt needs it."""
        if self.config.tokenizer is None or tokenizer_file(self.config.tokenizer) is None:
            return
        ours = await self.tokenizer.encode(TOKENIZER_PROBE)
        if ours is None:
            return
        body = json.dumps({"prompt": TOKENIZER_PROBE, "add_special_tokens": False}).encode()
        try:
            reply = await self.upstream.call(replica.url, "POST", "/tokenize", body=body,
                                             headers=self.upstream.headers({"Content-Type": "application/json"}))
            theirs = json.loads(reply.body).get("tokens") if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            theirs = None
        if theirs is None:
            log.info("replica %s has no /tokenize: the proxy's tokenizer is not checked against it", replica.url)
        elif theirs == ours:
            log.info("tokenizer agrees with replica %s on a %d-token probe", replica.url, len(ours))
        else:
            self.stats.errors["tokenizer_mismatch"] += 1
            log.warning("tokenizer disagrees with replica %s: %s here, %s there; text prompts will miss their "
                        "prefixes (give --tokenizer the replicas' own tokenizer)", replica.url, ours, theirs)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler) -> web.StreamResponse:
        if not key_matches(request.headers.get("Authorization", ""), self.config.client_api_key or ""):
            response = _web(error_reply(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or HTTP "
                                             "Basic auth with the key as password)", "AuthenticationError"))
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await handler(request)

    # -- generation -----------------------------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        route = ROUTED[request.path]
        body = await request.read()
        available = self.fleet.available()
        if not available:
            self.stats.errors["no_replica"] += 1
            return _web(error_reply(503, "no replica is in routing", "ServiceUnavailable"))
        decision = self.router.route(await self._prompt(body), available)
        self.stats.routed(route, decision)
        try:
            return await self._forward(request, body, decision)
        finally:
            self.stats.observe(route, time.perf_counter() - started)

    async def _prompt(self, body: bytes) -> Prompt:
        """What the router needs of a request; a body it cannot read is routed by load (the replica will say what is
        wrong with it)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return Prompt()
        if not isinstance(payload, dict):
            return Prompt()
        max_tokens = payload.get("max_tokens") or payload.get("max_completion_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else DEFAULT_MAX_TOKENS
        prompt = routing_tokens(payload)
        if isinstance(prompt, str):
            tokens = await self.tokenizer.encode(prompt)
            if tokens is None:
                self.stats.untokenized += 1
                return Prompt(weight=len(prompt) // 4 + max_tokens)  # about 4 characters a token
            prompt = tokens
        model = payload.get("model")
        if not prompt or not isinstance(model, str):
            return Prompt(weight=max_tokens)
        try:
            return prompt_of(model, prompt, self.config.block_size, max_tokens)
        except ValueError:
            return Prompt(weight=max_tokens)

    async def _forward(self, request: web.Request, body: bytes, decision: Decision) -> web.StreamResponse:
        """Send a routed request to its replica; if that one never answers, once more to another replica."""
        headers = self.upstream.headers(request.headers)
        try:
            for attempt in (1, 2):
                replica = self.fleet.replicas[decision.replica]
                try:
                    return await self._call(request, body, replica, headers)
                except UNANSWERED as e:
                    if isinstance(e, aiohttp.ClientConnectorError):
                        self.fleet.mark_dead(replica.index, f"connection failed: {e.os_error or e}")
                    else:
                        self.fleet.probe_now(replica.index)
                    others = self.fleet.available(excluding=replica.index)
                    log.warning("a request to %s went unanswered (%s: %s); %s", replica.url, type(e).__name__, e,
                                "retrying it on another replica" if attempt == 1 and others else "failing it (502)")
                    if attempt == 2 or not others:
                        self.stats.errors["unreachable"] += 1
                        return _web(error_reply(502, f"replica {replica.url} did not answer: {type(e).__name__}",
                                                "BadGateway"))
                    self.router.finish(decision)
                    decision = self.router.route(decision.prompt, others)
                    self.stats.retries += 1
                except TimeoutError:
                    self.stats.errors["timeout"] += 1
                    return _web(error_reply(504, f"replica {replica.url} did not answer within "
                                                 f"{self.config.request_timeout_s:g} s", "GatewayTimeout"))
            raise AssertionError("unreachable")
        finally:
            self.router.finish(decision)

    async def _call(self, request: web.Request, body: bytes, replica: Replica,
                    headers: dict[str, str]) -> web.StreamResponse:
        replica.inflight += 1
        replica.requests += 1
        try:
            async with self.upstream.request(replica.url, request.method, request.raw_path, body=body,
                                             headers=headers) as upstream:
                if upstream.content_type == "text/event-stream":
                    return await self._stream(request, upstream)
                payload = await upstream.read()
                return web.Response(status=upstream.status, body=payload, headers=response_headers(upstream.headers))
        finally:
            replica.inflight -= 1

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        """Server-sent events pass through chunk by chunk as the replica writes them."""
        response = web.StreamResponse(status=upstream.status, headers=response_headers(upstream.headers))
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as e:
            # Too late for another replica or an error status: cut the stream so the client sees it incomplete.
            self.stats.errors["stream_cut"] += 1
            log.warning("stream from %s broke: %s", upstream.url.origin(), type(e).__name__)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response

    # -- everything else ------------------------------------------------------------------------------------------

    async def broadcast(self, request: web.Request) -> web.Response:
        """A client that hangs up cancels its handler (`handler_cancellation`, which aborts abandoned generations);
        a broadcast cut there would leave its change on some replicas and the fleet unaware of it. So it runs as a
        task of the fleet's, to its end (all-or-nothing, see broadcast), whatever the client does: the handler
        only waits for it."""
        body = await request.read()
        task = self.fleet.start(self._broadcast(request.path, request.raw_path, body,
                                                self.upstream.headers(request.headers)))
        try:
            outcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            log.info("a client hung up during %s: the broadcast goes on to its end", request.path)
            raise
        return _web(outcome.reply)

    async def _broadcast(self, path: str, path_qs: str, body: bytes, headers: dict[str, str]) -> broadcast.Outcome:
        if path == broadcast.LOAD:
            outcome = await broadcast.load_adapter(self.fleet, path_qs, body, headers,
                                                   timeout_s=self.config.lora_load_timeout_s,
                                                   retry_s=self.config.lora_retry_s)
        elif path == broadcast.UNLOAD:
            outcome = await broadcast.unload_adapter(self.fleet, path_qs, body, headers)
        else:
            outcome = await broadcast.broadcast(self.fleet, path, path_qs, body, headers)
        self.stats.broadcasts[path, outcome.label] += 1
        if outcome.label != "ok":
            log.warning("%s: %s", path, outcome.reply.text[:500])
        return outcome

    async def forward_to_one(self, request: web.Request) -> web.StreamResponse:
        available = self.fleet.available()
        if not available:
            return _web(error_reply(503, "no replica is in routing", "ServiceUnavailable"))
        # Counted among the loads like a generation request without tokens, retried like one.
        return await self._forward(request, await request.read(), self.router.route(Prompt(), available))

    async def full_weight_sync(self, request: web.Request) -> web.StreamResponse:
        if len(self.fleet.replicas) > 1:
            return _web(error_reply(501, f"{request.path}: full-weight sync through the proxy would update one "
                                         f"replica of {len(self.fleet.replicas)}; train a LoRA adapter so TRL "
                                         f"syncs adapters", "NotImplementedError"))
        return await self.forward_to_one(request)

    async def server_info(self, request: web.Request) -> web.Response:
        """One replica's config, with data_parallel_size 1: the replicas are independent, and TRL keeps
        adapter-only sync on only for a server of data-parallel size 1."""
        reply = await self._ask_one(request.raw_path)
        if reply.status == 200 and reply.content_type == "application/json":
            try:
                info = json.loads(reply.body)
            except ValueError:
                return _web(reply)
            config = info.get("vllm_config") if isinstance(info, dict) else None
            parallel = config.get("parallel_config") if isinstance(config, dict) else None
            if isinstance(parallel, dict):
                for key in ("data_parallel_size", "data_parallel_size_local"):
                    if key in parallel:
                        parallel[key] = 1
                reply = Reply(200, json.dumps(info).encode(), reply.content_type)
        return _web(reply)

    async def world_size(self, request: web.Request) -> web.Response:
        """The world size of one replica (its TP x PP group): what a single server of DP size 1 reports."""
        return _web(await self._ask_one("/get_world_size?include_dp=false"))

    async def _ask_one(self, path_qs: str) -> Reply:
        for index in self.fleet.available():
            try:
                return await self.upstream.call(self.fleet.replicas[index].url, "GET", path_qs)
            except (aiohttp.ClientError, TimeoutError):
                continue
        return error_reply(503, "no replica is in routing", "ServiceUnavailable")

    async def health(self, request: web.Request) -> web.Response:
        replicas = [r.to_json() for r in self.fleet.replicas]
        status = 200 if self.fleet.all_healthy() else 503
        return web.json_response({"healthy": status == 200, "replicas": replicas}, status=status)

    def snapshot(self) -> dict:
        """What /proxy/stats answers: routing decisions, errors, broadcasts, latency, replicas, fleet state."""
        replicas = [{**r.to_json(), "outstanding_tokens": self.router.outstanding[r.index],
                     "sent_tokens": self.router.sent[r.index]} for r in self.fleet.replicas]
        stats = self.stats.to_json(replicas, block_size=self.config.block_size,
                                   tracked_blocks=self.router.tracked_blocks)
        stats["fleet"] = {"adapters": list(self.fleet.adapters), "paused": self.fleet.paused is not None}
        return stats

    async def proxy_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    async def metrics(self, request: web.Request) -> web.Response:
        text = self.stats.to_prometheus([r.to_json() for r in self.fleet.replicas], self.router.tracked_blocks)
        return web.Response(body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _web(reply: Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, content_type=reply.content_type or None)


@dataclass(frozen=True)
class Running:
    proxy: Proxy
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.proxy.config.host}:{self.port}"


@asynccontextmanager
async def running(config: ProxyConfig) -> AsyncIterator[Running]:
    """Listen until the block exits; port 0 picks a free port (see `.port`)."""
    proxy = Proxy(config)
    # handler_cancellation: a client that hangs up closes its upstream call too, and vLLM aborts that generation.
    runner = web.AppRunner(proxy.app(), access_log=None, shutdown_timeout=SHUTDOWN_S, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UserError(f"cannot listen on {config.host}:{config.port}: {e.strerror or e}", key="--port",
                        hint="choose a free port with --port") from e
    port = runner.addresses[0][1]
    try:
        yield Running(proxy, port)
    finally:
        await runner.cleanup()
