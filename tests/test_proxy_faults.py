"""Replicas die and come back; requests are retried once; nothing waits forever."""

import asyncio

import aiohttp
import pytest
from proxy_fleet import fleet, served_by

PROMPT = list(range(300, 364))


def test_request_whose_replica_dies_is_retried_once_elsewhere(tmp_path):
    async def scenario():
        async with fleet(2) as f:
            f.sims[0].die_on_request = True
            responses = [await f.complete(PROMPT[:-i or None]) for i in range(1, 3)]  # round robin reaches r0
            assert [r.status for r in responses] == [200, 200]
            assert {served_by(r) for r in responses} == {"r1"}
            assert f.proxy.stats.retries == 1
            await f.until(lambda: not f.proxy.fleet.replicas[0].healthy, "r0 out of routing")
            assert (await f.get("/health"))[0] == 503
            assert [served_by(await f.complete(PROMPT[:k])) for k in (20, 40, 60)] == ["r1"] * 3

            # While r0 is away the fleet moves on: a new adapter, a pause. It must catch up before it serves.
            (tmp_path / "v2").mkdir()
            status, _ = await f.post("/v1/load_lora_adapter", {"lora_name": "policy-v2", "lora_path":
                                                               str(tmp_path / "v2")})
            assert status == 200
            assert (await f.post("/pause?mode=keep"))[0] == 200
            await f.sims[0].start()
            await f.until(f.proxy.fleet.all_healthy, "r0 back in routing")
            assert f.sims[0].adapters == {"policy-v2": str(tmp_path / "v2")} and f.sims[0].paused
            assert (await f.get("/health"))[0] == 200
            homes = {served_by(await f.complete([9000 + i] * 32, model="policy-v2")) for i in range(4)}
            assert homes == {"r0", "r1"}
    asyncio.run(scenario())


def test_a_replica_that_drops_a_request_is_probed_at_once_not_at_the_next_interval():
    """A replica killed with requests in flight cuts them (no refused connection to notice): its /health is asked
    at once, and it leaves routing before the next probe would have run."""
    async def scenario():
        async with fleet(2, health_interval_s=60.0) as f:
            f.sims[0].die_on_request = True
            responses = [await f.complete(PROMPT[:-i or None]) for i in range(1, 3)]  # round robin reaches r0
            assert {served_by(r) for r in responses} == {"r1"} and f.proxy.stats.retries == 1
            await f.until(lambda: not f.proxy.fleet.replicas[0].healthy, "r0 out of routing")
    asyncio.run(scenario())


def test_a_second_death_is_not_retried_again():
    async def scenario():
        async with fleet(2) as f:
            for s in f.sims:
                s.die_on_request = True
            r = await f.complete(PROMPT)
            assert r.status == 502
            assert f.proxy.stats.retries == 1
    asyncio.run(scenario())


def test_slow_replica_times_out_with_504():
    async def scenario():
        async with fleet(1, request_timeout_s=0.3, sim={"decode_s_per_token": 1.0}) as f:
            r = await f.complete(PROMPT)
            assert r.status == 504
            _, stats = await f.get("/proxy/stats")
            assert stats["errors"] == {"timeout": 1}
            assert stats["replicas"][0]["inflight"] == 0
    asyncio.run(scenario())


def test_replica_that_fails_health_leaves_and_its_prefixes_are_forgotten():
    async def scenario():
        async with fleet(2) as f:
            home = served_by(await f.complete(PROMPT))
            sim = f.sims[int(home[1:])]
            await sim.stop()
            await f.until(lambda: not f.proxy.fleet.all_healthy(), "the dead replica out of routing")
            other = served_by(await f.complete(PROMPT))
            assert other != home
            await sim.start()
            await f.until(f.proxy.fleet.all_healthy, "the replica back")
            assert served_by(await f.complete(PROMPT)) == other  # the prefix now lives on the survivor
    asyncio.run(scenario())


def test_stream_cut_by_a_dying_replica_reaches_the_client_as_incomplete():
    async def scenario():
        async with fleet(1) as f:
            f.sims[0].stream_gate = asyncio.Event()  # never set: the replica dies holding the stream
            body = {"model": "sim/base", "prompt": PROMPT, "max_tokens": 5, "stream": True}
            async with f.http.post(f.url + "/v1/completions", json=body) as r:
                assert r.status == 200
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
                await f.sims[0].stop()
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.content.read(), 5)
            assert f.proxy.stats.errors["stream_cut"] == 1
            assert f.proxy.fleet.replicas[0].inflight == 0
    asyncio.run(scenario())


def test_client_that_hangs_up_frees_its_replica_slot():
    async def scenario():
        async with fleet(1, sim={"decode_s_per_token": 2.0}) as f:
            body = {"model": "sim/base", "prompt": PROMPT, "max_tokens": 4}
            with pytest.raises(TimeoutError):
                async with f.http.post(f.url + "/v1/completions", json=body,
                                       timeout=aiohttp.ClientTimeout(total=0.2)) as r:
                    await r.read()
            assert f.proxy.fleet.replicas[0].requests == 1
            await f.until(lambda: f.proxy.fleet.replicas[0].inflight == 0, "the abandoned request to be dropped")
    asyncio.run(scenario())


def out_of_routing(f, i: int):
    return lambda: not f.proxy.fleet.replicas[i].healthy


def test_a_replica_slow_for_one_probe_during_a_pause_is_resumed_with_the_fleet():
    """It left routing paused; the fleet resumed without it. Readmitted paused, its requests would wait 600 s."""
    async def scenario():
        async with fleet(2) as f:
            assert (await f.post("/pause?mode=keep"))[0] == 200
            f.sims[1].health_failures = 1
            await f.until(out_of_routing(f, 1), "r1 out of routing")
            assert (await f.post("/resume"))[0] == 200
            assert f.sims[1].paused
            await f.until(f.proxy.fleet.all_healthy, "r1 back in routing")
            assert not any(s.paused for s in f.sims)
    asyncio.run(scenario())


def test_a_replica_that_missed_an_unload_drops_the_adapter_when_it_returns(tmp_path):
    async def scenario():
        async with fleet(2) as f:
            for name in ("policy-v1", "policy-v2"):
                (tmp_path / name).mkdir()
                assert (await f.post("/v1/load_lora_adapter", {"lora_name": name,
                                                                "lora_path": str(tmp_path / name)}))[0] == 200
            await f.sims[1].stop()
            await f.until(out_of_routing(f, 1), "r1 out of routing")
            assert (await f.post("/v1/unload_lora_adapter", {"lora_name": "policy-v1"}))[0] == 200
            await f.sims[1].start()  # it kept its adapters: an outage of the network, not of the engine
            await f.until(f.proxy.fleet.all_healthy, "r1 back in routing")
            assert set(f.sims[1].adapters) == set(f.sims[0].adapters) == {"policy-v2"}
    asyncio.run(scenario())


@pytest.mark.parametrize("how", ["before", "after", "cut", "hang"])
def test_a_state_change_left_unanswered_re_syncs_the_replica(tmp_path, how):
    """The connection dropped before or after the replica acted, its answer stopped halfway, or never came: what it
    did is unknown. It leaves routing and returns only once it matches the fleet, whichever it was."""
    async def scenario():
        async with fleet(2, request_timeout_s=1.0) as f:
            (tmp_path / "v1").mkdir()
            assert (await f.post("/v1/load_lora_adapter", {"lora_name": "policy-v1",
                                                            "lora_path": str(tmp_path / "v1")}))[0] == 200
            assert (await f.post("/pause?mode=keep"))[0] == 200
            f.sims[1].unanswered = {"/resume": how, "/v1/unload_lora_adapter": how}
            assert (await f.post("/resume"))[0] == 200  # r0 answered; r1 will be made to match
            assert (await f.post("/v1/unload_lora_adapter", {"lora_name": "policy-v1"}))[0] == 200
            await f.until(f.proxy.fleet.all_healthy, "r1 back in routing")
            assert not f.sims[1].paused and not f.sims[1].adapters
            _, stats = await f.get("/proxy/stats")
            assert stats["broadcasts"]["/resume"] == {"ok": 1} and stats["errors"] == {}
    asyncio.run(scenario())
