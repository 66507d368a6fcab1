"""Generates docs/recipe-reference.md from the schema (a test checks the file is current).

    python -m grpo_launch.plan.reference > docs/recipe-reference.md
"""

from __future__ import annotations

import types
import typing
from typing import Any

from grpo_launch.compose import recipes, schema
from grpo_launch.contracts import builtins, trl_fields
from grpo_launch.contracts.knobs import REQUIRED
from grpo_launch.plan.placements import PLACEMENTS
from grpo_launch.plan.trainer_args import MANAGED

HEADER = """# Recipe reference

Every key a recipe (or a `key=value` override) can set, with its type, default and meaning. Generated from
`grpo_launch/compose/schema.py` by `python -m grpo_launch.plan.reference`; a test fails when this file is out of
date.

Config groups (choose with `group=option`, e.g. `zero=3-offload`): {groups}.

No value holds a control character (a line break, a tab, an escape), because values are written into scripts
and job files, unless its key says otherwise; keys with a form take only values of that form. Values are quoted
wherever they are written, except `scheduler.setup` (shell commands) and `scheduler.slurm.sbatch` (sbatch options),
which are written as given. A value that reads the environment (`${{oc.env:NAME}}`) is refused, and so is one that
looks like a secret (docs/run.md says what is checked): pass secrets by name, with `env.passthrough`.

`trainer.*` takes TRL {trl}'s field names of the placement's config class: {classes}. Unknown names and wrong
kinds are rejected at plan time. These are set by grpo-launch from other keys
and may not be given under `trainer.`: {managed}.

| key | type | default | meaning |
|---|---|---|---|
"""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if tp is type(None):
        return "null"
    if tp is typing.Any:
        return "any"
    return tp.__name__ if hasattr(tp, "__name__") else str(tp)


def _default(value: Any) -> str:
    if value == REQUIRED:
        return "**required**"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list) and value and not isinstance(value[0], (str, int, float)):
        return "[]"
    return f"`{value}`" if value != "" else '`""`'


def _meaning(meta: dict) -> str:
    text = meta.get("doc", "")
    bounds = []
    if meta.get("choices"):
        bounds.append("one of " + ", ".join(f"`{c}`" for c in meta["choices"]))
    for op, sym in (("ge", ">="), ("gt", ">"), ("le", "<=")):
        if meta.get(op) is not None:
            bounds.append(f"{sym} {meta[op]:g}")
    if meta.get("form"):
        bounds.append(f"{meta['form'].what}: `{meta['form'].pattern}`")
    if meta.get("any_text"):
        bounds.append("may hold line breaks: it reaches no script")
    if bounds:
        text += f" ({'; '.join(bounds)})"
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    by_class: dict[str, list[str]] = {}
    for p in PLACEMENTS.values():
        by_class.setdefault(p.trainer_class, []).append(p.name)
    classes = ", ".join(f"`{cls}` ({', '.join(names)})" for cls, names in by_class.items())
    out = HEADER.format(classes=classes, groups=", ".join(f"`{g}`" for g in recipes.GROUPS),
                        trl=trl_fields.trl_version(), managed=", ".join(f"`{k}`" for k in MANAGED))
    for key, tp, default, meta in schema.schema_keys():
        out += f"| `{key}` | {_type_name(tp)} | {_default(default)} | {_meaning(meta)} |\n"
    reward_fields = schema.schema_keys(schema.Reward, "rewards[].")
    out += "\nEach entry of `rewards` has:\n\n| key | type | default | meaning |\n|---|---|---|---|\n"
    for key, tp, default, meta in reward_fields:
        out += f"| `{key}` | {_type_name(tp)} | {_default(default)} | {_meaning(meta)} |\n"
    out += ("\nBuilt-in rewards: " + ", ".join(f"`{name}` (`{target}`)" for name, target in builtins.REWARDS.items())
            + ".\n\nBuilt-in tasks (`data.source=builtin`): " + ", ".join(f"`{t}`" for t in builtins.TASKS)
            + ".\n")
    return out


if __name__ == "__main__":
    print(reference_markdown(), end="")
