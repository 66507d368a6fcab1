"""Broadcasts reach every replica; an adapter load is all-or-nothing, with lagging and failing replicas."""

import asyncio
import contextlib

import pytest
from fault_matrix import CONSISTENT, FaultRow, record_fault
from proxy_fleet import fleet, served_by

LOAD = "/v1/load_lora_adapter"


def adapter(tmp_path, name: str) -> dict:
    (tmp_path / name).mkdir()
    return {"lora_name": name, "lora_path": str(tmp_path / name), "load_inplace": False}


async def load(f, tmp_path, name: str):
    """What TRL's trainer does after writing the adapter directory: one load through the proxy."""
    return await f.post("/v1/load_lora_adapter", adapter(tmp_path, name))


def test_load_reaches_every_replica_and_answers_like_vllm(tmp_path):
    async def scenario():
        async with fleet(3) as f:
            status, text = await load(f, tmp_path, "policy-v1")
            assert (status, text) == (200, "Success: LoRA adapter 'policy-v1' added successfully.")
            assert all(s.adapters == {"policy-v1": str(tmp_path / "policy-v1")} for s in f.sims)
            r = await f.complete(list(range(40)), model="policy-v1")
            assert r.status == 200
            status, _ = await f.post("/v1/unload_lora_adapter", {"lora_name": "policy-v1"})
            assert status == 200 and not any(s.adapters for s in f.sims)
            f.sims[0].adapters["policy-v1"] = "somewhere"  # a replica the others disagree with
            status, _ = await f.post("/v1/unload_lora_adapter", {"lora_name": "policy-v1"})
            assert status == 200 and not f.sims[0].adapters  # the 404s of the others are where they should be
            status, _ = await f.post("/v1/unload_lora_adapter", {"lora_name": "policy-v1"})
            assert status == 404  # nobody had it: vLLM's own answer
    asyncio.run(scenario())


def test_lagging_replica_is_retried_until_it_sees_the_adapter(tmp_path):
    async def scenario():
        async with fleet(3, lora_retry_s=0.05) as f:
            f.sims[1].adapter_lag_s = 0.3
            status, _ = await load(f, tmp_path, "policy-v2")
            assert status == 200
            assert all("policy-v2" in s.adapters for s in f.sims)
            assert f.sims[1].calls.count("/v1/load_lora_adapter") > 1
            assert f.sims[0].calls.count("/v1/load_lora_adapter") == 1
    asyncio.run(scenario())


def test_failing_replica_rolls_the_load_back_everywhere(tmp_path):
    async def scenario():
        async with fleet(3) as f:
            f.sims[2].refuse_loads = True
            status, body = await load(f, tmp_path, "policy-v3")
            assert status == 500
            message = body["error"]["message"]
            assert f.sims[2].url in message and "simulated engine failure" in message
            assert not any(s.adapters for s in f.sims)  # the two that loaded it unloaded it again
            assert f.sims[0].calls[-2:] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
            r = await f.complete(list(range(40)), model="policy-v3")
            assert r.status == 404  # nobody serves a half-loaded version
            _, stats = await f.get("/proxy/stats")
            assert stats["broadcasts"]["/v1/load_lora_adapter"] == {"rolled_back": 1}
            assert stats["fleet"]["adapters"] == []
    asyncio.run(scenario())


def test_a_mount_that_never_catches_up_times_out_with_504_and_rolls_back(tmp_path):
    async def scenario():
        async with fleet(2, lora_load_timeout_s=0.3) as f:
            f.sims[0].adapter_lag_s = 60
            status, body = await load(f, tmp_path, "policy-v4")
            assert status == 504  # never 404: TRL reads that as "runtime LoRA updating is off"
            assert "No adapter found" in body["error"]["message"]
            assert not any(s.adapters for s in f.sims)
    asyncio.run(scenario())


def test_lag_and_failure_together_stop_waiting_at_the_failure(tmp_path):
    async def scenario():
        async with fleet(3, lora_load_timeout_s=30) as f:
            f.sims[0].adapter_lag_s = 60
            f.sims[1].refuse_loads = True
            started = asyncio.get_running_loop().time()
            status, _ = await load(f, tmp_path, "policy-v5")
            assert status == 500
            assert asyncio.get_running_loop().time() - started < 10  # did not sit out the 30 s mount timeout
            assert not any(s.adapters for s in f.sims)
    asyncio.run(scenario())


def test_loading_an_existing_name_is_refused_without_touching_the_others(tmp_path):
    async def scenario():
        async with fleet(2) as f:
            body = adapter(tmp_path, "policy-v6")
            assert (await f.post("/v1/load_lora_adapter", body))[0] == 200
            status, reply = await f.post("/v1/load_lora_adapter", body)
            assert status == 400 and "already been loaded" in reply["error"]["message"]
            assert all("policy-v6" in s.adapters for s in f.sims)  # the refusal unloaded nothing
            status, _ = await f.post("/v1/load_lora_adapter", {"lora_name": "x"})
            assert status == 400
    asyncio.run(scenario())


def test_state_changes_reach_every_replica(tmp_path):
    async def scenario():
        async with fleet(3) as f:
            for path in ("/pause?mode=keep", "/resume", "/reset_prefix_cache", "/sleep?level=1", "/wake_up"):
                status, _ = await f.post(path)
                assert status == 200, path
            for s in f.sims:
                assert s.calls[-5:] == ["/pause", "/resume", "/reset_prefix_cache", "/sleep", "/wake_up"]
            await f.post("/pause?mode=keep")
            assert all(s.paused for s in f.sims)
            assert f.proxy.fleet.paused == "/pause?mode=keep"
    asyncio.run(scenario())


def test_cache_reset_clears_the_routing_table():
    async def scenario():
        async with fleet(2) as f:
            await f.complete(list(range(64)))
            assert f.proxy.router.tracked_blocks == 4
            await f.post("/reset_prefix_cache")
            assert f.proxy.router.tracked_blocks == 0
    asyncio.run(scenario())


def test_a_refused_pause_is_undone_where_it_was_accepted():
    async def scenario():
        async with fleet(3) as f:
            f.sims[2].refuse = {"/pause"}
            status, body = await f.post("/pause?mode=keep")
            assert status == 500 and f.sims[2].url in body["error"]["message"]
            assert not any(s.paused for s in f.sims)  # the two that paused resumed again
            assert f.sims[0].calls[-2:] == ["/pause", "/resume"]
            assert f.proxy.fleet.paused is None
            _, stats = await f.get("/proxy/stats")
            assert stats["broadcasts"]["/pause"] == {"rolled_back": 1} and stats["fleet"]["paused"] is False
    asyncio.run(scenario())


def test_a_refused_resume_is_undone_with_the_fleets_pause():
    async def scenario():
        async with fleet(3) as f:
            assert (await f.post("/pause?mode=keep"))[0] == 200
            f.sims[1].refuse = {"/resume"}
            status, _ = await f.post("/resume")
            assert status == 500
            assert all(s.paused for s in f.sims)  # nobody generates while the fleet says paused
            assert f.sims[0].calls[-2:] == ["/resume", "/pause"]
            assert f.proxy.fleet.paused == "/pause?mode=keep"
            f.sims[1].refuse = set()
            assert (await f.post("/resume"))[0] == 200 and not any(s.paused for s in f.sims)
    asyncio.run(scenario())


@pytest.mark.fault
@pytest.mark.parametrize("lagging", ["loads it", "refuses it"])
def test_a_client_that_hangs_up_mid_load_leaves_the_adapter_on_every_replica_or_none(tmp_path, lagging):
    """TRL's client gives up (its timeout, a killed trainer) while the proxy waits for a replica whose mount lags:
    aiohttp cancels the handler. The load goes on to its end whatever the client does: the lagging replica loads
    it too (every replica has it, and the fleet knows), or it refuses and the others unload it again (none has it).
    A retry is then answered like every replica answers it, and generation for the adapter works everywhere."""
    async def scenario():
        async with fleet(3, lora_retry_s=0.05, lora_load_timeout_s=30) as f:
            f.sims[2].adapter_lag_s = 0.5
            body = adapter(tmp_path, "policy-v7")
            client = asyncio.create_task(f.post(LOAD, body))
            await f.until(lambda: all("policy-v7" in s.adapters for s in f.sims[:2])
                          and f.sims[2].calls.count(LOAD) >= 2, "r0 and r1 loaded, r2 waiting for its mount")
            client.cancel()  # the client hangs up: its connection closes mid-broadcast
            with contextlib.suppress(asyncio.CancelledError):
                await client
            if lagging == "refuses it":
                f.sims[2].refuse_loads = True
                await f.until(lambda: not any(s.adapters for s in f.sims), "the load undone on r0 and r1")
                assert f.proxy.fleet.adapters == {}
                _, stats = await f.get("/proxy/stats")
                assert stats["broadcasts"][LOAD] == {"rolled_back": 1}
                f.sims[2].refuse_loads = False
                assert (await f.post(LOAD, body))[0] == 200  # the retry loads it everywhere
            else:
                await f.until(lambda: "policy-v7" in f.sims[2].adapters, "the lagging replica to load it too")
                await f.until(lambda: "policy-v7" in f.proxy.fleet.adapters, "the fleet to know it serves it")
                status, reply = await f.post(LOAD, body)  # the retry: what each replica answers, nothing undone
                assert status == 400 and "already been loaded" in reply["error"]["message"]
            assert all(s.adapters == {"policy-v7": body["lora_path"]} for s in f.sims)
            assert f.proxy.fleet.adapters == {"policy-v7": body["lora_path"]}
            for s in f.sims:  # every replica generates with it, whichever the proxy routes to
                async with f.http.post(s.url + "/v1/completions", json={"model": "policy-v7", "prompt": [1, 2, 3],
                                                                        "max_tokens": 1}) as r:
                    assert r.status == 200, s.name
            homes = {served_by(await f.complete([9100 + i] * 32, model="policy-v7")) for i in range(6)}
            assert homes == {"r0", "r1", "r2"}
    asyncio.run(scenario())
    record_fault(FaultRow(f"16 a client hangs up mid-broadcast, the lagging replica {lagging}", 1, CONSISTENT,
                          CONSISTENT))
