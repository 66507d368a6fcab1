"""Client keys on every path, upstream keys injected, and no key in any log."""

import asyncio
import logging

import aiohttp
from proxy_fleet import fleet

CLIENT_KEY, UPSTREAM_KEY = "client-secret-3f9a", "upstream-secret-77c1"
PATHS = [("GET", "/health"), ("GET", "/metrics"), ("GET", "/proxy/stats"), ("GET", "/v1/models"),
         ("GET", "/server_info"), ("POST", "/v1/completions"), ("POST", "/pause"), ("POST", "/v1/load_lora_adapter")]


def test_every_path_needs_the_client_key_and_replicas_get_theirs(caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with fleet(2, client_api_key=CLIENT_KEY, upstream_api_key=UPSTREAM_KEY,
                         headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as f:
            async with aiohttp.ClientSession() as stranger:
                for method, path in PATHS:
                    for auth in (None, "Bearer wrong", CLIENT_KEY):  # missing, wrong, and without the scheme
                        headers = {"Authorization": auth} if auth else {}
                        async with stranger.request(method, f.url + path, headers=headers, json={}) as r:
                            assert r.status == 401, (method, path, auth)
                            assert r.headers["WWW-Authenticate"] == "Bearer"
                            assert CLIENT_KEY not in await r.text()
            r = await f.complete(list(range(32)))
            assert r.status == 200
            assert (await f.get("/health"))[0] == 200
            seen = {a for s in f.sims for a in s.stats.authorization}
            assert seen == {f"Bearer {UPSTREAM_KEY}"}  # probes and requests alike; never the client's key
    asyncio.run(scenario())
    assert CLIENT_KEY not in caplog.text and UPSTREAM_KEY not in caplog.text


def test_without_keys_of_its_own_the_proxy_passes_the_clients_through():
    async def scenario():
        async with fleet(1, headers={"Authorization": "Bearer replica-key"}) as f:
            assert (await f.complete(list(range(32)))).status == 200
            assert f.sims[0].stats.authorization[-1] == "Bearer replica-key"
    asyncio.run(scenario())


def test_config_repr_holds_no_secret():
    from grpo_launch.proxy.config import ProxyConfig

    config = ProxyConfig(replicas=("http://127.0.0.1:8000",), client_api_key=CLIENT_KEY,
                         upstream_api_key=UPSTREAM_KEY)
    assert CLIENT_KEY not in repr(config) and UPSTREAM_KEY not in repr(config)
