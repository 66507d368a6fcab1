"""launch.sh: the plan as a shell script that replays every process by hand, without grpo-launch."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_launch.contracts.plan import PrepareStep, ProcessSpec, Role
from grpo_launch.contracts.shell import shell_line, shell_word

_HEADER = """#!/usr/bin/env bash
# Replays run '{recipe}' (placement {placement}) without grpo-launch. It works in its own directory, the run
# directory. On a cluster, start it on every node with NODE_RANK set to that node's index (and GRPO_HOST_K set to
# node K's address where the commands below read it); one machine needs nothing. Secrets are read from your
# environment by name and never written here: {secrets}.
# Every value below is quoted as one word: single quotes keep a $ or a ` in a value as text, as intended.
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")"
NODE_RANK="${{NODE_RANK:-0}}"
mkdir -p logs
pids=()
stop_all() {{ for pid in "${{pids[@]}}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }}
trap stop_all EXIT
trap 'exit 130' INT TERM
wait_ready() {{  # URL TIMEOUT_S [KEY_VARIABLE]: poll until the URL answers 200, sending that variable's key
  python3 - "$1" "$2" "${{3:-}}" <<'PY'
import os, sys, time, urllib.request
url, deadline, key = sys.argv[1], time.time() + float(sys.argv[2]), sys.argv[3]
if key and not os.environ.get(key):
    sys.exit(f"{{key}} is not set: {{url}} answers only with its key")
request = urllib.request.Request(url, headers={{"Authorization": "Bearer " + os.environ[key]}} if key else {{}})
while time.time() < deadline:
    try:
        if urllib.request.urlopen(request, timeout=5).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(2)
sys.exit(f"{{url}} did not answer within {{sys.argv[2]}} s")
PY
}}
"""


def command_line(p: ProcessSpec) -> str:
    """The process as a shell command: its environment assignments (names are checked where they are declared:
    `contracts.knobs.ENV_NAME`), then its argv, every value quoted."""
    env = " ".join(f"{k}={shell_word(v)}" for k, v in p.env.items())
    return f"{env} {shell_line(p.argv)}".strip()


def launch_script(recipe: str, placement: str, prepare: Sequence[PrepareStep], processes: Sequence[ProcessSpec]) -> str:
    ready = {p.name: p for p in processes if p.ready_url}
    secrets = ", ".join(dict.fromkeys(name for p in processes for name in p.pass_env)) or "none"
    lines = [_HEADER.format(recipe=recipe, placement=placement, secrets=secrets)]
    for step in prepare:
        lines.append(f"# {step.name}: run once, before any process")
        lines.append(f"[ -e {shell_word(step.creates)} ] || {shell_line(step.argv)}")
    trainer_nodes = sorted({p.node for p in processes if p.role == Role.TRAINER})
    for p in processes:
        gpus = ",".join(map(str, p.gpus)) or "none"
        lines.append(f"# {p.name}: {p.role} on node {p.node}, GPUs {gpus}")
        for dep in p.depends_on:
            server = ready[dep]
            key = f" {server.probe_key_env}" if server.probe_key_env else ""
            lines.append(f"wait_ready {shell_word(server.ready_url)} {server.ready_timeout_s:g}{key}  # {dep}")
        lines.append(f'if [ "$NODE_RANK" = {p.node} ]; then')
        if p.start_delay_s:
            lines.append(f"  sleep {p.start_delay_s:g}")
        lines.append(f"  setsid {'env ' if p.env else ''}{command_line(p)} > logs/{p.name}.log 2>&1 &")
        lines.append('  trainer_pid=$!; pids+=("$trainer_pid")' if p.role == Role.TRAINER else '  pids+=("$!")')
        lines.append("fi")
    lines.append("# A trainer node ends with its trainer (and passes on its exit code); other nodes serve until "
                 "stopped.")
    nodes = "|".join(map(str, trainer_nodes))
    lines.append(f'case "$NODE_RANK" in {nodes}) wait "$trainer_pid" ;; *) wait ;; esac')
    return "\n".join(lines) + "\n"
