"""The proxy over real sockets: routing, what TRL sees, streaming, text prompts, stats and metrics."""

import asyncio
import json

from proxy_fleet import fleet, served_by

SYSTEM = list(range(500, 532))  # two blocks every prompt starts with


def prompt(i: int) -> list[int]:
    return SYSTEM + [i * 1000 + k for k in range(40)]


def test_group_of_completions_shares_a_replica_and_new_prompts_spread():
    async def scenario():
        async with fleet(4) as f:
            homes = []
            for i in range(4):
                group = await asyncio.gather(*(f.complete(prompt(i)) for _ in range(8)))
                assert all(r.status == 200 for r in group)
                homes.append({served_by(r) for r in group})
            assert all(len(h) == 1 for h in homes)  # G=8 completions of a prompt on one replica
            assert len(set.union(*homes)) >= 3      # different prompts on different replicas
            status, stats = await f.get("/proxy/stats")
            assert status == 200
            assert stats["requests"]["routed"] == 32
            # Each group's 7 later requests follow its first, as its siblings while one is in flight (or by its
            # prefix, if the sibling before already finished): never spilled. (The second group's first request also
            # follows the system prompt's only holder, before a second prompt shows the system prompt is shared.)
            requests = stats["requests"]
            assert requests["group"] + requests["affinity"] >= 28 and requests["spill"] == 0
            assert sum(s.stats.cached_tokens for s in f.sims) > 0
    asyncio.run(scenario())


def test_overload_spills_other_prompts_and_versions_route_separately(tmp_path):
    async def scenario():
        async with fleet(2, imbalance=1, sim={"decode_s_per_token": 0.05}) as f:
            home = served_by(await f.complete(prompt(1)))
            # 6 different prompts that continue prompt 1 (its blocks, a tail of their own): prefix-affine to its
            # replica until that one holds more than 1 request's worth of tokens above the other, then spilled.
            variants = await asyncio.gather(*(f.complete(prompt(1) + [7, k]) for k in range(6)))
            assert {served_by(r) for r in variants} == {"r0", "r1"}
            _, stats = await f.get("/proxy/stats")
            assert stats["requests"]["spill"] >= 1 and stats["requests"]["affinity"] >= 2
            assert sum(served_by(r) == home for r in variants) >= 3

            (tmp_path / "v1").mkdir()
            status, _ = await f.post("/v1/load_lora_adapter", {"lora_name": "policy-v1", "lora_path":
                                                               str(tmp_path / "v1")})
            assert status == 200
            before = stats["requests"]["unmatched"]
            r = await f.complete(prompt(1), model="policy-v1")
            assert r.status == 200
            _, stats = await f.get("/proxy/stats")
            assert stats["requests"]["unmatched"] == before + 1  # same tokens, new version: no prefix
    asyncio.run(scenario())


def test_trl_sees_one_server_of_data_parallel_size_one():
    async def scenario():
        async with fleet(3, sim={"tensor_parallel_size": 2}) as f:
            status, info = await f.get("/server_info", params={"config_format": "json"})
            assert status == 200
            config = info["vllm_config"]
            assert config["parallel_config"]["data_parallel_size"] == 1
            assert config["lora_config"]["max_loras"] == 6  # TRL's capability probe for adapter sync
            assert (await f.get("/get_world_size"))[1] == {"world_size": 2}  # one replica's TP group
            status, models = await f.get("/v1/models")
            assert status == 200 and models["data"][0]["max_model_len"] == 4096
            status, _ = await f.post("/init_weight_transfer_engine", {"init_info": {}})
            assert status == 501  # full-weight NCCL sync would reach one replica of three
            assert (await f.get("/health"))[0] == 200
    asyncio.run(scenario())


def test_trl_client_talks_to_the_proxy(tmp_path):
    import pytest

    pytest.importorskip("trl")
    from accelerate import PartialState
    from trl.experimental.async_grpo.vllm_client import VLLMClient

    PartialState()  # TRL's client logs through accelerate, which the trainer has set up by then

    async def scenario():
        async with fleet(2) as f:
            (tmp_path / "trl-policy-v1").mkdir()
            client = VLLMClient(f.url, server_timeout=5)

            def trainer_side():
                client.wait_for_server_ready(poll_interval_s=0.1)
                info = client.get_server_info()
                assert info["parallel_config"]["data_parallel_size"] == 1 and info["lora_config"] is not None
                assert client.get_max_model_len() == 4096
                assert client.get_dtype() == "torch.bfloat16"
                assert client.get_world_size() == 1
                client.pause()
                client.load_lora_adapter("trl-policy-v1", str(tmp_path / "trl-policy-v1"), timeout=5)
                client.resume()
                client.unload_lora_adapter("trl-policy-v1", timeout=5)

            await asyncio.to_thread(trainer_side)
            for s in f.sims:
                assert s.calls[-4:] == ["/pause", "/v1/load_lora_adapter", "/resume", "/v1/unload_lora_adapter"]
                assert not s.adapters and not s.paused
    asyncio.run(scenario())


def test_streaming_passes_through_event_by_event():
    async def scenario():
        async with fleet(2) as f:
            gate = asyncio.Event()
            for s in f.sims:
                s.stream_gate = gate
            body = {"model": "sim/base", "prompt": prompt(3), "max_tokens": 5, "stream": True}
            async with f.http.post(f.url + "/v1/completions", json=body) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)
                assert json.loads(first.removeprefix(b"data: "))["choices"][0]["text"] == "7"  # before the rest exists
                gate.set()
                rest = (await r.content.read()).decode()
            events = [e for e in rest.split("\n\n") if e]
            assert len(events) == 5 and events[-1] == "data: [DONE]"
    asyncio.run(scenario())


def test_text_and_chat_prompts_are_tokenized_for_routing(tmp_path):
    from grpo_launch.trainer import tiny_model

    async def scenario():
        tokenizer_dir = tmp_path / "tok"
        await asyncio.to_thread(tiny_model.build, tokenizer_dir, {"hidden_size": 8, "num_layers": 1, "num_heads": 1,
                                                                  "num_kv_heads": 1, "max_position_embeddings": 64})
        async with fleet(3, tokenizer=str(tokenizer_dir)) as f:
            text = "what is seven times seven? " * 4
            first = await f.complete(text)  # `complete` sends the prompt field as given: here, text
            again = await asyncio.gather(*(f.complete(text) for _ in range(4)))
            assert {served_by(r) for r in again} == {served_by(first)}
            chat = {"model": "sim/base", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
            homes = set()
            for _ in range(3):
                async with f.http.post(f.url + "/v1/chat/completions", json=chat) as r:
                    assert r.status == 200
                    homes.add(served_by(r))
            assert len(homes) == 1
            _, stats = await f.get("/proxy/stats")
            routed_by_prefix = stats["requests"]["affinity"] + stats["requests"]["group"]
            assert routed_by_prefix >= 6 and stats["requests"]["untokenized"] == 0
    asyncio.run(scenario())


def test_metrics_are_prometheus_text():
    async def scenario():
        async with fleet(2) as f:
            await f.complete(prompt(1))
            await f.complete(prompt(1))
            await f.post("/pause")
            status, text = await f.get("/metrics")
            assert status == 200
            assert 'grpo_proxy_requests_total{route="completions",decision="affinity"} 1' in text
            assert 'grpo_proxy_broadcasts_total{path="/pause",outcome="ok"} 1' in text
            assert 'grpo_proxy_request_seconds_count{route="completions"} 2' in text
            assert f'grpo_proxy_replica_healthy{{replica="{f.sims[0].url}"}} 1' in text
            assert "grpo_proxy_replica_inflight" in text and "grpo_proxy_tracked_blocks" in text
    asyncio.run(scenario())


def test_bad_requests_reach_the_replica_and_come_back():
    async def scenario():
        async with fleet(2) as f:
            r = await f.complete(prompt(1), model="no-such-adapter")
            assert r.status == 404  # vLLM's own answer, passed through
            async with f.http.post(f.url + "/v1/completions", data=b"{not json",
                                   headers={"Content-Type": "application/json"}) as r:
                assert r.status in (400, 422, 500)  # the replica's verdict, not a proxy crash
            status, _ = await f.get("/no/such/path")
            assert status == 404
    asyncio.run(scenario())


def test_no_replica_answers_503_not_a_hang():
    async def scenario():
        async with fleet(1) as f:
            await f.sims[0].stop()
            await f.until(lambda: not f.proxy.fleet.all_healthy(), "the replica out of routing")
            r = await f.complete(prompt(1))
            assert r.status == 503
            assert (await f.get("/health"))[0] == 503
            status, body = await f.post("/pause")
            assert status == 503 and "no replica" in body["error"]["message"]
    asyncio.run(scenario())


def test_unknown_json_and_batched_prompts_do_not_break_routing():
    async def scenario():
        async with fleet(2) as f:
            r = await f.complete([prompt(2), prompt(3)])  # a batch routes on its first prompt
            assert r.status == 200
            async with f.http.post(f.url + "/v1/completions", json=[1, 2, 3]) as r:
                assert r.status != 200
    asyncio.run(scenario())


def test_an_unloadable_tokenizer_routes_text_by_load_without_failing_requests(tmp_path):
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not a tokenizer")

    async def scenario():
        async with fleet(2, tokenizer=str(broken)) as f:
            for _ in range(3):
                assert (await f.complete("some text prompt " * 8)).status == 200
            _, stats = await f.get("/proxy/stats")
            assert stats["requests"]["untokenized"] == 3 and stats["requests"]["unmatched"] == 3
    asyncio.run(scenario())
