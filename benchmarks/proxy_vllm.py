"""`grpo proxy` in front of two real vLLM replicas (vLLM's CPU build), measured by the engines themselves.

The replicas and the proxy are the ones `grpo plan recipe=tiny-cpu-async-lora` starts (same argv and
environment), serving the built-in tiny model. The workload is GRPO-shaped: 32 prompts behind a shared system
prompt, 8 completions each, sent the way TRL's AsyncRolloutWorker sends them (token-id prompts, one completion a
request, each with its own seed), 8 requests in flight. The same workload runs three ways, with fresh prompts and
emptied prefix caches each time:

- through the proxy (KV-prefix routing);
- round-robin over the same replicas (a client alternating by request);
- everything to one replica: the ideal, where every prefix is always where it was computed.

For each, the engines' own `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (prompt tokens,
hits in whole blocks) give the hit rate and the prefilled prompt tokens (queries minus hits). The proxy's own
prediction is the share of prompt tokens in blocks it routed to a replica that had them (/proxy/stats).

Targets: the proxy prefills at most 1.05x the one-replica ideal; its predicted hit rate is within 5 points of the
engines'. Round-robin is reported with what bounds it: each prompt's own blocks are computed once on each replica
that serves one of its completions (with 8 completions over 2 replicas, both), the shared prefix once per replica,
so it prefills at most about 2x the ideal's prompt-specific part.

Run: `python benchmarks/proxy_vllm.py` (about 2-3 minutes here; everything listens on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

from grpo_launch.compose import compose
from grpo_launch.contracts import tiny
from grpo_launch.launch.supervisor import child_environment
from grpo_launch.plan import build_plan

PROMPTS, G, INFLIGHT, MAX_TOKENS = 32, 8, 8, 8
SYSTEM_TOKENS, QUESTION_TOKENS = 64, (64, 128)  # 2 shared blocks of 32, then 2-4 blocks of a prompt's own
CONTEXT = 256
TARGET_PREFILL_RATIO, TARGET_PREDICTION_POINTS = 1.05, 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(url: str) -> tuple[float, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def workload(seed: int) -> list[list[int]]:
    """Fresh prompts (contents from `seed`) of the same lengths every time, so every policy prefills the same
    number of prompt tokens."""
    lengths, rng = random.Random(0), random.Random(seed)
    characters = range(len(tiny.SPECIAL_TOKENS), len(tiny.VOCABULARY))
    system = [rng.choice(characters) for _ in range(SYSTEM_TOKENS)]
    return [system + [rng.choice(characters) for _ in range(lengths.randint(*QUESTION_TOKENS))]
            for _ in range(PROMPTS)]


async def run_policy(targets, prompts: list[list[int]], model: str) -> None:
    """Every prompt's G completions, G requests in flight, the way TRL's rollout worker asks; `targets(i)` is the
    base URL request i goes to."""
    requests = [(i, p) for i, p in enumerate(p for p in prompts for _ in range(G))]
    queue: asyncio.Queue = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i, prompt = queue.get_nowait()
            payload = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 1.0, "n": 1,
                       "return_token_ids": True, "logprobs": 0, "seed": random.getrandbits(63)}
            async with session.post(f"{targets(i)}/v1/completions", json=payload) as response:
                response.raise_for_status()
                await response.read()

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(worker(session) for _ in range(INFLIGHT)))


def measure(name: str, replicas: list[str], targets, prompts, model: str, proxy: str | None = None) -> dict:
    for url in replicas:  # every policy starts from empty caches
        urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=30)
    before = [counters(u) for u in replicas]
    stats_before = json.loads(urllib.request.urlopen(f"{proxy}/proxy/stats").read())["prefix"] if proxy else None
    started = time.perf_counter()
    asyncio.run(run_policy(targets, prompts, model))
    seconds = time.perf_counter() - started
    after = [counters(u) for u in replicas]
    queries = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    hits = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    out = {"policy": name, "queries": queries, "hits": hits, "prefilled": queries - hits, "hit_rate": hits / queries,
           "seconds": seconds}
    if proxy:
        stats = json.loads(urllib.request.urlopen(f"{proxy}/proxy/stats").read())
        matched = (stats["prefix"]["matched_blocks"] - stats_before["matched_blocks"]) * stats["prefix"]["block_size"]
        out["predicted_hit_rate"] = matched / queries
        out["routing"] = stats["requests"]
    return out


def main() -> int:
    ports = [free_port() for _ in range(3)]
    composed = compose(["recipe=tiny-cpu-async-lora", f"model.tiny.max_position_embeddings={CONTEXT}",
                        f"vllm.max_model_len={CONTEXT}", f"vllm.port={ports[0]}",
                        f"placement.async_lora.proxy.port={ports[2]}"])
    plan = build_plan(composed)
    work = Path(tempfile.mkdtemp(prefix="grpo-proxy-vllm-"))
    for step in plan.prepare:
        subprocess.run(step.argv, cwd=work, check=True, env=child_environment({}), stdout=subprocess.DEVNULL)
    services = [p for p in plan.processes if p.role in ("vllm", "proxy")]
    replicas = [f"http://127.0.0.1:{p.port}" for p in services if p.role == "vllm"]
    proxy = next(f"http://127.0.0.1:{p.port}" for p in services if p.role == "proxy")
    logs = {p.name: (work / f"{p.name}.log").open("w") for p in services}
    started = time.perf_counter()
    children = []
    try:
        for spec in services:
            if spec.role == "proxy":  # after the replicas answer, as the supervisor orders it
                for url in replicas:
                    wait_ready(f"{url}/health", 600)
            children.append(subprocess.Popen(spec.argv, cwd=work, env=child_environment(spec.env),
                                             stdout=logs[spec.name], stderr=subprocess.STDOUT, start_new_session=True))
        wait_ready(f"{proxy}/health", 120)
        print(f"2 replicas and the proxy up in {time.perf_counter() - started:.1f} s ({work})")
        model = plan.trainer_inputs.model
        for url in replicas:  # each engine's first requests compile its sampler once: not part of any policy
            asyncio.run(run_policy(lambda i, url=url: url, workload(0)[:2], model))
        results = [
            measure("proxy (KV-prefix routing)", replicas, lambda i: proxy, workload(1), model, proxy=proxy),
            measure("round-robin", replicas, lambda i: replicas[i % 2], workload(2), model),
            measure("one replica (ideal)", replicas, lambda i: replicas[0], workload(3), model),
        ]
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=60)
    report(results)
    return 0


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=3).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s")


def report(results: list[dict]) -> None:
    ours, robin, ideal = results
    print(f"{'policy':28} {'queries':>8} {'hits':>8} {'hit rate':>9} {'prefilled':>10} {'vs ideal':>9} {'time':>7}")
    for r in results:
        print(f"{r['policy']:28} {r['queries']:8.0f} {r['hits']:8.0f} {r['hit_rate']:9.1%} {r['prefilled']:10.0f} "
              f"{r['prefilled'] / ideal['prefilled']:8.2f}x {r['seconds']:6.1f}s")
    routing = ours["routing"]
    print(f"proxy routing: {routing['affinity']} affinity, {routing['spill']} spilled, {routing['unmatched']} "
          f"unmatched (cumulative, warm-up included)")
    ratio = ours["prefilled"] / ideal["prefilled"]
    points = abs(ours["predicted_hit_rate"] - ours["hit_rate"]) * 100
    print(f"proxy prefills {ratio:.3f}x the one-replica ideal: "
          f"{'meets' if ratio <= TARGET_PREFILL_RATIO else 'MISSES'} the target of <= {TARGET_PREFILL_RATIO}x")
    print(f"proxy predicted a {ours['predicted_hit_rate']:.1%} hit rate, the engines measured {ours['hit_rate']:.1%}: "
          f"{points:.1f} points, {'meets' if points <= TARGET_PREDICTION_POINTS else 'MISSES'} the target of <= "
          f"{TARGET_PREDICTION_POINTS:g}")
    print(f"round-robin prefills {robin['prefilled'] / ideal['prefilled']:.2f}x the ideal and "
          f"{robin['prefilled'] / ours['prefilled']:.2f}x the proxy (bounded by about 2x the ideal's prompt-specific "
          f"part: each prompt's own blocks computed on both replicas)")


if __name__ == "__main__":
    sys.exit(main())
