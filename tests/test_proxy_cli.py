"""`grpo proxy` as the async-lora plan starts it: a real process, its flags, its mistakes, its secrets."""

import asyncio
import os
import re
import signal
import subprocess
import sys

import aiohttp
from conftest import grpo
from standins.sim_replica import SimReplica

CLIENT_KEY, UPSTREAM_KEY = "cli-client-secret-91", "cli-upstream-secret-42"


def test_help_shows_examples():
    result = grpo("proxy", "--help")
    assert result.returncode == 0
    assert "--replica" in result.stdout and "Examples" in result.stdout


def test_mistakes_are_user_errors_without_traceback():
    for args, words in (
            (["--replica", "http://127.0.0.1:8000", "--api-key-env", "GRPO_TEST_UNSET_KEY"], "is not set"),
            (["--replica", "localhost:8000"], "not a base URL"),
            (["--replica", "http://127.0.0.1:8000", "--block-size", "0"], "--block-size must be >= 1, got 0"),
            (["--replica", "http://127.0.0.1:8000", "--tokenizer", "./no/such/dir"], "no such file")):
        result = grpo("proxy", *args, env={"GRPO_TEST_UNSET_KEY": ""})
        assert result.returncode == 2, args
        assert words in result.stderr and "Traceback" not in result.stderr


def test_the_planned_command_serves_and_keeps_secrets_out_of_output(tmp_path):
    async def scenario():
        sims = [SimReplica(f"r{i}") for i in range(2)]
        for s in sims:
            await s.start()
        argv = ["proxy", "--host", "127.0.0.1", "--port", "0", "--block-size", "16", "--imbalance", "8",
                "--max-tracked-blocks", "500000", "--lora-load-timeout-s", "300.0", "--tokenizer", "sim/base",
                "--api-key-env", "PROXY_CLIENT_KEY", "--upstream-api-key-env", "PROXY_UPSTREAM_KEY",
                "--health-interval-s", "0.1"]
        for s in sims:
            argv += ["--replica", s.url]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", *argv, cwd=tmp_path,
            env={**os.environ, "PROXY_CLIENT_KEY": CLIENT_KEY, "PROXY_UPSTREAM_KEY": UPSTREAM_KEY},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            url = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line).group(1)
            auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
            async with aiohttp.ClientSession(headers=auth, timeout=aiohttp.ClientTimeout(total=10)) as http:
                for _ in range(100):
                    async with http.get(url + "/health") as r:
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.05)
                assert r.status == 200
                body = {"model": "sim/base", "prompt": list(range(40)), "max_tokens": 2}
                async with http.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200
            assert {a for s in sims for a in s.stats.authorization} == {f"Bearer {UPSTREAM_KEY}"}
        finally:
            process.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(process.communicate(), 30)
            for s in sims:
                await s.stop()
        assert process.returncode == 0
        output = line + out.decode() + err.decode()
        assert CLIENT_KEY not in output and UPSTREAM_KEY not in output
        assert list(tmp_path.iterdir()) == []  # the proxy writes no file
    asyncio.run(scenario())


def test_grpo_plan_never_imports_the_proxy():
    code = ("import sys; from grpo_launch.cli import main; main(['plan', '--json']); "
            "assert 'aiohttp' not in sys.modules and 'grpo_launch.proxy.server' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
