"""Secrets go by name, never into a file, a log or a cache (issue 15 §2).

A marker secret is exported and used through every interpolation that could read it; each is refused at compose
time, and afterwards neither the run directory nor any cache holds it. Values that look like tokens are refused under
any name; a process that prints a secret it was passed by name has it replaced in its log and on the console. (The
key every vLLM server requires, by name only: test_replica_key.)
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from conftest import plan_json
from rich.console import Console

from grpo_launch.cli import main
from grpo_launch.contracts.plan import Plan
from grpo_launch.launch.supervisor import supervise

MARKER = "marker-5e1f0c7a93d2"  # not shaped like a token: what is tested here is the interpolation
READS_ENV = "${oc.env:GRPO_MARKER_SECRET}"

# (command-line overrides, user recipe files {path: text}) that each bring the marker in through an interpolation
INTERPOLATIONS = {
    "override": ([f"env.set.FOO={READS_ENV}"], {}),
    "override with a default": (["description=${oc.env:GRPO_MARKER_SECRET,none}"], {}),
    "list entry": ([f"vllm.extra_args=[--x,'{READS_ENV}']"], {}),
    "trainer argument": ([f"trainer.run_name={READS_ENV}"], {}),
    "decoded": (["description='${oc.decode:\"" + READS_ENV + "\"}'"], {}),
    "recipe file": (["recipe=mine"],
                    {"recipe/mine.yaml": f"# @package _global_\nenv:\n  set:\n    FOO: '{READS_ENV}'\n"}),
    "group option file": (["model=mine"], {"model/mine.yaml": f"name_or_path: '{READS_ENV}'\n"}),
    "defaults list": (["recipe=mine"], {"recipe/mine.yaml": "# @package _global_\ndefaults:\n  - override /model: "
                                                            f"'{READS_ENV}'\n",
                                        f"model/{MARKER}.yaml": "name_or_path: builtin:tiny\n"}),
}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Every place grpo-launch writes, under tmp_path/home, and the marker in the environment."""
    root = tmp_path / "home"
    for name, sub in (("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"), ("GRPO_CACHE_DIR", "cache/compose"),
                      ("GRPO_MODEL_CACHE_DIR", "cache/prepared"), ("HOME", ".")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(root / sub))
    monkeypatch.setenv("GRPO_MARKER_SECRET", MARKER)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")  # no `sky`: the task is only written
    monkeypatch.chdir(root)
    return root


def holding_marker(root: Path) -> list[Path]:
    """Files (outside the user's recipes) whose name or text holds the marker."""
    return [p for p in root.rglob("*") if root / "recipes" not in p.parents
            and (MARKER in p.name or p.is_file() and MARKER in p.read_text(errors="replace"))]


@pytest.mark.parametrize("way", INTERPOLATIONS)
def test_a_value_read_from_the_environment_is_refused_and_lands_nowhere(way, home, capsys):
    overrides, files = INTERPOLATIONS[way]
    (home / "recipes").mkdir()
    for name, text in files.items():
        (home / "recipes" / name).parent.mkdir(parents=True, exist_ok=True)
        (home / "recipes" / name).write_text(text)
    common = [*overrides, "--recipes-dir", str(home / "recipes"), f"run.root={home / 'runs'}"]
    for command in (["plan"], ["plan", "--json"], ["run", "--dry-run"], ["run", "scheduler=skypilot"]):
        assert main([*command, *common]) == 2, command
        err = capsys.readouterr().err
        assert "reads the environment (${oc." in err and MARKER not in err
    assert main(["plan", "-m", *common, "seed=1,2"]) == 2  # a sweep: every combination is refused, with its reason
    assert "none of the 2 combinations can be planned" in capsys.readouterr().err
    assert not (home / "runs").exists()
    assert holding_marker(home) == []


def test_a_secret_passed_by_name_reaches_no_file_or_cache(home, capsys):
    """The way to give a process a secret: its name in env.passthrough. The run directory written (the task only:
    no SkyPilot here) and every cache hold its name, never its value."""
    assert main(["run", "scheduler=skypilot", "env.passthrough=[GRPO_MARKER_SECRET]", f"run.root={home / 'runs'}"]) == 0
    assert "SkyPilot is not installed here" in capsys.readouterr().out
    (run_dir,) = (home / "runs" / "tiny-cpu").iterdir()
    assert "GRPO_MARKER_SECRET" in (run_dir / "launch.sh").read_text()
    assert list((home / "cache" / "compose").iterdir())  # the composition was cached
    assert holding_marker(home) == []


TOKENS = {
    "a Hugging Face token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "an OpenAI or Anthropic API key": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv",
    "a GitHub token": "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "an AWS access key id": "AKIAIOSFODNN7EXAMPLE",
}


@pytest.mark.parametrize("what", TOKENS)
@pytest.mark.parametrize("key", ["env.set.MY_VAR", "trainer.hub_token", "description"])
def test_a_value_that_looks_like_a_token_is_refused_under_any_name(key, what, capsys):
    assert main(["plan", f"{key}={TOKENS[what]}"]) == 2
    err = capsys.readouterr().err
    assert f"{key}=*** (set on the command line) holds what looks like {what}" in err
    assert TOKENS[what] not in err  # the message does not repeat it
    assert "env.passthrough" in err


RANDOM = {
    "hex (a W&B key)": "3f9a1c7e5b2d8f4a6c0e1b3d5f7a9c2e4b6d8f0a",
    "base64url": "Zt9Xq2LmVb7Rk4Hs8Nw1Pc6Yd3Jf0Ga5Ue-_Tq",
}


@pytest.mark.parametrize("value", RANDOM.values(), ids=RANDOM)
def test_a_long_random_string_in_env_set_is_refused(value, capsys):
    assert main(["plan", f"env.set.MY_VAR=prefix-{value}"]) == 2
    assert "holds what looks like a key (a long random string)" in capsys.readouterr().err


@pytest.mark.parametrize("override", [
    "model.revision=3f9a1c7e5b2d8f4a6c0e1b3d5f7a9c2e4b6d8f0a",             # a commit: hex is a key only in env.set
    "env.set.HF_HOME=/scratch/u1234/hf-cache/models--Qwen--Qwen2.5-Math-7B",  # a path: "/" breaks a run
    "env.set.MODEL_NAME=DeepSeek-R1-Distill-Qwen-1.5B",
    "env.set.NCCL_SOCKET_IFNAME=eth0",
    "data.source=hub data.path=AI-MO/NuminaMath-CoT-TIR-DeepMath-103K",
])
def test_what_is_not_a_secret_plans(override, capsys):
    assert main(["plan", *override.split()]) == 0, capsys.readouterr().err


def test_a_secret_a_process_prints_is_kept_out_of_its_log_and_the_console(tmp_path, monkeypatch):
    secret = "s3cr3t/value-9d8c7b"
    monkeypatch.setenv("GRPO_TEST_SECRET", secret)
    plan = plan_json("recipe=tiny-cpu", "env.passthrough=[GRPO_TEST_SECRET]", "model.name_or_path=Qwen/Qwen2.5-0.5B")
    (trainer,) = plan["processes"]
    trainer["argv"] = [sys.executable, "-c", "import os, urllib.parse as u; s = os.environ['GRPO_TEST_SECRET']; "
                       "print('key', s); print('url http://grpo:' + u.quote(s, safe='') + '@h:1')"]
    (tmp_path / "logs").mkdir()
    out = io.StringIO()
    result = supervise(Plan.from_json(plan), tmp_path, console=Console(file=out, width=200), verbose=True)
    assert result.code == 0
    log = (tmp_path / "logs" / "trainer.log").read_text()
    assert "key ***" in log and "url http://grpo:***@h:1" in log  # as it is, and as a URL spells it
    assert "key ***" in out.getvalue()
    assert "s3cr3t" not in log + out.getvalue()
