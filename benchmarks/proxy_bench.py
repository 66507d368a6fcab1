"""Benchmark `grpo proxy` on this machine, against baselines measured in the same run; prints results and targets.

1. Routing quality. Four simulated vLLM replicas (a real LRU prefix cache of 16-token blocks; time charged per
   uncached prompt token, one prefill at a time, and per generated token, decoding overlapped but stalled by the
   replica's prefills, as on a GPU) serve a GRPO
   workload: prompts behind a shared system prompt, G=8 completions each, 64 requests in flight, a new adapter
   version every 32 prompts. Three policies side by side: round-robin and least-loaded (the client picks the
   replica), and ours (through the real `grpo proxy` process). Targets: hit rate within 2 points of the
   workload's ideal, at least 1.5x fewer prefilled tokens than round-robin, load imbalance at most 10% above
   least-loaded's.
2. Overhead. Latency added over calling one replica directly, p50 and p99, at 1, 16 and 64 concurrent clients, for
   the proxy, for vLLM's own router (`vllm-router`, Rust, its default `cache_aware` policy) and for a bare aiohttp
   forwarder, all in the same run; and the proxy's request rate per second of its own CPU (it is one asyncio
   thread: one core). Target: p50 added <= 1 ms at 64 concurrent.

Everything listens on 127.0.0.1; every loop stops by count or time. Run: `python benchmarks/proxy_bench.py`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from grpo_launch.proxy.router import block_hashes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulated replicas: a test stand-in

# The workload: a GRPO run in miniature.
REPLICAS, G, PROMPTS, PROMPTS_PER_VERSION, INFLIGHT = 4, 8, 160, 32, 64
BLOCK, SYSTEM_TOKENS, QUESTION_TOKENS, COMPLETION_TOKENS = 16, 160, (64, 256), (64, 512)
# Seconds per uncached prompt token (10k tokens/s of prefill per replica) and per generated token (overlapped).
PREFILL_S, DECODE_S = 100e-6, 1e-3
# Overhead runs: a replica answering after a fixed delay, so request rates stay where this machine keeps up.
OVERHEAD_CONCURRENCY, OVERHEAD_RUN_S, OVERHEAD_PROMPT_TOKENS, TARGET_RATE = (1, 16, 64), 3.0, 512, 400.0
THROUGHPUT_RUN_S = 3.0


@dataclass(frozen=True)
class Request:
    group: int
    version: str
    tokens: list[int]
    max_tokens: int


def workload(seed: int = 0) -> list[list[Request]]:
    rng = random.Random(seed)
    system = [rng.randrange(1000, 2000) for _ in range(SYSTEM_TOKENS)]
    groups = []
    for g in range(PROMPTS):
        version = f"policy-v{1 + g // PROMPTS_PER_VERSION}"
        question = [rng.randrange(2000, 50_000) for _ in range(rng.randint(*QUESTION_TOKENS))]
        groups.append([Request(g, version, system + question, rng.randint(*COMPLETION_TOKENS)) for _ in range(G)])
    return groups


def ideal_hit_rate(groups: list[list[Request]]) -> float:
    """The best any router can do with every replica in use and unlimited cache: each prompt prefilled once, the
    system prompt once per replica and version, the last prompt token always computed (as vLLM does)."""
    system_blocks = SYSTEM_TOKENS // BLOCK
    groups_seen: dict[str, int] = {}
    prompt_tokens = cached = 0
    for group in groups:
        version = group[0].version
        groups_seen[version] = groups_seen.get(version, 0) + 1
        system_cached = groups_seen[version] > REPLICAS  # the first group of a version on each replica pays it
        for j, request in enumerate(group):
            full_blocks = len(block_hashes(version, request.tokens, BLOCK))
            hit_blocks = full_blocks if j else (system_blocks if system_cached else 0)
            prompt_tokens += len(request.tokens)
            cached += min(hit_blocks * BLOCK, len(request.tokens) - 1)
    return cached / prompt_tokens


# -- processes --------------------------------------------------------------------------------------------------


def _serve_sims(conn, count: int) -> None:
    """Child process: `count` simulated replicas in one event loop, until the parent says stop (or goes away)."""
    from standins.sim_replica import SimReplica

    async def main() -> None:
        sims = [SimReplica(f"r{i}", block_size=BLOCK, max_model_len=8192) for i in range(count)]
        conn.send([await s.start() for s in sims])
        await _until_told(conn)
        for s in sims:
            await s.stop()

    asyncio.run(main())


def _serve_forwarder(conn, upstream: str) -> None:
    """Child process: the least any aiohttp proxy does (read, forward, answer), to tell its cost from ours."""
    from aiohttp import web

    async def main() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def forward(request: web.Request) -> web.Response:
                async with session.post(upstream + request.path, data=await request.read(),
                                        headers={"Content-Type": "application/json"}) as r:
                    return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

            app = web.Application()
            app.router.add_post("/v1/completions", forward)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            conn.send([runner.addresses[0][1]])
            await _until_told(conn)
            await runner.cleanup()

    asyncio.run(main())


async def _until_told(conn) -> None:
    try:
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    except EOFError:  # the parent is gone
        pass


class Child:
    """Servers in a spawned process; `urls` once they listen."""

    def __init__(self, target, *args) -> None:
        spawn = multiprocessing.get_context("spawn")
        self._conn, child = spawn.Pipe()
        self._process = spawn.Process(target=target, args=(child, *args), daemon=True)
        self._process.start()
        if not self._conn.poll(60):
            raise RuntimeError(f"{target.__name__} did not start")
        self.urls = [f"http://127.0.0.1:{p}" for p in self._conn.recv()]

    def close(self) -> None:
        self._conn.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()


class RouterProcess:
    """vLLM's own router (`vllm-router`) in front of the same replica."""

    def __init__(self, replica: str, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(Path(sys.executable).parent / "vllm-router"), "--host", "127.0.0.1", "--port", str(self.port),
                "--policy", "cache_aware", "--worker-urls", replica, "--log-level", "warning"]
        self._log = log_path.open("w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    async def wait_healthy(self, http: aiohttp.ClientSession) -> None:
        await _wait_healthy(http, self.url, self.process, self._log, "vllm-router")

    def close(self) -> None:
        _stop(self.process)
        self._log.close()


async def _wait_healthy(http: aiohttp.ClientSession, url: str, process: subprocess.Popen, log, name: str) -> None:
    for _ in range(300):
        try:
            async with http.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if process.poll() is not None:
            break
        await asyncio.sleep(0.1)
    log.flush()
    tail = Path(log.name).read_text()[-2000:]
    raise RuntimeError(f"{name} did not become healthy; its log ends:\n{tail}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ProxyProcess:
    """The real `grpo proxy`, started the way the async-lora plan starts it."""

    def __init__(self, replicas: list[str], log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", "proxy",
                "--host", "127.0.0.1", "--port", str(self.port), "--block-size", str(BLOCK), "--imbalance", "8",
                "--max-tracked-blocks", "500000", "--lora-load-timeout-s", "30", "--tokenizer", "sim/base"]
        for url in replicas:
            argv += ["--replica", url]
        self._log = log_path.open("w")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    async def wait_healthy(self, http: aiohttp.ClientSession) -> None:
        await _wait_healthy(http, self.url, self.process, self._log, "grpo proxy")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def close(self) -> None:
        _stop(self.process)
        self._log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- routing quality --------------------------------------------------------------------------------------------


class ClientSide:
    """A baseline: the client picks the replica itself, round-robin or by its own in-flight counts."""

    def __init__(self, urls: list[str], least_loaded: bool) -> None:
        self.urls, self.least_loaded = urls, least_loaded
        self.inflight = [0] * len(urls)
        self._turn = 0

    def _pick(self) -> int:
        self._turn += 1
        order = [(self._turn + k) % len(self.urls) for k in range(len(self.urls))]
        return min(order, key=self.inflight.__getitem__) if self.least_loaded else order[0]

    async def generate(self, http: aiohttp.ClientSession, body: bytes) -> int:
        i = self._pick()
        self.inflight[i] += 1
        try:
            return await _post(http, self.urls[i] + "/v1/completions", body)
        finally:
            self.inflight[i] -= 1

    async def broadcast(self, http: aiohttp.ClientSession, path: str, payload: dict) -> None:
        for url in self.urls:
            await _post(http, url + path, json.dumps(payload).encode())


class ThroughProxy:
    def __init__(self, url: str) -> None:
        self.url = url

    async def generate(self, http: aiohttp.ClientSession, body: bytes) -> int:
        return await _post(http, self.url + "/v1/completions", body)

    async def broadcast(self, http: aiohttp.ClientSession, path: str, payload: dict) -> None:
        status = await _post(http, self.url + path, json.dumps(payload).encode())
        if status != 200:
            raise RuntimeError(f"{path} through the proxy answered {status}")


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> int:
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return r.status


@dataclass(frozen=True)
class RoutingResult:
    policy: str
    hit_rate: float
    prefilled: int
    makespan_s: float
    busy_imbalance: float       # max / mean of per-replica busy time
    request_imbalance: float    # max / mean of per-replica requests
    failures: int


async def run_policy(policy: str, target, groups: list[list[Request]], sims: list[str], adapters: Path,
                     http: aiohttp.ClientSession) -> RoutingResult:
    costs = json.dumps({"prefill_s_per_token": PREFILL_S, "decode_s_per_token": DECODE_S,
                        "base_latency_s": 0.0}).encode()
    for url in sims:
        await _post(http, url + "/sim/reset", costs)
    slots = asyncio.Semaphore(INFLIGHT)
    failures = 0

    async def one(request: Request) -> None:
        nonlocal failures
        try:
            body = json.dumps({"model": request.version, "prompt": request.tokens, "max_tokens": request.max_tokens,
                               "n": 1, "return_token_ids": True, "logprobs": 0}).encode()
            if await target.generate(http, body) != 200:
                failures += 1
        finally:
            slots.release()

    started = time.perf_counter()
    tasks, versions = [], []
    for group in groups:
        version = group[0].version
        if version not in versions:  # the trainer publishes a new policy; the one before last is retired
            (adapters / version).mkdir(exist_ok=True)
            await target.broadcast(http, "/v1/load_lora_adapter",
                                   {"lora_name": version, "lora_path": str(adapters / version)})
            versions.append(version)
            if len(versions) > 2:
                await target.broadcast(http, "/v1/unload_lora_adapter", {"lora_name": versions[-3]})
        for request in group:
            await slots.acquire()
            tasks.append(asyncio.create_task(one(request)))
    await asyncio.gather(*tasks)
    makespan = time.perf_counter() - started

    stats = []
    for url in sims:
        async with http.get(url + "/sim/stats") as r:
            stats.append(await r.json())
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    busy = [s["busy_s"] for s in stats]
    served = [s["requests"] for s in stats]
    return RoutingResult(policy, cached / prompt, prompt - cached, makespan, max(busy) / (sum(busy) / len(busy)),
                         max(served) / (sum(served) / len(served)), failures)


# -- overhead ---------------------------------------------------------------------------------------------------


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latencies(http: aiohttp.ClientSession, url: str, body: bytes, concurrency: int, seconds: float,
                    spread_s: float = 0.0) -> list[float]:
    """Closed-loop clients; their first requests spread over `spread_s` so that, with a replica whose delay is fixed,
    they do not arrive in lockstep bursts (no real workload does, and a burst measures queueing, not the proxy)."""
    deadline = time.perf_counter() + seconds
    samples: list[float] = []

    async def client(k: int) -> None:
        await asyncio.sleep(spread_s * k / concurrency)
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            if await _post(http, url, body) != 200:
                raise RuntimeError(f"{url} failed during the overhead run")
            samples.append(time.perf_counter() - t)

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return samples


async def overhead(replica: str, proxy: str, router: str, forwarder: str, http: aiohttp.ClientSession) -> list[tuple]:
    """Per concurrency: (clients, delay, requests, {side: (p50, p99)}) for direct, ours, vllm-router and the bare
    forwarder."""
    body = json.dumps({"model": "sim/base", "prompt": list(range(OVERHEAD_PROMPT_TOKENS)), "max_tokens": 16,
                       "n": 1, "return_token_ids": True, "logprobs": 0}).encode()
    rows = []
    for c in OVERHEAD_CONCURRENCY:
        delay = max(0.005, c / TARGET_RATE)
        await _post(http, replica + "/sim/reset", json.dumps({"base_latency_s": delay}).encode())
        sides = {"direct": replica, "ours": proxy, "vllm-router": router, "forwarder": forwarder}
        samples: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(2):  # interleaved halves, so a noisy neighbour hurts every side alike
            for side, url in sides.items():
                samples[side] += await latencies(http, url + "/v1/completions", body, c, OVERHEAD_RUN_S / 2, delay)
        rows.append((c, delay, len(samples["ours"]),
                     {side: (_quantile(x, 0.5), _quantile(x, 0.99)) for side, x in samples.items()}))
    return rows


async def throughput(replica: str, proxy: ProxyProcess, http: aiohttp.ClientSession) -> tuple[float, float]:
    """Requests per second of proxy CPU, and per wall second, with a replica that answers at once."""
    await _post(http, replica + "/sim/reset", json.dumps({"base_latency_s": 0.0}).encode())
    body = json.dumps({"model": "sim/base", "prompt": list(range(OVERHEAD_PROMPT_TOKENS)), "max_tokens": 16}).encode()
    cpu, wall = proxy.cpu_seconds(), time.perf_counter()
    done = len(await latencies(http, proxy.url + "/v1/completions", body, 64, THROUGHPUT_RUN_S))
    return done / max(proxy.cpu_seconds() - cpu, 1e-9), done / (time.perf_counter() - wall)


async def main() -> int:
    groups = workload()
    ideal = ideal_hit_rate(groups)
    sims = Child(_serve_sims, REPLICAS + 1)  # four to route across, one for the overhead runs
    routed, single = sims.urls[:REPLICAS], sims.urls[REPLICAS]
    forwarder = Child(_serve_forwarder, single)
    proxies: list[ProxyProcess] = []
    router: RouterProcess | None = None
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as scratch:
        root = Path(scratch)
        try:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
                proxies = [ProxyProcess(routed, root / "proxy-routing.log"),
                           ProxyProcess([single], root / "proxy-overhead.log")]
                router = RouterProcess(single, root / "vllm-router.log")
                for p in (*proxies, router):
                    await p.wait_healthy(http)
                results = []
                for name, target in (("round-robin", ClientSide(routed, least_loaded=False)),
                                     ("least-loaded", ClientSide(routed, least_loaded=True)),
                                     ("ours (grpo proxy)", ThroughProxy(proxies[0].url))):
                    (root / name).mkdir()
                    results.append(await run_policy(name, target, groups, routed, root / name, http))
                async with http.get(proxies[0].url + "/proxy/stats") as r:
                    proxy_stats = await r.json()
                rows = await overhead(single, proxies[1].url, router.url, forwarder.urls[0], http)
                per_cpu_s, per_wall_s = await throughput(single, proxies[1], http)
        finally:
            for p in proxies:
                p.close()
            if router is not None:
                router.close()
            forwarder.close()
            sims.close()

    report(results, ideal, proxy_stats, rows, per_cpu_s, per_wall_s)
    return 0


# -- report -----------------------------------------------------------------------------------------------------


def report(results: list[RoutingResult], ideal: float, proxy_stats: dict, rows: list[tuple], per_cpu_s: float,
           per_wall_s: float) -> None:
    rr, ll, ours = results
    print(f"routing quality: {REPLICAS} replicas, {PROMPTS} prompts x G={G} = {PROMPTS * G} requests, "
          f"{PROMPTS // PROMPTS_PER_VERSION} adapter versions, {INFLIGHT} in flight, system prompt "
          f"{SYSTEM_TOKENS} tokens, blocks of {BLOCK}")
    print(f"  {'policy':<18}{'hit rate':>9}{'prefilled tokens':>18}{'makespan':>10}{'max/mean busy':>15}"
          f"{'max/mean requests':>19}{'failed':>8}")
    for r in results:
        print(f"  {r.policy:<18}{r.hit_rate:>9.1%}{r.prefilled:>18,}{r.makespan_s:>9.2f}s{r.busy_imbalance:>15.3f}"
              f"{r.request_imbalance:>19.3f}{r.failures:>8}")
    print(f"  {'ideal':<18}{ideal:>9.1%}")
    rates = proxy_stats["rates"]
    print(f"  ours: group {rates['group']:.1%}, affinity {rates['affinity']:.1%}, spill {rates['spill']:.1%}, "
          f"unmatched {rates['unmatched']:.1%} of {proxy_stats['requests']['routed']} routed requests")

    print(f"overhead: one replica answering after a fixed delay (rate ~{TARGET_RATE:g}/s, at least 5 ms), "
          f"{OVERHEAD_PROMPT_TOKENS}-token prompts, {OVERHEAD_RUN_S:g} s per side, each side's latency minus the "
          f"direct call's; vllm-router is vLLM's own router (Rust, cache_aware); 'forwarder' is a bare aiohttp "
          f"read-forward-answer hop, the floor for any aiohttp proxy on this machine")
    print(f"  {'clients':>8}{'delay':>8}{'requests':>10}{'p50 direct':>12}{'p99 direct':>12}"
          + "".join(f"{side + ' p50':>17}{'p99':>9}" for side in ("ours", "vllm-router", "forwarder")))
    ms = 1e3
    for c, delay, n, q in rows:
        d50, d99 = q["direct"]
        added = "".join(f"{(q[side][0] - d50) * ms:>15.2f}ms{(q[side][1] - d99) * ms:>7.2f}ms"
                        for side in ("ours", "vllm-router", "forwarder"))
        print(f"  {c:>8}{delay * ms:>6.0f}ms{n:>10}{d50 * ms:>10.2f}ms{d99 * ms:>10.2f}ms{added}")
    print(f"  proxy request rate: {per_cpu_s:,.0f} requests per CPU-second of the proxy (one core), "
          f"{per_wall_s:,.0f}/s wall with 64 clients on this shared machine")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (replicas, proxy and "
          f"clients share them: latency figures include waiting for a CPU)")

    added_p50_64 = rows[-1][3]["ours"][0] - rows[-1][3]["direct"][0]
    limit = 1.1 * ll.busy_imbalance
    checks = [
        (f"hit rate within 2 points of ideal: {ours.hit_rate:.1%} vs {ideal:.1%}", ours.hit_rate >= ideal - 0.02),
        (f"prefilled tokens >= 1.5x fewer than round-robin: {rr.prefilled / ours.prefilled:.2f}x",
         rr.prefilled >= 1.5 * ours.prefilled),
        (f"imbalance (max/mean busy) <= 1.10x least-loaded's: {ours.busy_imbalance:.3f} vs {ll.busy_imbalance:.3f} "
         f"(limit {limit:.3f})", ours.busy_imbalance <= limit),
        (f"p50 added at 64 concurrent <= 1 ms: {added_p50_64 * 1e3:.2f} ms", added_p50_64 <= 1e-3),
        ("no failed request", not any(r.failures for r in results)),
    ]
    print("targets")
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
