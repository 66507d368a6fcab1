"""Every vLLM server of a plan requires the run's key (issue 27, 17): `vllm serve` opens dev-mode routes for TRL
(/collective_rpc, /pause, /sleep, the weight updates) that vLLM's own --api-key leaves open. The key goes by name:
the plan holds only GRPO_VLLM_API_KEY, the launch takes the user's value or makes one, and passes it by environment
only; the supervisor's probes, the proxy and the trainer send it. (A real vLLM engine refusing calls without it:
test_proxy_vllm.)"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from conftest import free_port, free_ports, plan_json
from rich.console import Console
from supervised import STANDINS, with_processes

from grpo_launch.cli import main
from grpo_launch.compose import compose
from grpo_launch.contracts.plan import Plan
from grpo_launch.launch.node import prepare_node, run_nodes
from grpo_launch.materialize import materialize
from grpo_launch.plan import build_plan

KEY = "GRPO_VLLM_API_KEY"
GUARD = "grpo_launch.contracts.vllm_guard.ReplicaKeyGuard"
MARKER = "marker-replica-key-4b9d"
MULTI_NODE = {"server, vLLM on its own node": ("recipe=qwen72b-server",),
              "async-lora, replicas on their own node": ("recipe=qwen1.5b-async-lora", "cluster.nodes=2",
                                                         "placement.async_lora.replicas=2",
                                                         "placement.trainer_nodes=1"),
              "one CPU machine": ("recipe=tiny-cpu-async-lora",), "a CPU server": ("recipe=tiny-cpu-server",)}

# What the trainer does with its server, in a few lines: without the key the server refuses it; with it, it answers.
STUB_TRAINER = """
import os, sys, urllib.error, urllib.request
url, key = sys.argv[1], os.environ["GRPO_VLLM_API_KEY"]
def status(headers):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=b"", headers=headers), timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
print("key", key)
sys.exit(0 if status({}) == 401 and status({"Authorization": "Bearer " + key}) == 200 else 3)
"""


def test_every_vllm_server_requires_the_key_and_the_plan_names_it_only(monkeypatch, capsys):
    monkeypatch.setenv(KEY, MARKER)
    for what, overrides in MULTI_NODE.items():
        plan = plan_json(*overrides)
        servers = [p for p in plan["processes"] if p["role"] == "vllm"]
        assert servers, what
        for p in servers:  # vLLM runs the guard, reads the key by name, and the probes send it
            assert p["argv"][p["argv"].index("--middleware") + 1] == GUARD, what
            assert KEY in p["pass_env"] and p["probe_key_env"] == KEY, what
        for p in plan["processes"]:
            if p["role"] == "proxy":  # the proxy sends it to the replicas
                assert p["argv"][p["argv"].index("--upstream-api-key-env") + 1] == KEY, what
        if plan["vllm"]["server"] is not None:  # TRL's server mode: the trainer sends it
            assert plan["trainer_inputs"]["server_key_env"] == KEY, what
        assert not [w for w in plan["warnings"] if "dev mode" in w], what  # guarded: nothing left to warn about
        assert MARKER not in json.dumps(plan), what
    assert main(["plan", *MULTI_NODE["server, vLLM on its own node"]]) == 0
    out = capsys.readouterr().out
    assert f"every vLLM server requires {KEY} on every route but /health" in out and MARKER not in out


def test_a_run_makes_the_key_its_probes_and_processes_send_it_and_no_file_holds_it(tmp_path, monkeypatch):
    """One machine runs every node: the launch makes a key (none is exported). The server (a stand-in behind the
    real guard) refuses the trainer without it and answers with it; the supervisor's probes and its last metrics
    fetch send it; what the trainer prints of it is masked; and no file of the run directory holds it."""
    monkeypatch.setenv(KEY, "")
    monkeypatch.delenv(KEY)  # restored afterwards, whatever the launch put there
    composed = compose(["recipe=tiny-cpu-server", *free_ports()])
    run_dir = materialize(composed, build_plan(composed), [], run_dir=tmp_path / "run")
    port = free_port()
    planned = with_processes(json.loads((run_dir / "plan.json").read_text()), run_dir, {
        "vllm": ([sys.executable, str(STANDINS / "guarded_server.py"), "--port", str(port)], port),
        "trainer": ([sys.executable, "-c", STUB_TRAINER, f"http://127.0.0.1:{port}/pause"], None)},
        vllm={"metrics_url": f"http://127.0.0.1:{port}/metrics"})
    planned["prepare"] = []
    out = io.StringIO()
    console = Console(file=out, width=200)
    plan = prepare_node(Plan.from_json(planned), [0], console)
    result = run_nodes(plan, run_dir, [0], grace_s=3, console=console)
    assert result.code == 0, out.getvalue()
    assert f"every vLLM server requires the key in {KEY}, made for this run" in out.getvalue()
    key = os.environ[KEY]
    assert len(key) >= 40
    assert (run_dir / "logs" / "vllm.metrics").read_text().startswith("vllm:")  # fetched with the key at the end
    assert "key ***" in (run_dir / "logs" / "trainer.log").read_text()
    assert [p for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()] == []
    assert key not in out.getvalue()


def test_the_users_key_is_taken_and_a_node_of_several_makes_none(tmp_path, monkeypatch):
    """Every node must hold the same key: a node that runs part of a plan and was given none makes none, and says
    what that leaves open; one given the user's uses it."""
    from grpo_launch.launch.replica_key import provide_replica_key

    plan = Plan.from_json(plan_json(*MULTI_NODE["server, vLLM on its own node"]))
    server_node = next(p.node for p in plan.processes if p.role == "vllm")
    environ: dict[str, str] = {}
    note = provide_replica_key(plan, [server_node], environ)
    assert environ == {} and f"{KEY} is not set here" in note and "vllm answer anyone" in note
    note = provide_replica_key(plan, [0], environ)
    assert environ == {} and "trainer-node0 send the vLLM servers no key" in note
    assert "made for this run" in provide_replica_key(plan, range(plan.nodes), environ) and environ[KEY]
    environ = {KEY: MARKER}
    assert "taken from your environment" in provide_replica_key(plan, [server_node], environ)
    assert environ == {KEY: MARKER}
    assert provide_replica_key(Plan.from_json(plan_json("recipe=tiny-cpu")), [0], environ) is None  # no vLLM server


def test_the_replicas_key_is_not_a_proxy_setting():
    """The proxy sends the replicas the run's key: a key of its own for them could only disagree."""
    assert main(["plan", "recipe=tiny-cpu-async-lora", "placement.async_lora.proxy.upstream_api_key_env=OTHER"]) == 2


def test_the_guard_reads_bearer_and_basic_and_leaves_health_open(monkeypatch):
    import asyncio
    import base64

    from grpo_launch.contracts.vllm_guard import ReplicaKeyGuard

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def status(guard, path: str, authorization: str | None, method: str = "POST") -> int:
        sent = []

        async def send(message):
            sent.append(message)
        headers = [(b"authorization", authorization.encode())] if authorization else []
        await guard({"type": "http", "path": path, "method": method, "headers": headers}, None, send)
        return sent[0]["status"]

    monkeypatch.setenv(KEY, MARKER)
    guard = ReplicaKeyGuard(app)
    basic = "Basic " + base64.b64encode(f"grpo:{MARKER}".encode()).decode()
    cases = {("/collective_rpc", None): 401, ("/pause", f"Bearer {MARKER}x"): 401, ("/pause", MARKER): 401,
             ("/v1/load_lora_adapter", f"Bearer {MARKER}"): 200, ("/sleep", basic): 200, ("/health", None): 200}
    for (path, authorization), expected in cases.items():
        assert asyncio.run(status(guard, path, authorization)) == expected, (path, authorization)
    monkeypatch.delenv(KEY)
    assert asyncio.run(status(ReplicaKeyGuard(app), "/pause", None)) == 200  # given no key: vLLM's own behaviour


def test_launch_sh_makes_a_key_on_one_machine_and_asks_for_one_on_several():
    one = plan_json("recipe=tiny-cpu-server")["files"]["launch.sh"]
    lines = one.splitlines()
    made = lines[lines.index(f"export {KEY}") - 1:lines.index(f"export {KEY}") + 1]
    assert made[0].startswith(f'{KEY}="${{{KEY}:-$(python3 -c')
    env = {k: v for k, v in os.environ.items() if k != KEY}
    script = "\n".join([*made, f"printenv {KEY}"])
    for given, check in ((None, lambda key: len(key) >= 40), (MARKER, lambda key: key == MARKER)):
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                              env={**env, **({KEY: given} if given else {})})
        assert done.returncode == 0 and check(done.stdout.strip()), done.stderr
    several = plan_json(*MULTI_NODE["server, vLLM on its own node"])["files"]["launch.sh"]
    assert f'if [ -z "${{{KEY}:-}}" ]; then' in several and "the same key on every node" in several
