"""`grpo proxy`: the KV-prefix routing proxy in front of vLLM replicas (async-lora starts it; so can you)."""

from __future__ import annotations

import os

import typer

from grpo_launch.cli.app import app
from grpo_launch.contracts.knobs import default_of, doc_of
from grpo_launch.contracts.vllm import REPLICA_KEY_ENV
from grpo_launch.errors import UserError
from grpo_launch.proxy.config import ProxyConfig

EXAMPLES = """
[bold]Examples[/]

  grpo proxy --replica http://127.0.0.1:8000 --replica http://127.0.0.1:8001 --tokenizer Qwen/Qwen2.5-Math-1.5B
  grpo proxy --port 9000 --replica http://10.0.0.5:8000 --replica http://10.0.0.6:8000 --imbalance 16
  PROXY_KEY=... grpo proxy --host 0.0.0.0 --api-key-env PROXY_KEY --replica http://127.0.0.1:8000
  curl -s 127.0.0.1:8080/proxy/stats | jq .requests      groups, affinity, spills, unmatched

Point TRL's vllm_server_base_url at the proxy; it sees one vLLM server of data-parallel size 1.
"""


def _flag(name: str, **kw):
    """A flag declared by ProxyConfig: its default and help come from there."""
    return typer.Option(default_of(ProxyConfig, name), help=doc_of(ProxyConfig, name), **kw)


@app.command(epilog=EXAMPLES)
def proxy(
    replica: list[str] = typer.Option(..., "--replica", metavar="URL",
                                      help="Base URL of a vLLM replica; repeat once per replica."),
    host: str = _flag("host"),
    port: int = _flag("port"),
    block_size: int = _flag("block_size"),
    imbalance: int = _flag("imbalance"),
    max_tracked_blocks: int = _flag("max_tracked_blocks"),
    lora_load_timeout_s: float = _flag("lora_load_timeout_s"),
    request_timeout_s: float = _flag("request_timeout_s"),
    health_interval_s: float = _flag("health_interval_s"),
    tokenizer: str | None = _flag("tokenizer", metavar="ID_OR_PATH"),
    api_key_env: str | None = typer.Option(None, metavar="NAME",
                                           help="Environment variable holding the key clients must send on "
                                                "every path ('Authorization: Bearer <key>', or HTTP Basic with the "
                                                "key as password, as in http://user:<key>@host:port); required "
                                                "when --host is not loopback."),
    upstream_api_key_env: str | None = typer.Option(None, metavar="NAME",
                                                    help="Environment variable holding the key sent to the "
                                                         "replicas (their --api-key, or the key in "
                                                         f"{REPLICA_KEY_ENV} a plan's replicas require); unset: "
                                                         "none is sent."),
) -> None:
    """Route generation to the replica holding the prompt's KV prefix; broadcast adapter loads, pause and resume."""
    config = ProxyConfig(replicas=tuple(replica), host=host, port=port, block_size=block_size, imbalance=imbalance,
                         max_tracked_blocks=max_tracked_blocks, lora_load_timeout_s=lora_load_timeout_s,
                         request_timeout_s=request_timeout_s, health_interval_s=health_interval_s,
                         tokenizer=tokenizer, client_api_key=_secret(api_key_env, "--api-key-env"),
                         # Unset is no key: on a node its scheduler gave none, the replicas take none (the launch
                         # says so); a replica that does want one answers 401, which the proxy's log shows.
                         upstream_api_key=os.environ.get(upstream_api_key_env or "") or None)
    try:
        from grpo_launch.proxy.main import run
    except ImportError as e:
        raise UserError(f"grpo proxy needs {e.name}, which is not installed",
                        hint="pip install 'grpo-launch[proxy]'") from e
    run(config)


def _secret(name: str | None, flag: str) -> str | None:
    """The value of the variable a flag names; a named but empty variable is a mistake, not 'no key'."""
    if name is None:
        return None
    value = os.environ.get(name)
    if not value:
        raise UserError(f"{flag} {name}: the environment variable {name} is not set", key=flag,
                        hint=f"export {name}=... in the proxy's environment (its value is never logged or written)")
    return value
