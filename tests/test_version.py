"""`grpo --version`: grpo-launch's version and the stack's, read from installed metadata without importing it."""

import subprocess
import sys
from importlib.metadata import version


def test_version_names_the_stack_without_importing_it():
    code = ("import sys; from grpo_launch.cli import main\n"
            "code = main(['--version'])\n"
            "heavy = sorted(m for m in ('torch', 'trl', 'vllm', 'deepspeed', 'transformers') if m in sys.modules)\n"
            "print('HEAVY', heavy, 'CODE', code, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY [] CODE 0" in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"grpo-launch {version('grpo-launch')}"
    assert lines[1:] == [f"TRL {version('trl')}", f"vLLM {version('vllm')}", f"DeepSpeed {version('deepspeed')}",
                         f"torch {version('torch')}"]


def test_a_missing_package_is_named_not_installed(monkeypatch):
    from importlib import metadata

    from grpo_launch.cli import app

    real = metadata.version

    def without_deepspeed(name):
        if name == "deepspeed":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", without_deepspeed)
    assert ("DeepSpeed", None) in app.versions()
