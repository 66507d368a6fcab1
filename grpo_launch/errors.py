"""The one exception type for mistakes a user can fix.

Compose and plan raise `UserError`; the CLI renders it once (key, what is wrong, how to fix it) and exits 2.
Any other exception is a bug in grpo-launch and may show a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_USER_ERROR = 2


class UserError(Exception):
    def __init__(self, message: str, *, key: str | None = None, hint: str | None = None,
                 origin: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.message = message
        self.hint = hint
        self.origin = origin  # where the key's value came from, once the message says it (compose.origins)

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


def did_you_mean(word: str, candidates: Iterable[str], *, prefix: str = "") -> str:
    """A "; did you mean 'x'?" suffix naming the closest candidate, or "" when nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{matches[0]}'?" if matches else ""
