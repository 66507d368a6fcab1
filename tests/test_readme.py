"""The README's example outputs are what the commands print today.

A fenced block of README.md whose lines start with `$ grpo ...` is an example: the text under each command is its
output (stdout, then stderr), as printed without a terminal (no wrapping), lines stripped of trailing spaces.
Regenerate them after a change to the output with:

    python tests/test_readme.py
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"^```\n(\$ grpo .*?)^```$", re.MULTILINE | re.DOTALL)
PROMPT = "$ "


def output_of(command: str) -> str:
    """What `command` (a `grpo ...` line) prints in a pipe: stdout, then stderr."""
    from grpo_launch.cli import main

    out, err = io.StringIO(), io.StringIO()
    columns = os.environ.pop("COLUMNS", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(shlex.split(command)[1:])
    finally:
        if columns is not None:
            os.environ["COLUMNS"] = columns
    return "\n".join(line.rstrip() for line in (out.getvalue() + err.getvalue()).splitlines())


def regenerated(block: str) -> str:
    """An example block with each command's output printed anew."""
    commands = [line for line in block.splitlines() if line.startswith(PROMPT)]
    return "".join(f"{command}\n{output_of(command[len(PROMPT):])}\n" for command in commands)


def readme_with_outputs(text: str) -> str:
    return BLOCK.sub(lambda m: f"```\n{regenerated(m.group(1))}```", text)


def _stripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines())


def test_readme_examples_are_current(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing the examples print depends on where they run
    text = README.read_text()
    assert len(BLOCK.findall(text)) >= 3  # the worked plan, the errors, the sweep
    assert _stripped(readme_with_outputs(text)) == _stripped(text), \
        "the README's examples are stale: regenerate them with `python tests/test_readme.py`"


if __name__ == "__main__":
    README.write_text(readme_with_outputs(README.read_text()))
