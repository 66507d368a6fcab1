"""The routing proxy in front of two real vLLM replicas (vLLM's CPU build), as `grpo plan recipe=tiny-cpu-async-lora`
starts them, judged by the engines' own counters. One fleet for the module (a replica starts in 20-45 s here); the
test that kills a replica runs last."""

import asyncio
import os
import random
import signal
import subprocess
from dataclasses import dataclass

import aiohttp
import pytest
from conftest import free_ports
from engine import total

from grpo_launch.compose import compose
from grpo_launch.contracts import tiny
from grpo_launch.launch.spawn import child_environment
from grpo_launch.plan import build_plan

pytestmark = pytest.mark.slow
CONTEXT, SYSTEM_TOKENS = 512, 64
CHARACTERS = range(len(tiny.SPECIAL_TOKENS), len(tiny.VOCABULARY))


@dataclass
class Served:
    replicas: list[str]
    proxy: str
    model: str
    block: int
    processes: dict[str, subprocess.Popen]

    def kill(self, name: str) -> None:
        """SIGKILL the process group: the server and vLLM's engine with it."""
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("proxy-vllm")
    # Without chunked prefill: vLLM's CPU build crashes when it chunks the prefill of a seeded request ("CPU
    # Generator does not use offset"), and TRL seeds every request; many at once get chunked.
    plan = build_plan(compose(["recipe=tiny-cpu-async-lora", f"model.tiny.max_position_embeddings={CONTEXT}",
                               f"vllm.max_model_len={CONTEXT}", "vllm.extra_args=[--no-enable-chunked-prefill]",
                               *free_ports()]))
    for step in plan.prepare:
        subprocess.run(step.argv, cwd=work, check=True, env=child_environment({}), stdout=subprocess.DEVNULL)
    services = [p for p in plan.processes if p.role in ("vllm", "proxy")]
    processes: dict[str, subprocess.Popen] = {}
    vllm = [p for p in services if p.role == "vllm"]
    served = Served([f"http://127.0.0.1:{p.port}" for p in vllm],
                    next(f"http://127.0.0.1:{p.port}" for p in services if p.role == "proxy"),
                    vllm[0].argv[vllm[0].argv.index("--served-model-name") + 1],
                    int(vllm[0].argv[vllm[0].argv.index("--block-size") + 1]), processes)
    try:
        for spec in services:
            if spec.role == "proxy":  # after the replicas answer, as the supervisor orders it
                asyncio.run(_ready(served.replicas, processes, 600))
            with (work / f"{spec.name}.log").open("w") as log:
                processes[spec.name] = subprocess.Popen(spec.argv, cwd=work, env=child_environment(spec.env),
                                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        asyncio.run(_ready([served.proxy], processes, 120))
        yield served
    finally:
        for name in processes:
            served.kill(name)


async def _ready(urls: list[str], processes: dict[str, subprocess.Popen], timeout_s: float) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        deadline = asyncio.get_running_loop().time() + timeout_s
        for url in urls:
            while True:
                dead = [n for n, p in processes.items() if p.poll() is not None]
                assert not dead, f"{dead} exited before {url} was ready"
                try:
                    async with http.get(f"{url}/health") as r:
                        if r.status == 200:
                            break
                except (aiohttp.ClientError, TimeoutError):
                    pass
                assert asyncio.get_running_loop().time() < deadline, f"{url} not ready within {timeout_s:g} s"
                await asyncio.sleep(0.5)


def group_prompts(seed: int, prompts: int, own: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.choice(CHARACTERS) for _ in range(SYSTEM_TOKENS)]
    return [system + [rng.choice(CHARACTERS) for _ in range(rng.randint(*own))] for _ in range(prompts)]


async def generate(http: aiohttp.ClientSession, url: str, model: str, prompt: list[int], max_tokens: int,
                   **extra) -> dict:
    """One completion, shaped as TRL's AsyncRolloutWorker sends it (token ids, n=1, a seed of its own)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "n": 1,
            "return_token_ids": True, "logprobs": 0, "seed": random.getrandbits(63), **extra}
    async with http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def counters(http: aiohttp.ClientSession, urls: list[str], name: str) -> float:
    found = 0.0
    for url in urls:
        async with http.get(f"{url}/metrics") as r:
            found += total(await r.text(), name)
    return found


async def proxy_stats(http: aiohttp.ClientSession, served: Served) -> dict:
    async with http.get(f"{served.proxy}/proxy/stats") as r:
        return await r.json()


def test_concurrent_groups_hit_the_cache_as_round_robin_cannot(served):
    """16 prompts of G=8, all 128 requests at once. Any router that splits a group over the two replicas (as
    round-robin does) computes each prompt's own blocks on both; the proxy sends a group to one replica, so the
    engines hit more than a split could ever let them."""
    g, block = 8, served.block
    prompts = group_prompts(1, 16, (96, 160))

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            async with http.post(f"{served.proxy}/reset_prefix_cache") as r:  # broadcast to both replicas
                assert r.status == 200
            queries = await counters(http, served.replicas, "vllm:prefix_cache_queries_total")
            hits = await counters(http, served.replicas, "vllm:prefix_cache_hits_total")
            served_before = [await counters(http, [u], "vllm:request_success_total") for u in served.replicas]
            before = await proxy_stats(http, served)
            await asyncio.gather(*(generate(http, served.proxy, served.model, p, 8) for p in prompts
                                   for _ in range(g)))
            queries = await counters(http, served.replicas, "vllm:prefix_cache_queries_total") - queries
            hits = await counters(http, served.replicas, "vllm:prefix_cache_hits_total") - hits
            served_after = [await counters(http, [u], "vllm:request_success_total") for u in served.replicas]
            return queries, hits, [a - b for a, b in zip(served_after, served_before, strict=True)], before, \
                await proxy_stats(http, served)

    queries, hits, per_replica, before, after = asyncio.run(scenario())
    assert queries == sum(len(p) for p in prompts) * g
    # vLLM hits whole blocks, and never the last prompt token. A prompt's own blocks follow the 2 system blocks.
    cacheable = [(len(p) - 1) // block * block for p in prompts]
    own = [min(len(p) // block * block, c) - SYSTEM_TOKENS for p, c in zip(prompts, cacheable, strict=True)]
    split_best = sum(g * c - 2 * o for c, o in zip(cacheable, own, strict=True)) - 2 * SYSTEM_TOKENS
    grouped = sum(g * c - o for c, o in zip(cacheable, own, strict=True)) - 2 * SYSTEM_TOKENS
    assert hits > split_best, (hits, split_best, grouped, queries)
    assert hits >= grouped  # every group's prompt computed once, the system prompt at most once per replica
    assert min(per_replica) >= 4 * g  # and the groups spread over both replicas
    routed = {k: after["requests"][k] - before["requests"][k] for k in ("group", "affinity", "spill", "routed")}
    assert routed["routed"] == 16 * g and routed["spill"] == 0
    assert routed["group"] + routed["affinity"] >= 16 * (g - 1)  # every group's later requests followed its first


def test_requests_in_flight_when_a_replica_dies_are_retried_and_none_is_lost(served):
    """A step's rollouts in flight on both replicas; one replica is SIGKILLed while it runs some of them. Those are
    retried on the other replica: every prompt of the step gets all its completions, and no request fails."""
    g, max_tokens = 4, 96
    prompts = group_prompts(2, 12, (64, 128))
    victim = "vllm-1"

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            before = await proxy_stats(http, served)
            step = [asyncio.create_task(generate(http, served.proxy, served.model, p, max_tokens, ignore_eos=True))
                    for p in prompts for _ in range(g)]
            while True:  # wait on the event: the victim is generating some of the step's requests
                stats = await proxy_stats(http, served)
                if stats["replicas"][1]["inflight"] > 0 and stats["replicas"][0]["inflight"] > 0:
                    break
                assert not all(t.done() for t in step), "the step ended before both replicas were busy"
                await asyncio.sleep(0.01)
            at_kill = stats["replicas"][1]["inflight"]
            served.kill(victim)
            answers = await asyncio.gather(*step)
            return before, at_kill, answers, await proxy_stats(http, served)

    before, at_kill, answers, after = asyncio.run(scenario())
    assert at_kill > 0
    assert len(answers) == len(prompts) * g  # every prompt got its G completions
    assert all(len(a["choices"][0]["token_ids"]) == max_tokens for a in answers)
    assert after["errors"] == before["errors"] == {}
    assert after["requests"]["retries"] - before["requests"]["retries"] >= 1
    assert after["replicas"][1]["healthy"] is False and after["replicas"][0]["healthy"] is True
