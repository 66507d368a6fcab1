"""The console every view prints to.

In a terminal, rich wraps to the terminal's width. Anywhere else (CI, a pipe, `grpo plan | less`) nothing is
wrapped: a line stays whole, no word is split ("micro-b atch") and a table keeps its natural width, for a reader
with `less -S`, for grep and for a log. `COLUMNS`, where it is set, is the width either way.
"""

from __future__ import annotations

import os

from rich.console import Console
from rich.rule import Rule

UNWRAPPED = 100_000  # wider than any line a view prints: rich pads nothing to it
RULE_WIDTH = 100     # a rule's width where the console has no width of its own


def console(*, stderr: bool = False) -> Console:
    wrapped = Console(highlight=False, stderr=stderr)
    if wrapped.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return wrapped
    return Console(highlight=False, stderr=stderr, width=UNWRAPPED)


def rule(console: Console, title: str) -> None:
    """A horizontal rule with a title: the console's width, or `RULE_WIDTH` on an unwrapped one."""
    console.print(Rule(title), width=RULE_WIDTH if console.width >= UNWRAPPED else None)


def counted(n: int, noun: str) -> str:
    """'1 node', '4 nodes', '2 CPU processes': a count and its noun, plural unless one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith(('s', 'x')) else 's'}"
