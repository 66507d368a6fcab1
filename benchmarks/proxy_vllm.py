"""`grpo proxy` against vLLM's own router (`vllm-router`) in front of real vLLM replicas, on GRPO traffic, measured
by the engines themselves.

The replicas are the ones `grpo plan recipe=tiny-cpu-async-lora` starts (vLLM's CPU build, the built-in tiny model,
32-token blocks, runtime LoRA), 2 or 4 of them on this machine, each publishing its KV-cache events. Requests are
shaped the way TRL's AsyncRolloutWorker sends them: token-id prompts, one completion a request with its own seed, the
G requests of a group one after another, at most `window` requests in flight (its `max_inflight_tasks`).

Workloads (fresh prompts for every run; the same lengths for every policy):

- `window`: the old shape: 32 prompts (a 64-token system prompt, then 64-128 tokens of their own), G=8, 8 requests
  in flight, so about one group at a time;
- `groups`: 128 prompts, G=8, 64 groups (512 requests) in flight, as TRL sends them with a large window;
- `pressure`: each engine's KV cache (`--num-gpu-blocks-override`) holds about half the prompts' blocks; 2 epochs
  over longer prompts, so blocks are evicted and what a router remembers of the first epoch is wrong in the second;
- `skew`: prompts of 1 to 23 blocks of their own (log-uniform), so request counts and token loads part;
- `rollover`: the served LoRA adapter changes every 16 groups (loaded on every replica: through the proxy's
  broadcast for the proxy, directly for the others); vLLM keys its prefix cache by adapter, so old prefixes are dead.

Policies, each against the same replicas with emptied prefix caches: `grpo proxy` (the process the plan starts);
`vllm-router` with `cache_aware`, `consistent_hash`, `sticky_least_loaded`, `round_robin` and `kv_aware` (fed by the
same KV events); and `one replica` (everything to replica 0: every prefix computed once, the floor on prefilled
tokens where the workload fits one engine).

Measured from each engine's /metrics (deltas over the run): prefilled prompt tokens (`prefix_cache_queries` minus
`prefix_cache_hits`), the hit rate, the imbalance (max over mean per replica) of requests and of prompt tokens; from
the client: the makespan and the p50/p99 request latency. Each number is the median of the repeats.

Targets, per workload and replica count: the proxy prefills at most 1.02x the fewest tokens any vllm-router policy
prefills, and its prompt-token imbalance is at most 1.10. Makespan and latency are reported beside them: several CPU
engines on 2 shared cores measure contention as much as routing.

Run: `python benchmarks/proxy_vllm.py` (2 replicas, 3 workloads, 4 policies, one repeat: about 6 minutes on this
2-CPU machine), `--full` for every workload and policy on 2 and 4 replicas with 3 repeats (about 2.5 hours here;
record it in pieces with --record and --first-repeat, and join them with --report). Everything listens on
127.0.0.1; every process it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import aiohttp

from grpo_launch.compose import compose
from grpo_launch.contracts import tiny
from grpo_launch.contracts.plan import Role
from grpo_launch.launch.spawn import child_environment
from grpo_launch.plan import build_plan
from grpo_launch.proxy.upstream import KEEPALIVE_S

CONTEXT, MAX_TOKENS = 1024, 8
TARGET_PREFILL_RATIO, TARGET_TOKEN_IMBALANCE = 1.02, 1.10
ROUTER_POLICIES = ("cache_aware", "consistent_hash", "sticky_least_loaded", "round_robin", "kv_aware")
PROXY, ONE = "grpo proxy", "one replica"
# `make bench`: a few minutes; --full for the whole matrix.
DEFAULT_WORKLOADS = ["groups", "skew", "rollover"]
DEFAULT_POLICIES = [PROXY, "cache_aware", "consistent_hash", "round_robin"]
LOG_LEVEL = os.environ.get("VLLM_ROUTER_LOG_LEVEL", "warning")


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: int
    window: int                        # requests in flight (TRL's max_inflight_tasks)
    own_tokens: tuple[int, int]        # a prompt's own tokens after the system prompt: range
    g: int = 8
    system_tokens: int = 64
    log_uniform: bool = False          # own lengths spread evenly over their logarithm (skew), else uniformly
    epochs: int = 1
    version_every: int = 0             # groups per adapter version; 0: the base model throughout
    cache_share: float = 0.0           # KV cache of all replicas together, as a share of the prompts' blocks; 0: roomy

    def prompts_of(self, seed: int) -> tuple[list[list[int]], list[str | None]]:
        """Every request's prompt and adapter version, in the order TRL dispatches them. Lengths depend on the
        workload only, contents on `seed`: every policy prefills the same number of prompt tokens."""
        lengths, rng = random.Random(self.name), random.Random(seed)
        characters = range(len(tiny.SPECIAL_TOKENS), len(tiny.VOCABULARY))
        system = [rng.choice(characters) for _ in range(self.system_tokens)]
        low, high = self.own_tokens
        own = [round(math.exp(lengths.uniform(math.log(low), math.log(high)))) if self.log_uniform
               else lengths.randint(low, high) for _ in range(self.prompts)]
        prompts = [system + [rng.choice(characters) for _ in range(n)] for n in own]
        groups = [p for _ in range(self.epochs) for p in prompts]
        versions = [f"v{1 + g // self.version_every}" if self.version_every else None for g in range(len(groups))]
        return ([p for p in groups for _ in range(self.g)], [v for v in versions for _ in range(self.g)])

    def cache_blocks(self, replicas: int, block: int) -> int | None:
        if not self.cache_share:
            return None
        working_set = sum(-(-len(p) // block) for p in self.prompts_of(0)[0][::self.g][:self.prompts])
        return int(working_set * self.cache_share / replicas)


WORKLOADS = (
    Workload("window", prompts=32, window=8, own_tokens=(64, 128)),
    Workload("groups", prompts=128, window=512, own_tokens=(96, 224)),
    Workload("pressure", prompts=96, window=128, own_tokens=(288, 416), epochs=2, cache_share=0.5),
    Workload("skew", prompts=128, window=512, own_tokens=(32, 736), log_uniform=True),
    Workload("rollover", prompts=128, window=256, own_tokens=(96, 224), version_every=16),
)


# -- processes --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_below_ephemeral() -> int:
    """A free port below the kernel's range for outgoing connections. vLLM binds its KV-event publisher only once its
    engine is up, tens of seconds after the port was chosen; meanwhile any of the clients' connections may take a
    port of that range (it happened: "Address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.SystemRandom().randrange(low // 2, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


class Process:
    """A child in its own process group (vLLM's engine is a grandchild), its output in a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.popen = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        self.popen.wait()


async def wait_ready(http: aiohttp.ClientSession, url: str, process: Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise SystemExit(f"{process.log.name} exited with {process.popen.returncode}; its log ends:\n"
                             f"{process.log.read_text()[-3000:]}")
        try:
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=3)) as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:g} s; {process.log} ends:\n"
                     f"{process.log.read_text()[-3000:]}")


@dataclass
class Fleet:
    """R replicas started from the plan's own vLLM command, each publishing its KV events over ZMQ."""

    urls: list[str]
    events: list[str]                  # ZMQ endpoint of each replica's KV events
    processes: list[Process]
    model: str                         # the served model name
    block: int
    work: Path
    proxy_argv: list[str]
    proxy_env: dict[str, str]

    def stop(self) -> None:
        for p in self.processes:
            p.stop()


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports: the plan gives replica i the port of replica 0 plus i."""
    while True:
        first, sockets = free_port(), []
        try:
            for port in range(first, first + count):
                sockets.append(socket.create_server(("127.0.0.1", port)))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()


async def start_fleet(http: aiohttp.ClientSession, replicas: int, cache_blocks: int | None, work: Path) -> Fleet:
    composed = compose(["recipe=tiny-cpu-async-lora", f"model.tiny.max_position_embeddings={CONTEXT}",
                        f"vllm.max_model_len={CONTEXT}", f"placement.async_lora.replicas={replicas}",
                        f"cluster.gpus_per_node={replicas + 1}", f"vllm.port={free_ports(replicas)}",
                        f"placement.async_lora.proxy.port={free_port()}"])
    plan = build_plan(composed)
    if not (work / "model").exists():
        for step in plan.prepare:
            subprocess.run(step.argv, cwd=work, check=True, env=child_environment({}), stdout=subprocess.DEVNULL)
    specs = [p for p in plan.processes if p.role == Role.VLLM]
    proxy = next(p for p in plan.processes if p.role == Role.PROXY)
    urls, events, processes = [], [], []
    for spec in specs:
        # vLLM binds its publisher only to a wildcard address (tcp://*:PORT); vllm-router's kv_aware takes TCP only.
        events_port = free_port_below_ephemeral()
        # No chunked prefill: vLLM's CPU build crashes when it chunks the prefill of a seeded request ("CPU
        # Generator does not use offset"), and TRL seeds every request.
        argv = [*spec.argv, "--no-enable-chunked-prefill",
                "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                  "endpoint": f"tcp://*:{events_port}", "topic": ""})]
        if cache_blocks is not None:
            argv += ["--num-gpu-blocks-override", str(cache_blocks)]
        processes.append(Process(argv, child_environment(spec.env), work / f"{spec.name}.log", work))
        urls.append(f"http://127.0.0.1:{spec.port}")
        events.append(f"tcp://127.0.0.1:{events_port}")
    block = int(specs[0].argv[specs[0].argv.index("--block-size") + 1])
    model = specs[0].argv[specs[0].argv.index("--served-model-name") + 1]
    fleet = Fleet(urls, events, processes, model, block, work, list(proxy.argv), child_environment(proxy.env))
    try:
        for url, process in zip(urls, processes, strict=True):
            await wait_ready(http, f"{url}/health", process, 900)
        for url in urls:  # each engine's first requests compile its sampler once: not part of any run
            await asyncio.gather(*(generate(http, url, fleet.model, list(range(4, 4 + 40 + k))) for k in range(4)))
    except BaseException:
        fleet.stop()
        raise
    return fleet


class Router:
    """Where a policy's requests go: the proxy or vllm-router in front of the fleet, or one replica directly."""

    def __init__(self, policy: str, fleet: Fleet, log: Path) -> None:
        self.policy, self.fleet, self.process = policy, fleet, None
        if policy == ONE:
            self.url = fleet.urls[0]
            return
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if policy == PROXY:
            argv = [a for a in fleet.proxy_argv]
            argv[argv.index("--port") + 1] = str(port)
            head = argv[:argv.index("--replica")]
            tail = [a for a in argv[argv.index("--block-size"):]]
            argv = [*head, *(x for url in fleet.urls for x in ("--replica", url)), *tail]
            self.process = Process(argv, fleet.proxy_env, log, fleet.work)
        else:
            argv = [str(Path(sys.executable).parent / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                    "--policy", policy, "--worker-urls", *fleet.urls, "--log-level", LOG_LEVEL]
            if policy == "kv_aware":
                argv += [*(x for url, ep in zip(fleet.urls, fleet.events, strict=True)
                           for x in ("--kv-event-source", f"{url}={ep}")),
                         "--kv-event-block-size", str(fleet.block), "--kv-event-model", fleet.model]
            self.process = Process(argv, dict(os.environ), log, fleet.work)

    async def start(self, http: aiohttp.ClientSession) -> None:
        if self.process is not None:
            await wait_ready(http, f"{self.url}/health", self.process, 120)

    async def load(self, http: aiohttp.ClientSession, name: str, path: Path) -> None:
        """What TRL's trainer does when it publishes a version: through the proxy, which broadcasts it; directly
        on every replica for the others (vllm-router does not broadcast adapter loads)."""
        await self._everywhere(http, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    async def unload(self, http: aiohttp.ClientSession, name: str) -> None:
        await self._everywhere(http, "/v1/unload_lora_adapter", {"lora_name": name})

    async def _everywhere(self, http: aiohttp.ClientSession, path: str, body: dict) -> None:
        for base in [self.url] if self.policy == PROXY else self.fleet.urls:
            await post_ok(http, base + path, body)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


async def warm_lora(http: aiohttp.ClientSession, fleet: Fleet, adapter: Path) -> None:
    """Each engine's first requests with an adapter are slow once (seconds on this CPU, longer under load): that is
    not part of any run, or it would fall on whichever policy meets adapters first."""
    for url in fleet.urls:
        await post_ok(http, f"{url}/v1/load_lora_adapter", {"lora_name": "warm-up", "lora_path": str(adapter)})
        await asyncio.gather(*(generate(http, url, "warm-up", list(range(4, 4 + 40 + k))) for k in range(4)))
        await post_ok(http, f"{url}/v1/unload_lora_adapter", {"lora_name": "warm-up"})


async def post_ok(http: aiohttp.ClientSession, url: str, body: dict | None = None) -> None:
    async with http.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} {body or ''} answered {r.status}: {await r.text()}")


# -- one run ----------------------------------------------------------------------------------------------------


async def generate(http: aiohttp.ClientSession, base: str, model: str, prompt: list[int]) -> float:
    payload = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 1.0, "n": 1,
               "return_token_ids": True, "logprobs": 0, "seed": random.getrandbits(63)}
    started = time.perf_counter()
    async with http.post(f"{base}/v1/completions", json=payload) as r:
        body = await r.read()
        if r.status != 200:
            raise RuntimeError(f"{base} answered {r.status}: {body[:300]!r}")
    return time.perf_counter() - started


async def engine_counters(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
             "vllm:request_success_total")
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass(frozen=True)
class Run:
    prefilled: float
    hit_rate: float
    request_imbalance: float
    token_imbalance: float
    makespan_s: float
    p50_s: float
    p99_s: float
    affinity: float = math.nan         # the proxy's own account: share of requests routed by prefix (group or affinity)


def _imbalance(values: list[float]) -> float:
    return max(values) / (sum(values) / len(values)) if sum(values) else math.nan


async def run_once(http: aiohttp.ClientSession, fleet: Fleet, router: Router, workload: Workload, seed: int,
                   adapters: list[Path]) -> Run:
    for url in fleet.urls:  # every run starts from empty caches
        await post_ok(http, f"{url}/reset_prefix_cache")
    prompts, versions = workload.prompts_of(seed)
    names = {v: f"s{seed}-{v}" for v in dict.fromkeys(versions) if v}
    before = [await engine_counters(http, u) for u in fleet.urls]
    stats_before = await proxy_stats(http, router)
    slots, latencies, loaded = asyncio.Semaphore(workload.window), [], []

    async def one(prompt: list[int], model: str) -> None:
        try:
            latencies.append(await generate(http, router.url, model, prompt))
        finally:
            slots.release()

    started = time.perf_counter()
    tasks = []
    for prompt, version in zip(prompts, versions, strict=True):
        if version and names[version] not in loaded:  # the trainer publishes a version; 3 stay servable
            await router.load(http, names[version], adapters[len(loaded)])
            loaded.append(names[version])
            if len(loaded) > 3:
                await router.unload(http, loaded[-4])
        await slots.acquire()
        tasks.append(asyncio.create_task(one(prompt, names[version] if version else fleet.model)))
    await asyncio.gather(*tasks)
    makespan = time.perf_counter() - started
    for name in loaded[-3:]:
        await router.unload(http, name)

    after = [await engine_counters(http, u) for u in fleet.urls]
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    latencies.sort()
    stats = await proxy_stats(http, router)
    affinity = math.nan
    if stats:
        routed = stats["requests"]["routed"] - stats_before["requests"]["routed"]
        by_prefix = [stats["requests"][k] - stats_before["requests"][k] for k in ("group", "affinity")]
        affinity = sum(by_prefix) / routed
    return Run(prefilled=queries - hits, hit_rate=hits / queries,
               request_imbalance=_imbalance([d["vllm:request_success_total"] for d in delta]),
               token_imbalance=_imbalance([d["vllm:prompt_tokens_total"] for d in delta]), makespan_s=makespan,
               p50_s=latencies[len(latencies) // 2], p99_s=latencies[min(len(latencies) - 1,
                                                                         int(0.99 * len(latencies)))],
               affinity=affinity)


async def proxy_stats(http: aiohttp.ClientSession, router: Router) -> dict | None:
    if router.policy != PROXY:
        return None
    async with http.get(f"{router.url}/proxy/stats") as r:
        return await r.json()


def median(runs: list[Run]) -> Run:
    return Run(**{f.name: statistics.median(getattr(r, f.name) for r in runs) for f in fields(Run)})


def make_adapters(model_dir: Path, out: Path, count: int) -> list[Path]:
    """LoRA adapters for the tiny model as TRL's trainer saves them (PEFT), one directory per version."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    first = out / "adapter-0"
    model.save_pretrained(first)
    paths = [first]
    for k in range(1, count):
        paths.append(out / f"adapter-{k}")
        shutil.copytree(first, paths[-1])
    return paths


# -- the matrix -------------------------------------------------------------------------------------------------


async def measure(replica_counts: list[int], workloads: list[Workload], policies: list[str], repeats: range,
                  work: Path, record: Path | None) -> dict[tuple[str, int, str], list[Run]]:
    results: dict[tuple[str, int, str], list[Run]] = {}
    # Idle connections closed before uvicorn (vllm serve) closes them (5 s), or a reused one may fail mid-request.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as http:
        adapters: list[Path] = []
        for replicas in replica_counts:
            caches = {w.name: w.cache_blocks(replicas, 32) for w in workloads}
            for cache in dict.fromkeys(caches.values()):  # one fleet per KV-cache size
                fleet_started = time.perf_counter()
                fleet = await start_fleet(http, replicas, cache, work)
                print(f"{replicas} replicas up in {time.perf_counter() - fleet_started:.0f} s"
                      + (f", KV cache {cache} blocks each" if cache else ""), flush=True)
                try:
                    served = [w for w in workloads if caches[w.name] == cache]
                    if any(w.version_every for w in served):
                        if not adapters:
                            adapters = make_adapters(work / "model", work, max(
                                -(-w.prompts * w.epochs // w.version_every) for w in workloads if w.version_every))
                        await warm_lora(http, fleet, adapters[0])
                    for workload in served:
                        for repeat in repeats:
                            for k, policy in enumerate(policies):
                                seed = zlib.crc32(f"{replicas}/{workload.name}/{repeat}/{k}".encode())
                                run = await run_policy(http, fleet, policy, workload, seed, adapters)
                                results.setdefault((workload.name, replicas, policy), []).append(run)
                                if record is not None:
                                    with record.open("a") as out:
                                        out.write(json.dumps({"workload": workload.name, "replicas": replicas,
                                                              "policy": policy, **asdict(run)}) + "\n")
                                print(f"  {workload.name:9} {replicas} {policy:20} repeat {repeat + 1}: "
                                      f"{row(run)}", flush=True)
                finally:
                    fleet.stop()
    return results


async def run_policy(http: aiohttp.ClientSession, fleet: Fleet, policy: str, workload: Workload, seed: int,
                     adapters: list[Path]) -> Run:
    router = Router(policy, fleet, fleet.work / f"router-{policy.replace(' ', '-')}.log")
    try:
        await router.start(http)
        return await run_once(http, fleet, router, workload, seed, adapters)
    finally:
        router.stop()


def row(r: Run) -> str:
    affinity = "" if math.isnan(r.affinity) else f"{r.affinity:9.1%}"
    return (f"{r.prefilled:10,.0f} {r.hit_rate:8.1%} {r.request_imbalance:8.3f} {r.token_imbalance:8.3f} "
            f"{r.makespan_s:8.1f}s {r.p50_s:7.2f}s {r.p99_s:7.2f}s {affinity}")


def report(runs: dict[tuple[str, int, str], list[Run]], markdown: bool = False) -> None:
    results = {key: median(r) for key, r in runs.items()}
    workloads = [w for w in WORKLOADS if any(key[0] == w.name for key in runs)]
    replica_counts = sorted({key[1] for key in runs})
    policies = [p for p in (PROXY, *ROUTER_POLICIES, ONE) if any(key[2] == p for key in runs)]
    repeats = "/".join(str(n) for n in sorted({len(r) for r in runs.values()}))
    print(f"\nmedian of {repeats} run(s); prefilled = the engines' prefix-cache queries minus hits (prompt tokens); "
          f"imbalance = max/mean per replica")
    if markdown:
        print("| workload | R | policy | prefilled | hit rate | imbalance: requests | prompt tokens | makespan | "
              "p50 | p99 |\n|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'workload':9} {'R':>2} {'policy':20} {'prefilled':>10} {'hit rate':>8} {'req imb':>8} "
              f"{'tok imb':>8} {'makespan':>9} {'p50':>8} {'p99':>8} {'by prefix':>9}")
    checks = []
    for w in workloads:
        for replicas in replica_counts:
            for policy in policies:
                r = results.get((w.name, replicas, policy))
                if r is not None and markdown:
                    name = f"**{policy}**" if policy == PROXY else policy
                    print(f"| {w.name} | {replicas} | {name} | {r.prefilled:,.0f} | {r.hit_rate:.1%} | "
                          f"{r.request_imbalance:.3f} | {r.token_imbalance:.3f} | {r.makespan_s:.1f} s | "
                          f"{r.p50_s:.2f} s | {r.p99_s:.2f} s |")
                elif r is not None:
                    print(f"{w.name:9} {replicas:>2} {policy:20} {row(r)}")
            ours = results.get((w.name, replicas, PROXY))
            theirs = {p: results[w.name, replicas, p] for p in policies
                      if p not in (PROXY, ONE) and (w.name, replicas, p) in results}
            if ours is None or not theirs:
                continue
            best = min(theirs, key=lambda p: theirs[p].prefilled)
            ratio = ours.prefilled / theirs[best].prefilled
            ok = ratio <= TARGET_PREFILL_RATIO and ours.token_imbalance <= TARGET_TOKEN_IMBALANCE
            checks.append(f"  {'PASS' if ok else 'MISS'}  {w.name:9} R={replicas}: prefills {ratio:.3f}x "
                          f"vllm-router's best ({best}), limit {TARGET_PREFILL_RATIO}; prompt-token imbalance "
                          f"{ours.token_imbalance:.3f}, limit {TARGET_TOKEN_IMBALANCE}")
    print("targets (the proxy against every vllm-router policy)")
    print("\n".join(checks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n  python benchmarks/proxy_vllm.py            # a few minutes\n"
                                            "  python benchmarks/proxy_vllm.py --full --record runs.jsonl\n"
                                            "  python benchmarks/proxy_vllm.py --report runs.jsonl")
    parser.add_argument("--full", action="store_true",
                        help="every workload and policy on 2 and 4 replicas, 3 repeats (the table in docs/proxy.md)")
    parser.add_argument("--replicas", type=int, nargs="+", help="replica counts (default 2; --full: 2 4)")
    parser.add_argument("--repeats", type=int, help="runs per cell, the median reported (default 1; --full: 3)")
    parser.add_argument("--workloads", nargs="+", choices=[w.name for w in WORKLOADS],
                        help=f"default {' '.join(DEFAULT_WORKLOADS)}; --full: all")
    parser.add_argument("--policies", nargs="+", choices=[PROXY, *ROUTER_POLICIES, ONE],
                        help=f"default {', '.join(DEFAULT_POLICIES)}; --full: all")
    parser.add_argument("--first-repeat", type=int, default=1, metavar="N",
                        help="number the repeats from N: each repeat's prompts follow from its number, so a matrix "
                             "recorded in pieces (--record) takes N past the repeats already recorded")
    parser.add_argument("--record", type=Path, help="append every run's numbers to this file (JSON lines)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="FILE",
                        help="print the table of recorded runs (from --record) and run nothing")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/proxy.md's)")
    parser.add_argument("--keep-logs", action="store_true", help="keep every process's log after the run")
    args = parser.parse_args(argv)
    if args.first_repeat < 1:
        parser.error(f"--first-repeat {args.first_repeat}: repeats are numbered from 1")
    if args.report:
        runs: dict[tuple[str, int, str], list[Run]] = {}
        for path in args.report:
            for line in path.read_text().splitlines():
                row = json.loads(line)
                key = (row.pop("workload"), row.pop("replicas"), row.pop("policy"))
                runs.setdefault(key, []).append(Run(**row))
        report(runs, args.markdown)
        return 0
    replica_counts = args.replicas or ([2, 4] if args.full else [2])
    repeats = args.repeats or (3 if args.full else 1)
    names = args.workloads or ([w.name for w in WORKLOADS] if args.full else DEFAULT_WORKLOADS)
    workloads = [w for w in WORKLOADS if w.name in names]
    policies = args.policies or ([PROXY, *ROUTER_POLICIES, ONE] if args.full else DEFAULT_POLICIES)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    work = Path(tempfile.mkdtemp(prefix="grpo-proxy-vllm-"))
    print(f"logs in {work}" + ("" if args.keep_logs else " (removed after a run that completes)"), flush=True)
    first = args.first_repeat - 1
    runs = asyncio.run(measure(replica_counts, workloads, policies, range(first, first + repeats), work, args.record))
    if not args.keep_logs:
        shutil.rmtree(work)
    report(runs, args.markdown)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
