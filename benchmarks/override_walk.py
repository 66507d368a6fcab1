"""The walk of one override from the command line to a process's argv: how many grpo-launch modules and calls it
passes through, and how often it comes back to a module it had left.

Method. `grpo plan recipe=qwen7b-server vllm.max_model_len=3456` runs in this process (the composition cache off,
GRPO_COMPOSE_CACHE=0, so Hydra composes as on a first run) under `sys.setprofile`. A call counts when:
- its function is defined in a module of grpo_launch/ (comprehensions, generator expressions and lambdas, whose
  code names start with '<', are part of the function that holds them and do not count, nor does a function's
  call of itself: a recursive walk is one call; a generator counts when it starts, not each time it resumes);
- one of its arguments holds the override's value: the text `3456` as a word of a string (the override as typed,
  an argv entry, a generated file) or the number 3456, found in the argument itself or up to DEPTH steps inside it
  (a dataclass's or object's fields, a mapping's keys and values, a sequence's items), each object visited once;
- it starts before the walk ends: the first return, from a grpo_launch function, of an argv (a tuple or list of
  strings) that holds `--max-model-len 3456`, `vllm serve`'s flag.
Reported: the calls counted, the distinct modules they are in, and the returns to a module already left: in the
modules of the counted calls, taken in call order with repeats of the same module merged, every entry into a module
that came earlier in that sequence.

The value 3456 is chosen so that the recipe plans (it holds prompt + completion, within the model's context) and
so that it appears nowhere else in the plan. Run: `python benchmarks/override_walk.py [-v] [OVERRIDE...]`; `-v`
prints the walk, one line a call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "grpo_launch") + os.sep
DEPTH = 4
FLAG = "--max-model-len"
GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
DEFAULT = ["recipe=qwen7b-server", "vllm.max_model_len=3456"]


def holds(value: Any, word: str, number: int, depth: int = DEPTH, seen: set[int] | None = None) -> bool:
    """Whether `value` holds the override's value, within `depth` steps."""
    if isinstance(value, str):
        return re.search(rf"(?<![\w.]){re.escape(word)}(?![\w.])", value) is not None
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == number
    if depth == 0 or value is None or isinstance(value, (float, bytes, type)) or callable(value) and \
            not dataclasses.is_dataclass(value):
        return False
    seen = set() if seen is None else seen
    if id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, dict):
        items: Any = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    elif dataclasses.is_dataclass(value):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    elif type(value).__module__.startswith("grpo_launch") and hasattr(value, "__dict__"):
        items = list(vars(value).values())
    else:
        return False
    return any(holds(item, word, number, depth - 1, seen) for item in items)


def _argv_with_value(value: Any, word: str) -> bool:
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        return False
    return any(a == FLAG and b == word for a, b in zip(value, value[1:], strict=False))


def walk(overrides: list[str]) -> list[tuple[str, str]]:
    """(module, function) of every counted call, in call order."""
    word = overrides[-1].rpartition("=")[2]
    number = int(word)
    calls: list[tuple[str, str]] = []
    started: set[Any] = set()  # generator frames seen (kept alive, so no other frame takes their identity)
    done = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal done
        if done:
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE) or code.co_name.startswith("<"):
            return
        if event == "return" and _argv_with_value(arg, word):
            done = True
            return
        if event != "call" or frame.f_back is not None and frame.f_back.f_code is code or frame in started:
            return
        if code.co_flags & GENERATOR:
            started.add(frame)
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        args = [frame.f_locals.get(n) for n in names]
        if any(holds(a, word, number) for a in args):
            module = Path(code.co_filename).relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
            calls.append((module.removesuffix(".__init__"), code.co_qualname))

    from grpo_launch.cli import main

    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(["plan", *overrides])
    finally:
        sys.setprofile(None)
    if code != 0 or not done:
        raise SystemExit(f"grpo plan {' '.join(overrides)} did not build an argv with {FLAG} {word} (exit {code})")
    return calls


def returns_to_left(modules: list[str]) -> int:
    merged = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    return sum(1 for i, m in enumerate(merged) if m in merged[:i])


def main() -> None:
    verbose = "-v" in sys.argv[1:]
    overrides = [a for a in sys.argv[1:] if a != "-v"] or DEFAULT
    os.environ["GRPO_COMPOSE_CACHE"] = "0"
    calls = walk(overrides)
    modules = [m for m, _ in calls]
    if verbose:
        for module, function in calls:
            print(f"  {module}: {function}")
    print(f"override walk of `grpo plan {' '.join(overrides)}`: {len(set(modules))} modules, {len(calls)} calls, "
          f"{returns_to_left(modules)} returns to a module already left")


if __name__ == "__main__":
    main()
