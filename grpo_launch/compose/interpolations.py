"""Interpolations that would write the environment into the run directory are refused.

Every composed value is written out: config.yaml, plan.json, launch.sh, the job files and the composition cache.
`${oc.env:NAME}` resolves at compose time, so its value (a token, typically) would land in all of them. It is refused
wherever it is written (a recipe file, a group option, an override, a sweep), and so is `${oc.decode:...}`, whose
string can hold an `oc.env` that resolves when it is decoded. Interpolations of other keys (`${model.name_or_path}`)
and the other resolvers read only the config or the clock and stay allowed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from grpo_launch.errors import UserError

ENVIRONMENT_RESOLVERS = ("oc.env", "oc.decode")


def _texts(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _texts(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _texts(v, f"{path}[{i}]")


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


def check_no_environment(cfg: Any) -> None:
    """Refuse any value of the composed (unresolved) config whose interpolation reads the environment."""
    from omegaconf import OmegaConf
    from omegaconf.errors import GrammarParseError

    for path, text in _texts(OmegaConf.to_container(cfg, resolve=False), ""):
        if "${" not in text:
            continue
        try:
            used = [r for r in _resolvers(text) if r in ENVIRONMENT_RESOLVERS]
        except GrammarParseError:
            continue  # not an interpolation OmegaConf can resolve: it says so itself when it resolves the config
        if used:
            raise UserError(f"'{path}' reads the environment (${{{used[0]}:...}}): its value would be written to "
                            f"config.yaml, plan.json, launch.sh and the composition cache", key=path,
                            hint="pass a secret by name: add its variable to env.passthrough (the processes read it "
                                 "from your environment); give anything else on the command line, where your shell "
                                 "expands it (run.root=$SCRATCH/runs)")
