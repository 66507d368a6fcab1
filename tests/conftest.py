import json
import os
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True)
def isolated_config_home(tmp_path, monkeypatch):
    """Keep the developer's ~/.config/grpo-launch and $GRPO_RECIPES_PATH out of every test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GRPO_RECIPES_PATH", raising=False)


def grpo(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run the real `grpo` console entry point in a subprocess."""
    return subprocess.run([sys.executable, "-c", "from grpo_launch.cli import entrypoint; entrypoint()", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


def plan_json(*overrides: str) -> dict:
    from grpo_launch.compose import compose
    from grpo_launch.plan import build_plan

    return json.loads(json.dumps(build_plan(compose(list(overrides))).to_json()))
