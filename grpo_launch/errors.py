"""The one exception type for mistakes a user can fix.

Compose and plan raise `UserError`; the CLI renders it once (key, what is wrong, how to fix it) and exits 2.
Independent rules are checked together (`collect`) and their mistakes raised at once, as `UserErrors`, so a recipe
is fixed in one round, not one error at a time. Any other exception is a bug in grpo-launch and may show a
traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence

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


class UserErrors(UserError):
    """Several mistakes found together; it reads as the first (message, key, hint), and `errors` holds them all."""

    def __init__(self, errors: Sequence[UserError]) -> None:
        first = errors[0]
        super().__init__(first.message, key=first.key, hint=first.hint, origin=first.origin)
        self.errors = tuple(errors)

    def __str__(self) -> str:
        return "\n".join(str(UserError(e.message, hint=e.hint)) for e in self.errors)


def every_error(error: UserError) -> tuple[UserError, ...]:
    return error.errors if isinstance(error, UserErrors) else (error,)


def collect(*checks: Callable[[], object]) -> None:
    """Run every check, each independent of the others; raise what they raised together (one error as itself)."""
    found: list[UserError] = []
    for check in checks:
        try:
            check()
        except UserError as e:
            found.extend(every_error(e))
    if len(found) == 1:
        raise found[0]
    if found:
        raise UserErrors(found)


def yaml_problem(e: Exception) -> str:
    """What is wrong with a YAML file, on one line: the parser's problem and where (a YAML error's mark), or the
    reading error."""
    mark = getattr(e, "problem_mark", None)
    if mark is not None:
        return f"{getattr(e, 'problem', None) or 'not YAML'} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split())


def did_you_mean(word: str, candidates: Iterable[str], *, prefix: str = "") -> str:
    """A "; did you mean 'x'?" suffix naming the closest candidate, or "" when nothing is close."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{matches[0]}'?" if matches else ""
