"""The proxy's counters, as JSON (/proxy/stats) and Prometheus text (/metrics). No client library: a few lines do."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from grpo_launch.proxy.router import KINDS, Decision

# Seconds. Generation takes 0.1 s to minutes; the low buckets show routing-only answers (stats, errors).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile (None: no data; inf: above the last bucket)."""
        n = self.count
        if not n:
            return None
        seen = 0
        for bound, c in zip((*LATENCY_BUCKETS, float("inf")), self.counts, strict=True):
            seen += c
            if seen >= q * n:
                return bound
        return float("inf")


@dataclass
class ProxyStats:
    decisions: Counter = field(default_factory=Counter)        # (route, kind) -> requests
    prompt_blocks: int = 0
    matched_blocks: int = 0                                    # blocks the chosen replica was last seen holding
    untokenized: int = 0                                       # text prompts routed by load: no tokenizer
    retries: int = 0
    errors: Counter = field(default_factory=Counter)           # kind -> upstream failures answered 502/503/504
    broadcasts: Counter = field(default_factory=Counter)       # (path, outcome) -> calls
    latency: dict[str, Histogram] = field(default_factory=dict)

    def routed(self, route: str, decision: Decision) -> None:
        self.decisions[route, decision.kind] += 1
        self.prompt_blocks += decision.prompt_blocks
        self.matched_blocks += decision.matched_blocks

    def observe(self, route: str, seconds: float) -> None:
        histogram = self.latency.get(route)
        if histogram is None:
            histogram = self.latency[route] = Histogram()
        histogram.observe(seconds)

    def to_json(self, replicas: list[dict[str, Any]], *, block_size: int, tracked_blocks: int) -> dict[str, Any]:
        kinds = Counter()
        for (_, kind), n in self.decisions.items():
            kinds[kind] += n
        total = sum(kinds.values())
        broadcasts: dict[str, dict[str, int]] = {}
        for (path, outcome), n in sorted(self.broadcasts.items()):
            broadcasts.setdefault(path, {})[outcome] = n
        return {
            "requests": {"routed": total, **{k: kinds[k] for k in KINDS},
                         "untokenized": self.untokenized, "retries": self.retries},
            "rates": {k: round(kinds[k] / total, 4) if total else None for k in KINDS},
            "prefix": {"block_size": block_size, "tracked_blocks": tracked_blocks, "prompt_blocks": self.prompt_blocks,
                       "matched_blocks": self.matched_blocks,
                       "matched_fraction": round(self.matched_blocks / self.prompt_blocks, 4)
                       if self.prompt_blocks else None},
            "errors": dict(self.errors),
            "broadcasts": broadcasts,
            "latency_s": {route: {"count": h.count, "mean": round(h.total / h.count, 6) if h.count else None,
                                  "p50_le": h.quantile(0.5), "p99_le": h.quantile(0.99)}
                          for route, h in sorted(self.latency.items())},
            "replicas": replicas,
        }

    def to_prometheus(self, replicas: list[dict[str, Any]], tracked_blocks: int) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
            lines.append(f"# HELP grpo_proxy_{name} {help_text}")
            lines.append(f"# TYPE grpo_proxy_{name} {kind}")
            for labels, value in samples:
                lines.append(f"grpo_proxy_{name}{_labels(labels)} {_number(value)}")

        metric("requests_total", "counter", "Routed generation requests by route and decision.",
               [({"route": route, "decision": kind}, n) for (route, kind), n in sorted(self.decisions.items())])
        metric("prompt_blocks_total", "counter", "Full prompt blocks routed.", [({}, self.prompt_blocks)])
        metric("matched_blocks_total", "counter", "Prompt blocks the chosen replica was last seen holding.",
               [({}, self.matched_blocks)])
        metric("untokenized_total", "counter", "Text prompts routed by load only (no tokenizer).",
               [({}, self.untokenized)])
        metric("retries_total", "counter", "Requests retried on another replica after a connection failure.",
               [({}, self.retries)])
        metric("errors_total", "counter", "Requests answered with a proxy error, by kind.",
               [({"kind": k}, n) for k, n in sorted(self.errors.items())])
        metric("broadcasts_total", "counter", "Broadcast calls by path and outcome.",
               [({"path": p, "outcome": o}, n) for (p, o), n in sorted(self.broadcasts.items())])
        metric("tracked_blocks", "gauge", "Prefix blocks in the routing table.", [({}, tracked_blocks)])
        for name, key, kind, help_text in (
                ("replica_healthy", "healthy", "gauge", "1 while the replica is in routing."),
                ("replica_inflight", "inflight", "gauge", "Requests in flight on the replica."),
                ("replica_requests_total", "requests", "counter", "Requests sent to the replica.")):
            metric(name, kind, help_text, [({"replica": r["url"]}, float(r[key])) for r in replicas])
        lines.append("# HELP grpo_proxy_request_seconds Time from request to the end of the answer.")
        lines.append("# TYPE grpo_proxy_request_seconds histogram")
        for route, h in sorted(self.latency.items()):
            cumulative = 0
            for bound, c in zip((*LATENCY_BUCKETS, float("inf")), h.counts, strict=True):
                cumulative += c
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f"grpo_proxy_request_seconds_bucket{_labels({'route': route, 'le': le})} {cumulative}")
            lines.append(f"grpo_proxy_request_seconds_sum{_labels({'route': route})} {_number(h.total)}")
            lines.append(f"grpo_proxy_request_seconds_count{_labels({'route': route})} {h.count}")
        return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
