"""Interpolations that would write the environment into the run directory are refused.

Every composed value is written out: config.yaml, plan.json, launch.sh, the job files and the composition cache.
`${oc.env:NAME}` resolves at compose time, so its value (a token, typically) would land in all of them. It is refused
wherever it is written (a recipe file, a group option, an override, a sweep, a defaults list, whose choices
config.yaml records), and so is `${oc.decode:...}`, whose string can hold an `oc.env` that resolves when it is
decoded. Interpolations of other keys (`${model.name_or_path}`) and the other resolvers read only the config or the
clock and stay allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_launch.compose import recipes
from grpo_launch.contracts.knobs import texts
from grpo_launch.errors import UserError

ENVIRONMENT_RESOLVERS = ("oc.env", "oc.decode")


def _resolvers(text: str) -> list[str]:
    """The resolvers an OmegaConf value calls, found by OmegaConf's own grammar (nested ones included)."""
    from antlr4.tree.Tree import TerminalNode
    from omegaconf import grammar_parser
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

    names: list[str] = []
    pending = [grammar_parser.parse(text, parser_rule="configValue")]
    while pending:
        node = pending.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            names.append(node.resolverName().getText())
        pending += [node.getChild(i) for i in range(node.getChildCount())
                    if not isinstance(node.getChild(i), TerminalNode)]
    return names


def _environment_resolver(text: str) -> str | None:
    """The first resolver in `text` that reads the environment, or None."""
    from omegaconf.errors import GrammarParseError

    if "${" not in text:
        return None
    try:
        return next((r for r in _resolvers(text) if r in ENVIRONMENT_RESOLVERS), None)
    except GrammarParseError:
        return None  # not an interpolation OmegaConf can resolve: it says so itself when it resolves the config


def _refused(where: str, resolver: str, key: str | None) -> UserError:
    return UserError(f"{where} reads the environment (${{{resolver}:...}}): its value would be written to "
                     f"config.yaml, plan.json, launch.sh and the composition cache", key=key,
                     hint="pass a secret by name: add its variable to env.passthrough (the processes read it from "
                          "your environment); give anything else on the command line, where your shell expands it "
                          "(run.root=$SCRATCH/runs)")


def check_no_environment(cfg: Any) -> None:
    """Refuse any value of the composed (unresolved) config whose interpolation reads the environment."""
    from omegaconf import OmegaConf

    for path, text in texts(OmegaConf.to_container(cfg, resolve=False)):
        if resolver := _environment_resolver(text):
            raise _refused(f"'{path}'", resolver, path)


def check_defaults(dirs: Sequence[Path], choices: Mapping[str, str]) -> None:
    """Refuse a defaults list, in any option file Hydra composed, that chooses an option from the environment (Hydra
    resolves it while composing; config.yaml records the choice)."""
    import yaml

    for group, option in choices.items():
        path = recipes.group_options(dirs, group).get(option)
        if path is None or not any(r in (text := path.read_text()) for r in ENVIRONMENT_RESOLVERS):
            continue
        doc = yaml.safe_load(text)
        entries = doc.get("defaults") if isinstance(doc, dict) else None
        for _, entry in texts(entries or []):
            if resolver := _environment_resolver(entry):
                raise _refused(f"the defaults list of {path}", resolver, None)
