"""The key guard every `vllm serve` of a plan runs (`--middleware`, contracts.vllm.REPLICA_GUARD): a call to any
route but /health must present the run's key (contracts.vllm.REPLICA_KEY_ENV), as 'Authorization: Bearer <key>' or
as the password of HTTP Basic auth (what TRL's clients send for a URL with user info). vLLM's own --api-key leaves
the dev-mode routes TRL needs open to anyone who reaches the port.

It runs inside vLLM's API server, so it imports nothing beyond the standard library and grpo-launch's contracts. It
reads the key once, from its environment; a replica started without one (a node whose scheduler did not pass it: the
launch says so) answers every call, as vLLM does without --api-key.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from grpo_launch.contracts.secrets import key_matches
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV, UNGUARDED_PATHS

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

log = logging.getLogger(__name__)


class ReplicaKeyGuard:
    """Pure ASGI middleware (Starlette's `add_middleware` builds it with the app alone)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.key = os.environ.get(REPLICA_KEY_ENV) or None
        if self.key is None:
            log.warning("%s is not set: this vLLM server answers every call, from anyone who reaches its port",
                        REPLICA_KEY_ENV)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] not in ("http", "websocket") or self._open(scope):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if key_matches(headers.get(b"authorization", b"").decode("latin-1"), self.key):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _refuse(send)

    @staticmethod
    def _open(scope: Scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        return path in UNGUARDED_PATHS or scope.get("method") == "OPTIONS"  # CORS preflights carry no credentials


async def _refuse(send: Send) -> None:
    """401 in vLLM's error shape, as the proxy answers its own."""
    body = json.dumps({"error": {"message": f"missing or wrong key: this server requires the run's key "
                                            f"({REPLICA_KEY_ENV}) as 'Authorization: Bearer <key>'",
                                 "type": "AuthenticationError", "param": None, "code": 401}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
