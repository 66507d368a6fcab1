"""The proxy's settings, checked once before anything listens. Pure: reads no environment, opens no socket."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from grpo_launch.errors import UserError


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    replicas: tuple[str, ...]                   # base URLs, e.g. http://127.0.0.1:8000
    host: str = "127.0.0.1"
    port: int = 8080                            # 0: any free port (tests)
    block_size: int = 16                        # must equal the replicas' --block-size
    imbalance: int = 8                          # affinity yields once in-flight exceeds the minimum by more
    max_tracked_blocks: int = 500_000
    lora_load_timeout_s: float = 300.0          # how long a replica may not see a new adapter directory
    lora_retry_s: float = 2.0                   # between load attempts on a replica that cannot see it yet
    request_timeout_s: float = 600.0            # one upstream call, generation included
    connect_timeout_s: float = 5.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 5.0
    tokenizer: str | None = None                # local dir/file or hub id, for text prompts
    # Secret values: held in memory only, never in repr, logs or files.
    client_api_key: str | None = field(default=None, repr=False)
    upstream_api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise UserError("the proxy needs at least one replica", key="--replica",
                            hint="pass --replica http://127.0.0.1:8000 once per vLLM server")
        for url in self.replicas:
            check_replica_url(url)
        if len(set(self.replicas)) != len(self.replicas):
            raise UserError(f"a replica is listed twice: {list(self.replicas)}", key="--replica")
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port {self.port} is not a TCP port", key="--port")
        for name in ("block_size", "max_tracked_blocks"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1", key=f"--{name}")
        if self.imbalance < 0:
            raise UserError("--imbalance must be 0 or more", key="--imbalance")
        for name in ("lora_load_timeout_s", "lora_retry_s", "request_timeout_s", "connect_timeout_s",
                     "health_interval_s", "health_timeout_s"):
            if not getattr(self, name) > 0:
                raise UserError(f"--{name.replace('_', '-')} must be positive", key=f"--{name}")
        if self.tokenizer:
            check_tokenizer(self.tokenizer)


def check_replica_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise UserError(f"replica '{url}' is not a base URL like http://127.0.0.1:8000", key="--replica")
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
