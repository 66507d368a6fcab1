"""launch.sh: the plan as a shell script that replays every process by hand, without `grpo run`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from grpo_launch.contracts.plan import Plan, ProcessSpec, Role
from grpo_launch.contracts.shell import shell_line, shell_word
from grpo_launch.contracts.vllm import REPLICA_KEY_BYTES, REPLICA_KEY_ENV
from grpo_launch.plan.schedulers.base import ANSWERS_PY, node_list

PACKAGE = "grpo_launch"  # the modules the commands run with `python -m`
PROGRAM = "grpo"         # grpo-launch's command (`grpo proxy`)
COMMENT_WIDTH = 118

_ABOUT = ("Replays run '{recipe}' (placement {placement}) by hand, without `grpo run`: it starts the processes below "
          "in order, and nothing supervises them. It needs what they run, installed where it runs: grpo-launch "
          "({entrypoints}), and {programs} on the PATH. It works in its own directory, the run directory. On a "
          "cluster, start it on every node ({nodes}) with NODE_RANK set to that node's index (and GRPO_HOST_K set to "
          "node K's address where the commands below read it); one machine needs nothing. Secrets are read from your "
          "environment by name and never written here: {secrets}.")
_HEADER = """#!/usr/bin/env bash
{about}
# Every value below is quoted as one word: single quotes keep a $ or a ` in a value as text, as intended.
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")"
NODE_RANK="${{NODE_RANK:-0}}"
case "$NODE_RANK" in
  {node_pattern}) ;;
  *) echo "launch.sh: NODE_RANK=$NODE_RANK is not a node of this run ({nodes})" >&2; exit 2 ;;
esac
mkdir -p logs
pids=()
stop_all() {{ for pid in "${{pids[@]}}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }}
trap stop_all EXIT
trap 'exit 130' INT TERM
wait_ready() {{  # URL TIMEOUT_S [KEY_VARIABLE]: poll until the URL answers 200, sending that variable's key
  python3 - "$1" "$2" "${{3:-}}" <<'PY'
import os, sys, time, urllib.request
{answers}url, deadline, key = sys.argv[1], time.time() + float(sys.argv[2]), sys.argv[3]
if key and not os.environ.get(key):
    sys.exit(f"{{key}} is not set: {{url}} answers only with its key")
headers = {{"Authorization": "Bearer " + os.environ[key]}} if key else {{}}
while time.time() < deadline:
    if answers(url, headers):
        sys.exit(0)
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


def _needs(argvs: Sequence[Sequence[str]]) -> tuple[str, str]:
    """What the commands run: grpo-launch's entrypoints (`python -m grpo_launch.trainer`, `grpo proxy`), and the
    programs on the PATH (python3 polls readiness)."""
    entrypoints = dict.fromkeys(f"{argv[0]} {argv[1]}" if argv[0] == PROGRAM else f"python -m {argv[i + 1]}"
                                for argv in argvs for i in range(len(argv) - 1)
                                if argv[0] == PROGRAM or (argv[i] == "-m" and argv[i + 1].startswith(PACKAGE)))
    programs = [*dict.fromkeys(argv[0] for argv in argvs if argv[0] != PROGRAM), "python3"]
    listed = ", ".join(programs[:-1]) + " and " + programs[-1] if len(programs) > 1 else programs[0]
    return ", ".join(f"`{e}`" for e in entrypoints), listed


def _replica_key(plan: Plan) -> list[str]:
    """Every vLLM server requires the run's key: on one machine, yours or one made for this replay; on several, the
    same on each, so it must be yours."""
    if not any(REPLICA_KEY_ENV in p.pass_env for p in plan.processes):
        return []
    if plan.nodes == 1:
        made = f"python3 -c 'import secrets; print(secrets.token_urlsafe({REPLICA_KEY_BYTES}))'"
        return [f"# Every vLLM server requires the key in {REPLICA_KEY_ENV}: yours if exported, else one made for "
                f"this replay.", f'{REPLICA_KEY_ENV}="${{{REPLICA_KEY_ENV}:-$({made})}}"', f"export {REPLICA_KEY_ENV}"]
    return [f"# Every vLLM server requires the key in {REPLICA_KEY_ENV}, the same on every node.",
            f'if [ -z "${{{REPLICA_KEY_ENV}:-}}" ]; then',
            f'  echo "launch.sh: export {REPLICA_KEY_ENV} first, the same key on every node" >&2; exit 2', "fi"]


def launch_script(plan: Plan) -> str:
    processes, prepare = plan.processes, plan.prepare
    ready = {p.name: p for p in processes if p.ready_url}
    secrets = ", ".join(dict.fromkeys(name for p in processes for name in p.pass_env)) or "none"
    nodes = sorted({p.node for p in processes})
    entrypoints, programs = _needs([*(s.argv for s in prepare), *(p.argv for p in processes)])
    about = _ABOUT.format(recipe=plan.recipe, placement=plan.placement, entrypoints=entrypoints, programs=programs,
                          nodes=node_list(nodes), secrets=secrets)
    lines = [_HEADER.format(about=textwrap.fill(about, COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# ",
                                                break_long_words=False, break_on_hyphens=False),
                            node_pattern="|".join(map(str, nodes)), nodes=node_list(nodes), answers=ANSWERS_PY)]
    lines += _replica_key(plan)
    for step in prepare:
        lines.append(f"# {step.name}: run once, before any process")
        lines.append(f"[ -e {shell_word(step.creates)} ] || {shell_line(step.argv)}")
    for p in processes:
        lines.append(f"# {p.name}: {p.role} on node {p.node}")
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
    nodes = "|".join(map(str, plan.trainer_nodes))
    lines.append(f'case "$NODE_RANK" in {nodes}) wait "$trainer_pid" ;; *) wait ;; esac')
    return "\n".join(lines) + "\n"
