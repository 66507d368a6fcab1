"""The HTTP routes, registered as `vllm serve` registers them: /pause, /resume, /is_paused, /server_info and
/get_world_size only with VLLM_SERVER_DEV_MODE=1, the adapter routes only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1
(without it they answer 404, which TRL's client reports as "restart it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1").
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from grpo_launch.cpu_server.api_error import ApiError, bad_request
from grpo_launch.cpu_server.completions import completion_response, parse_completion_request
from grpo_launch.cpu_server.engine import Engine
from grpo_launch.cpu_server.lora import Adapter, AdapterNotFound, LoraAdapters
from grpo_launch.cpu_server.scheduler import PauseMode, Scheduler
from grpo_launch.cpu_server.server_info import server_info
from grpo_launch.cpu_server.settings import ServerSettings

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY_BYTES = 64 * 2**20  # token-id prompts are long JSON arrays
INVALID_INPUT = "InvalidUserInput"  # vLLM's error type for malformed adapter requests


@web.middleware
async def _api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as error:
        # vLLM logs rejected requests too: a client that retries on errors otherwise hides why.
        logger.warning("%s %s -> %d: %s", request.method, request.path, error.status, error.message)
        return web.json_response(error.body(), status=error.status)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def _model_card(name: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "grpo-launch-cpu-server",
            "root": root, "parent": parent, "max_model_len": max_model_len, "permission": []}


class CpuServer:
    def __init__(self, settings: ServerSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.scheduler = Scheduler(engine)
        self._adapter_admin = asyncio.Lock()  # loads and unloads one at a time, so name checks hold

    def _resolve_model(self, model: str | None) -> tuple[str, Adapter | None]:
        """The requested model name -> (name to answer with, adapter or None for the base model)."""
        if model is None or model in self.settings.served_model_names:
            return model or self.settings.served_model_name, None
        adapter = self.engine.lora.get(model) if self.engine.lora else None
        if adapter is None:
            raise ApiError(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", param="model")
        return model, adapter

    def _lora(self) -> LoraAdapters:
        if self.engine.lora is None:
            raise bad_request("LoRA is not enabled on this server; start it with --enable-lora.")
        return self.engine.lora

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, _: web.Request) -> web.Response:
        s = self.settings
        cards = [_model_card(name, s.model, None, s.max_model_len) for name in s.served_model_names]
        if self.engine.lora:
            cards += [_model_card(a.name, a.path, s.served_model_name, None) for a in self.engine.lora.registered()]
        return web.json_response({"object": "list", "data": cards})

    async def completions(self, request: web.Request) -> web.Response:
        completion = parse_completion_request(await _json_body(request), self.settings, self.engine)
        model_name, adapter = self._resolve_model(completion.model)
        try:
            outputs = await self.scheduler.run(completion.job(adapter))
        except ApiError:
            raise  # 503 while paused
        except Exception as error:  # e.g. an evicted adapter whose directory is gone by the time it is reloaded
            logger.exception("generation failed")
            raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(error).__name__}: {error}") from error
        # Which policy version answered: what an async run's log is read for.
        logger.info("served %d completion(s) of %d prompt(s) with %s", completion.n * len(completion.prompts),
                    len(completion.prompts), model_name)
        return web.json_response(completion_response(completion, model_name, outputs, self.engine))

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise ApiError(HTTPStatus.BAD_REQUEST, "Both 'lora_name' and 'lora_path' must be provided.",
                           error_type=INVALID_INPUT)
        if name in self.settings.served_model_names:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"The lora adapter '{name}' would shadow the base model.",
                           error_type=INVALID_INPUT)
        lora = self._lora()
        async with self._adapter_admin:
            if not body.get("load_inplace") and lora.get(name) is not None:
                raise ApiError(HTTPStatus.BAD_REQUEST, f"The lora adapter '{name}' has already been loaded. If you "
                               "want to load the adapter in place, set 'load_inplace' to True.",
                               error_type=INVALID_INPUT)
            try:
                await asyncio.to_thread(lora.load, name, path)
            except AdapterNotFound as error:
                raise ApiError(HTTPStatus.NOT_FOUND, str(error)) from None
            except Exception as error:
                logger.exception("loading adapter %s from %s failed", name, path)
                raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, str(error)) from error
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        name = (await _json_body(request)).get("lora_name")
        if not name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "'lora_name' needs to be provided to unload a LoRA adapter.",
                           error_type=INVALID_INPUT)
        lora = self._lora()
        async with self._adapter_admin:
            if lora.get(name) is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"The lora adapter '{name}' cannot be found.")
            await asyncio.to_thread(lora.unload, name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", PauseMode.ABORT)
        if mode not in tuple(PauseMode):
            raise bad_request(f"mode must be one of {', '.join(PauseMode)}, got {mode!r}.", "mode")
        await self.scheduler.pause(PauseMode(mode))
        return web.json_response({"status": "paused"})

    async def resume(self, _: web.Request) -> web.Response:
        self.scheduler.resume()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, _: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.scheduler.paused})

    async def server_info(self, request: web.Request) -> web.Response:
        config_format = request.query.get("config_format", "text")
        if config_format not in ("text", "json"):
            raise bad_request(f"config_format must be text or json, got {config_format!r}.", "config_format")
        return web.json_response(server_info(self.settings, config_format))

    async def world_size(self, _: web.Request) -> web.Response:
        return web.json_response({"world_size": 1})


def build_app(settings: ServerSettings, engine: Engine) -> web.Application:
    server = CpuServer(settings, engine)
    app = web.Application(middlewares=[_api_errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes([web.get("/health", server.health), web.get("/v1/models", server.models),
                    web.post("/v1/completions", server.completions)])
    if settings.dev_mode:
        app.add_routes([web.post("/pause", server.pause), web.post("/resume", server.resume),
                        web.get("/is_paused", server.is_paused), web.get("/server_info", server.server_info),
                        web.get("/get_world_size", server.world_size)])
    if settings.allow_runtime_lora_updating:
        app.add_routes([web.post("/v1/load_lora_adapter", server.load_lora_adapter),
                        web.post("/v1/unload_lora_adapter", server.unload_lora_adapter)])

    async def stop_generation(_: web.Application) -> None:
        server.scheduler.close()

    app.on_shutdown.append(stop_generation)
    return app
