"""The proxy's settings, checked once before anything listens. Pure: reads no environment, opens no socket."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from grpo_launch.contracts.hosts import LOOPBACK
from grpo_launch.contracts.knobs import knob, violation
from grpo_launch.contracts.proxy import DEFAULT_PROXY_PORT, ProxyKnobs, flag, unguarded_exposure
from grpo_launch.contracts.vllm import DEFAULT_BLOCK_SIZE
from grpo_launch.errors import UserError


@dataclass(kw_only=True)
class ProxyConfig(ProxyKnobs):
    """The routing settings a recipe shares (`ProxyKnobs`), and what only a running proxy needs. `grpo proxy`'s
    flags take their defaults and help from these declarations."""

    replicas: tuple[str, ...]                   # base URLs, e.g. http://127.0.0.1:8000
    port: int = knob(DEFAULT_PROXY_PORT, "Port to listen on; 0 takes any free port.", ge=0, le=65535)
    block_size: int = knob(DEFAULT_BLOCK_SIZE, "Prefix block in tokens; must equal the replicas' --block-size.",
                           ge=1)
    lora_retry_s: float = knob(2.0, "Seconds between adapter load attempts on a replica that cannot see the "
                                    "adapter yet.", gt=0)
    request_timeout_s: float = knob(600.0, "Longest a replica may take to answer one request.", gt=0)
    connect_timeout_s: float = knob(5.0, "Longest a connection to a replica may take.", gt=0)
    health_interval_s: float = knob(2.0, "Seconds between /health probes of each replica.", gt=0)
    health_timeout_s: float = knob(5.0, "Longest one /health probe may take.", gt=0)
    tokenizer: str | None = knob(None, "Model id or local tokenizer path, to route text prompts by prefix "
                                       "(token-id prompts need none).")
    # Secret values: held in memory only, never in repr, logs or files.
    client_api_key: str | None = field(default=None, repr=False)
    upstream_api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise UserError("the proxy needs at least one replica", key="--replica",
                            hint=f"pass --replica http://{LOOPBACK}:8000 once per vLLM server")
        for url in self.replicas:
            check_replica_url(url)
        if len(set(self.replicas)) != len(self.replicas):
            raise UserError(f"a replica is listed twice: {list(self.replicas)}", key="--replica")
        for f in dataclasses.fields(self):
            problem = violation(getattr(self, f.name), f.metadata) if "doc" in f.metadata else None
            if problem:
                raise UserError(f"{flag(f.name)} {problem}", key=flag(f.name))
        if self.tokenizer:
            check_tokenizer(self.tokenizer)
        if problem := unguarded_exposure(self.host, keyed=bool(self.client_api_key)):
            raise UserError(f"--host {self.host}: {problem}", key="--host",
                            hint=f"add --api-key-env NAME (NAME holding the key every client must send), or keep "
                                 f"--host {LOOPBACK}")


def check_replica_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise UserError(f"replica '{url}' is not a base URL like http://{LOOPBACK}:8000", key="--replica")
    try:
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError as e:
        raise UserError(f"replica '{url}' has a bad port", key="--replica") from e


def check_tokenizer(source: str) -> None:
    """A local path must hold a tokenizer.json; anything that is not a local path is taken as a hub id."""
    path = Path(source).expanduser()
    looks_local = source.startswith(("/", "./", "../", "~")) or path.exists()
    if not looks_local:
        return
    if path.is_dir() and not (path / "tokenizer.json").is_file():
        raise UserError(f"--tokenizer {source}: no tokenizer.json in that directory", key="--tokenizer",
                        hint="point it at the model directory that holds tokenizer.json, or at the file")
    if not path.exists():
        raise UserError(f"--tokenizer {source}: no such file or directory", key="--tokenizer")


def tokenizer_file(source: str) -> Path | None:
    """The tokenizer.json a local source names, or None for a hub id."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path / "tokenizer.json"
    return path if path.is_file() else None
