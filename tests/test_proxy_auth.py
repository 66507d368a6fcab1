"""Client keys on every path, upstream keys injected, and no key in any log."""

import asyncio
import dataclasses
import logging

import aiohttp
import pytest
from proxy_fleet import fleet

PROXY = "placement.async_lora.proxy"

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


def test_the_key_as_http_basic_password_is_accepted():
    """TRL's clients send a URL's user info as HTTP Basic auth: the key is the password, any user name."""
    import base64

    from grpo_launch.contracts.secrets import presented_key

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert presented_key(f"Bearer {CLIENT_KEY}") == CLIENT_KEY
    assert presented_key(basic(f"grpo:{CLIENT_KEY}")) == presented_key(basic(f"anyone:{CLIENT_KEY}")) == CLIENT_KEY
    assert presented_key(basic(CLIENT_KEY)) == ""  # no password
    assert presented_key("Basic not-base64!") is None and presented_key(CLIENT_KEY) is None

    async def scenario():
        async with fleet(1, client_api_key=CLIENT_KEY) as f:
            assert (await f.get("/health", headers={"Authorization": basic(f"u:{CLIENT_KEY}")}))[0] == 200
            assert (await f.get("/health", headers={"Authorization": basic("u:wrong")}))[0] == 401
    asyncio.run(scenario())


def test_trl_async_clients_carry_the_key_the_trainer_puts_in_the_url(monkeypatch):
    """async-lora with a proxy key: the trainer entrypoint gives TRL's clients the proxy's URL with the key
    (grpo_launch.trainer.main.server_url). TRL's own VLLMClient (requests) and its rollout loop's POST (an aiohttp
    session) reach the keyed proxy with it, and are refused without it."""
    import collections
    import functools
    import types

    import requests
    from accelerate import PartialState
    from conftest import plan_json
    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    from grpo_launch.contracts.plan import Plan
    from grpo_launch.trainer.main import server_url

    PartialState(cpu=True)  # TRL's client logs through accelerate, as in the trainer
    monkeypatch.setenv("GRPO_TEST_PROXY_KEY", CLIENT_KEY)
    planned = Plan.from_json(plan_json("recipe=tiny-cpu-async-lora",
                                       f"{PROXY}.api_key_env=GRPO_TEST_PROXY_KEY"))

    async def scenario():
        async with fleet(2, client_api_key=CLIENT_KEY) as f:
            plan = dataclasses.replace(planned, vllm=dataclasses.replace(
                planned.vllm, replicas=dataclasses.replace(planned.vllm.replicas, proxy_url=f.url)))
            keyed = server_url(plan)
            assert keyed == f.url.replace("http://", f"http://grpo:{CLIENT_KEY}@")
            client = VLLMClient(keyed, server_timeout=5)
            await asyncio.to_thread(client.wait_for_server_ready, 0.05)
            assert await asyncio.to_thread(client.get_max_model_len) > 0
            await asyncio.to_thread(client.pause)
            await asyncio.to_thread(client.resume)
            async with aiohttp.ClientSession() as session:  # the rollout loop's own POST, on its own kind of session
                loop = types.SimpleNamespace(session=session, vllm_server_url=keyed,
                                             _counters=collections.Counter())
                loop._retry = functools.partial(_AsyncRolloutLoop._retry, loop)
                reply = await _AsyncRolloutLoop._post(loop, "/v1/completions", {
                    "model": "sim/base", "prompt": list(range(32)), "max_tokens": 4, "n": 1}, timeout=10)
                assert reply["choices"]
                loop.vllm_server_url = f.url
                with pytest.raises(aiohttp.ClientResponseError, match="401"):
                    await _AsyncRolloutLoop._post(loop, "/v1/completions", {"prompt": [1]}, timeout=10,
                                                  max_retries=1)
            with pytest.raises(requests.HTTPError, match="401"):
                await asyncio.to_thread(VLLMClient(f.url).get_max_model_len)
            assert not {a for s in f.sims for a in s.stats.authorization if a}  # the client's key stays here
    asyncio.run(scenario())


def test_the_supervisor_probes_a_keyed_proxy_with_its_key(monkeypatch):
    from grpo_launch.launch.probes import probe

    async def scenario():
        async with fleet(1, client_api_key=CLIENT_KEY) as f:
            monkeypatch.delenv("GRPO_TEST_PROXY_KEY", raising=False)
            assert await probe(f.url + "/health", 5, "GRPO_TEST_PROXY_KEY") == 401
            monkeypatch.setenv("GRPO_TEST_PROXY_KEY", CLIENT_KEY)
            assert await probe(f.url + "/health", 5, "GRPO_TEST_PROXY_KEY") == 200
    asyncio.run(scenario())


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "node1"])
def test_a_proxy_beyond_loopback_needs_a_client_key(host, capsys, monkeypatch):
    """One rule for `grpo proxy` and every placement: listening beyond loopback takes a client key."""
    from grpo_launch.cli import main

    assert main(["proxy", "--host", host, "--replica", "http://127.0.0.1:8000"]) == 2
    assert f"--host {host}: the proxy would listen on {host} without a client key" in capsys.readouterr().err
    assert main(["plan", "recipe=tiny-cpu-async-lora", f"{PROXY}.host={host}"]) == 2
    err = capsys.readouterr().err
    assert f"the proxy would listen on {host} without a client key" in err and f"{PROXY}.api_key_env" in err
    assert main(["plan", "recipe=tiny-cpu-async-lora", f"{PROXY}.host={host}", f"{PROXY}.api_key_env=PROXY_KEY"]) == 0


def test_async_lora_with_a_client_key_plans_it_for_the_proxy_the_trainer_and_the_probes():
    from conftest import plan_json

    plan = plan_json("recipe=tiny-cpu-async-lora", f"{PROXY}.host=0.0.0.0", f"{PROXY}.api_key_env=PROXY_KEY")
    proxy = next(p for p in plan["processes"] if p["role"] == "proxy")
    trainer = next(p for p in plan["processes"] if p["role"] == "trainer")
    argv = proxy["argv"]
    assert argv[argv.index("--api-key-env") + 1] == "PROXY_KEY" and proxy["probe_key_env"] == "PROXY_KEY"
    assert "PROXY_KEY" in proxy["pass_env"] and "PROXY_KEY" in trainer["pass_env"]
    assert plan["trainer_inputs"]["server_key_env"] == "PROXY_KEY"
    assert plan["trainer_args"]["vllm_server_base_url"] == "http://127.0.0.1:8080"  # no key in any file
    assert "wait_ready http://127.0.0.1:8080/health 60 PROXY_KEY  # proxy" in plan["files"]["launch.sh"]


def test_a_keyed_plan_does_not_start_without_its_key(tmp_path, monkeypatch, capsys):
    from grpo_launch.cli import main

    monkeypatch.delenv("PROXY_KEY", raising=False)
    assert main(["run", "recipe=tiny-cpu-async-lora", f"{PROXY}.api_key_env=PROXY_KEY", f"run.root={tmp_path}"]) == 2
    assert "PROXY_KEY is not set: the plan's proxy requires the client key" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
