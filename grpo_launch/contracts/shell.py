"""The one way a value is written into a shell command: generated scripts (launch.sh, job.sbatch, a SkyPilot task's
`run:`) and every command printed for a person to copy (the plan view, `grpo run --dry-run`, how to submit a job).

A value is always quoted as one word, so nothing it says runs. The exception is a node address reference
(`${GRPO_HOST_K}`, `contracts.hosts`), which is left for the shell to expand where the job runs. Names that are
written unquoted (environment variable names) are checked where they are declared (`contracts.knobs.ENV_NAME`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from grpo_launch.contracts import hosts

_UNSAFE_IN_DOUBLE_QUOTES = re.compile(r'["`\\!]|\$(?!\{GRPO_HOST_\d+\})')


def shell_word(text: str) -> str:
    """`text` as one word of a POSIX shell command: single-quoted unless it is plain, and node address references
    double-quoted so that the shell expands them."""
    if not hosts.REFERENCE.search(text):
        return shlex.quote(text)
    if not _UNSAFE_IN_DOUBLE_QUOTES.search(text):
        return f'"{text}"'
    parts = hosts.REFERENCE.split(text)  # literal, node, literal, node, ..., literal
    return "".join(f'"{hosts.reference(int(part))}"' if i % 2 else shlex.quote(part) if part else ""
                   for i, part in enumerate(parts))


def shell_line(words: Iterable[str]) -> str:
    """A command (argv) as one line of shell, every word quoted by `shell_word`."""
    return " ".join(shell_word(w) for w in words)
