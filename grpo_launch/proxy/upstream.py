"""Calls to the replicas: one pooled HTTP session, the headers they get, and bounded time for every call."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

# Never copied between the two connections (RFC 9110 7.6.1), plus what aiohttp recomputes for each hop.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length", "authorization", "date",
                        "server"})
# uvicorn (vllm serve) closes idle keep-alive connections after 5 s; reusing one it is closing fails the request.
KEEPALIVE_S = 4.0
CONNECTIONS = 4096  # across replicas; TRL keeps up to max_inflight_tasks requests open (e.g. 384)

# The replica never answered: nothing reached the client yet, so another replica may serve the request instead.
UNANSWERED = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Upstream:
    def __init__(self, *, api_key: str | None, pass_client_auth: bool, connect_timeout_s: float,
                 request_timeout_s: float) -> None:
        self._auth = f"Bearer {api_key}" if api_key else None
        # Without a key of its own the proxy is transparent: a client's key reaches replicas that check one.
        self._pass_client_auth = pass_client_auth and not api_key
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
        # auto_decompress off: bodies pass through byte for byte, Content-Encoding with them.
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, auto_decompress=False,
                                              cookie_jar=aiohttp.DummyCookieJar())  # vLLM sets no cookies

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def headers(self, client: Mapping[str, str] | None = None) -> dict[str, str]:
        out = {k: v for k, v in (client or {}).items() if k.lower() not in HOP_BY_HOP}
        if self._auth:
            out["Authorization"] = self._auth
        elif self._pass_client_auth and client and "Authorization" in client:
            out["Authorization"] = client["Authorization"]
        return out

    def request(self, base: str, method: str, path_qs: str, *, body: bytes = b"", headers: dict[str, str],
                timeout: aiohttp.ClientTimeout | None = None):
        """An aiohttp response context; `path_qs` is the raw (still percent-encoded) path and query."""
        assert self._session is not None, "Upstream.start() first"
        # No Accept-Encoding of aiohttp's own: a replica compresses only for a client that asked (its bytes pass
        # through as they are), and never for the proxy's own calls, whose bodies it reads.
        return self._session.request(method, URL(base + path_qs, encoded=True), data=body or None,
                                     headers=headers, skip_auto_headers=("Accept-Encoding",),
                                     timeout=timeout or self.timeout, allow_redirects=False)

    async def call(self, base: str, method: str, path_qs: str, *, body: bytes = b"",
                   headers: dict[str, str] | None = None, timeout: aiohttp.ClientTimeout | None = None) -> Reply:
        async with self.request(base, method, path_qs, body=body, headers=headers or self.headers(),
                                timeout=timeout) as resp:
            return Reply(resp.status, await resp.read(), resp.content_type)


def response_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in upstream.items() if k.lower() not in HOP_BY_HOP}


def error_reply(status: int, message: str, kind: str) -> Reply:
    """An error in the shape vLLM answers its own: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Reply(status, json.dumps(body).encode(), "application/json")
