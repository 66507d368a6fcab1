"""The routing proxy in front of two real vLLM replicas (vLLM's CPU build), as `grpo plan recipe=tiny-cpu-async-lora`
starts them (each requiring the run's key, which the proxy sends), judged by the engines' own counters. One fleet for
the module (a replica starts in 20-45 s here); the test that kills a replica runs last."""

import asyncio
import os
import random
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from conftest import free_ports
from engine import total
from fault_matrix import CONSISTENT, REFUSED, FaultRow, record_fault

from grpo_launch.compose import compose
from grpo_launch.contracts import tiny
from grpo_launch.contracts.plan import Plan, ProcessSpec
from grpo_launch.launch.spawn import child_environment
from grpo_launch.plan import build_plan

pytestmark = pytest.mark.slow
CONTEXT, SYSTEM_TOKENS = 512, 64
KEY_ENV, KEY = "GRPO_VLLM_API_KEY", "replica-key-5d2e9b71c4a8"  # the run's key, as the launch gives it
AUTH = {"Authorization": f"Bearer {KEY}"}
CHARACTERS = range(len(tiny.SPECIAL_TOKENS), len(tiny.VOCABULARY))


@dataclass
class Served:
    replicas: list[str]
    proxy: str
    model: str
    block: int
    processes: dict[str, subprocess.Popen]
    specs: dict[str, ProcessSpec]
    plan: Plan
    work: Path

    def start(self, name: str) -> None:
        """Start a process as the supervisor does: its spec's argv and environment, in a session of its own."""
        spec = self.specs[name]
        with self.log(name).open("a") as log:
            self.processes[name] = subprocess.Popen(spec.argv, cwd=self.work, env=child_environment(spec.env),
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        """SIGKILL the process group: the server and vLLM's engine with it."""
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def log(self, name: str) -> Path:
        return self.work / f"{name}.log"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("proxy-vllm")
    given = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = KEY  # what the launch puts in the supervisor's environment, every process inherits
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
                    int(vllm[0].argv[vllm[0].argv.index("--block-size") + 1]), processes,
                    {p.name: p for p in services}, plan, work)
    try:
        for spec in services:
            if spec.role == "proxy":  # after the replicas answer, as the supervisor orders it
                asyncio.run(_ready(served.replicas, processes, 600))
            served.start(spec.name)
        asyncio.run(_ready([served.proxy], processes, 120))
        yield served
    finally:
        for name in processes:
            served.kill(name)
        os.environ.pop(KEY_ENV) if given is None else os.environ.update({KEY_ENV: given})


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
                   headers: dict | None = None, **extra) -> dict:
    """One completion, shaped as TRL's AsyncRolloutWorker sends it (token ids, n=1, a seed of its own)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "n": 1,
            "return_token_ids": True, "logprobs": 0, "seed": random.getrandbits(63), **extra}
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def counters(http: aiohttp.ClientSession, urls: list[str], name: str) -> float:
    found = 0.0
    for url in urls:
        async with http.get(f"{url}/metrics", headers=AUTH) as r:
            found += total(await r.text(), name)
    return found


async def proxy_stats(http: aiohttp.ClientSession, served: Served) -> dict:
    async with http.get(f"{served.proxy}/proxy/stats") as r:
        return await r.json()


@pytest.mark.fault
def test_a_replica_started_by_the_plan_answers_only_with_the_runs_key(served, tmp_path):
    """vLLM's own --api-key guards /v1 only; the plan's replicas run grpo-launch's guard: without the key (or with
    a wrong one) every route but /health is refused, dev-mode ones included, and nothing happens. With it, as
    Bearer or as HTTP Basic's password (TRL's clients, from a URL's user info), they answer; so do the supervisor's
    probes, which send the key their spec names."""
    from grpo_launch.launch.probes import fetch_metrics, probe

    protected = [("POST", "/pause?mode=keep", None), ("POST", "/sleep?level=1", None),
                 ("POST", "/reset_prefix_cache", None), ("POST", "/collective_rpc", {"method": "no_such_method"}),
                 ("GET", "/server_info", None),
                 ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)}),
                 ("POST", "/v1/completions", {"model": served.model, "prompt": [5, 6], "max_tokens": 1}),
                 ("GET", "/metrics", None), ("GET", "/is_paused", None)]
    basic = aiohttp.BasicAuth("grpo", KEY).encode()

    async def scenario() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            for url in served.replicas:
                for method, path, body in protected:
                    for headers in ({}, {"Authorization": f"Bearer {KEY}-wrong"}, {"Authorization": KEY}):
                        async with http.request(method, url + path, json=body, headers=headers) as r:
                            assert r.status == 401, (url, path, headers, await r.text())
                            assert KEY not in await r.text()
                async with http.get(f"{url}/health") as r:
                    assert r.status == 200  # liveness stays open: schedulers' health checks hold no key
                for auth in (f"Bearer {KEY}", basic):
                    async with http.get(f"{url}/is_paused", headers={"Authorization": auth}) as r:
                        assert r.status == 200 and (await r.json())["is_paused"] is False
            async with http.get(f"{served.proxy}/health") as r:  # the proxy reaches both with the key
                assert r.status == 200
    asyncio.run(scenario())
    for spec in (s for s in served.specs.values() if s.role == "vllm"):
        assert asyncio.run(probe(spec.ready_url, 5, spec.probe_key_env)) == 200
        fetch_metrics(spec, tmp_path / f"{spec.name}.metrics")
        assert "vllm:num_requests_running" in (tmp_path / f"{spec.name}.metrics").read_text()
    calls = 3 * len(protected) * len(served.replicas)
    record_fault(FaultRow("17 calls to a plan's replicas without the run's key", calls, REFUSED, REFUSED))


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


def write_adapter(served: Served, path: Path) -> None:
    """A LoRA adapter of the served model as the trainer writes one, put in place whole (as a mount shows it)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_launch.trainer.main import peft_config

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(served.work / served.model),
                           peft_config(served.plan.trainer_inputs.lora))
    model.save_pretrained(path.with_name(path.name + ".partial"))
    path.with_name(path.name + ".partial").rename(path)


def load_attempts(served: Served, name: str) -> int:
    """The adapter loads a replica has answered, by its access log."""
    return served.log(name).read_text().count('"POST /v1/load_lora_adapter HTTP/1.1"')


async def models(http: aiohttp.ClientSession, url: str) -> set[str]:
    async with http.get(f"{url}/v1/models", headers=AUTH) as r:
        assert r.status == 200, await r.text()
        return {card["id"] for card in (await r.json())["data"]}


@pytest.mark.fault
def test_a_replica_killed_during_an_adapter_load_is_brought_to_the_fleets_adapters(served, tmp_path):
    """An adapter load waits for the replicas to see the adapter's directory (shared storage lags); meanwhile a
    replica is SIGKILLed. The load completes on the replica that answers and the dead one leaves routing; started
    again (as the supervisor restarts it), it is given the adapter before it serves again. Afterwards every replica
    has it, and generates with it."""
    name, path, victim = "policy-through-a-death", tmp_path / "adapter", "vllm-1"
    body = {"lora_name": name, "lora_path": str(path), "load_inplace": False}

    async def load_while_one_dies() -> tuple[int, str]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            before = {n: load_attempts(served, n) for n in ("vllm-0", victim)}

            async def post() -> tuple[int, str]:
                async with http.post(f"{served.proxy}/v1/load_lora_adapter", json=body) as r:
                    return r.status, await r.text()
            load = asyncio.create_task(post())
            deadline = asyncio.get_running_loop().time() + 60
            while any(load_attempts(served, n) == before[n] for n in before):  # both asked: the load is in flight
                assert not load.done(), await load
                assert asyncio.get_running_loop().time() < deadline, "the load never reached both replicas"
                await asyncio.sleep(0.05)
            served.kill(victim)
            write_adapter(served, path)
            return await load

    status, text = asyncio.run(load_while_one_dies())
    assert status == 200, text
    served.start(victim)
    asyncio.run(_ready([served.proxy], served.processes, 600))  # 200 once every replica is back in routing

    async def check() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            async with http.get(f"{served.proxy}/proxy/stats") as r:
                assert name in (await r.json())["fleet"]["adapters"]
            for url in served.replicas:
                assert name in await models(http, url), url
                answer = await generate(http, url, name, group_prompts(3, 1, (8, 8))[0], 4, headers=AUTH)
                assert answer["model"] == name
    asyncio.run(check())
    record_fault(FaultRow("16 a real vLLM replica SIGKILLed mid-broadcast", 1, CONSISTENT, CONSISTENT))


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
