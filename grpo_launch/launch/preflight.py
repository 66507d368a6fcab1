"""What must hold on this machine before `grpo run` writes or starts anything.

The checks that read a file of the user's (`file_checks`: reward files and modules, a files dataset, a local model
directory) are run by `grpo run`, `grpo run --dry-run` and `grpo rehearse` before anything is written; `grpo plan`,
which reads no file of the user's, names them as left to `grpo run`.
"""

from __future__ import annotations

import glob
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from grpo_launch.contracts.builtins import BUILTIN_MODEL_DIR, names_a_path
from grpo_launch.contracts.hosts import EVERY_INTERFACE
from grpo_launch.contracts.inputs import Data
from grpo_launch.contracts.plan import Plan, Role
from grpo_launch.contracts.secrets import missing_keys
from grpo_launch.errors import UserError


def runs_vllm(plan: Plan, node: int) -> bool:
    """Whether this node starts vLLM: a server or replica of its own, or an engine inside its trainer ranks."""
    local_ranks = {r for p in plan.processes if p.node == node for r in p.ranks}
    return any(p.role == Role.VLLM and p.node == node for p in plan.processes) or \
        any(set(e.ranks) & local_ranks for e in plan.engines)


def check_vllm_installed(plan: Plan, node: int) -> None:
    """A plan that runs vLLM here needs it installed: say so now, not when the first process dies."""
    if not runs_vllm(plan, node):
        return
    import importlib.metadata  # here: about 25 ms to import, which `grpo plan` (naming the file checks) never pays

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{plan.recipe} runs vLLM on this machine (placement {plan.placement}), and vLLM is not "
                        f"installed here", key="vllm", hint=f"install it: {plan.device.vllm_install}; "
                                                          f"`grpo plan` works without it") from None


def check_data_files(plan: Plan) -> None:
    """A files dataset must match a file here. (A relative path names one the run directory holds: the paths
    given on the command line were anchored where grpo runs.)"""
    data = plan.trainer_inputs.data
    if data.source != "files":
        return
    for key, pattern in (("data.path", data.path), ("data.eval", data.eval)):
        if pattern and pattern.startswith("/"):
            _matching(key, pattern)


def check_ports_free(plan: Plan, node: int) -> None:
    """Every port this node's processes open must be free before anything starts."""

    for claim in plan.ports:
        if claim.node != node:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As servers do: connections of an earlier run lingering in TIME_WAIT do not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((EVERY_INTERFACE, claim.port))
            except OSError:
                raise UserError(f"port {claim.port} ({claim.owner}) is already in use on this machine",
                                key=claim.key, hint=f"stop what holds it, or set {claim.key} to another "
                                                    f"port") from None


@dataclass(frozen=True)
class FileCheck:
    key: str                          # the recipe key naming the file
    what: str                         # what is checked, in words
    run: Callable[[], None]           # raises a `UserError` naming `key`


def file_checks(plan: Plan, prompt_room: int | None = None) -> list[FileCheck]:
    """Every check of a file of the user's that this plan needs. `prompt_room`: the tokens a prompt may take (what
    vLLM serves less the completion), for a files dataset's prompts; None when vLLM does not serve or it is unknown."""
    checks = []
    inputs = plan.trainer_inputs
    for i, reward in enumerate(inputs.rewards):
        if ":" not in reward.fn:
            continue  # a built-in reward
        key, (where, _, function) = f"rewards[{i}].fn", reward.target.rpartition(":")
        if where.endswith(".py"):
            checks.append(FileCheck(key, f"{where} exists, compiles and defines {function}",
                                    partial(_check_reward_file, key, Path(where).expanduser(), function)))
        else:
            checks.append(FileCheck(key, f"module {where} is installed, compiles and defines {function}",
                                    partial(_check_reward_module, key, where, function)))
    data = inputs.data
    if data.source == "files":
        columns = " and ".join(f"'{c}'" for c in (data.prompt_column, data.answer_column) if c)
        fits = f", and its longest prompt fits in {prompt_room} tokens" if prompt_room is not None else ""
        checks.append(FileCheck("data.path", f"{data.path} matches files whose every row has {columns}{fits}",
                                partial(check_data_rows, data, prompt_room, _prompt_tokens(inputs.model))))
    if names_a_path(inputs.model):
        checks.append(FileCheck("model.name_or_path", f"{inputs.model} is a model directory (its config.json)",
                                partial(_check_model_dir, inputs.model)))
    return checks


def _check_model_dir(name: str) -> None:
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        what = "does not exist" if not path.exists() else "holds no config.json"
        raise UserError(f"model.name_or_path {name} {what}", key="model.name_or_path",
                        hint="give a directory saved by save_pretrained (config.json, weights, tokenizer), or a "
                             "hub id (org/name)")


def _compiled(key: str, path: Path, function: str, shown: str) -> None:
    """The file compiles (nothing of it runs) and binds `function` at its top level (or may, by `import *`)."""
    import ast

    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as e:
        where = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
        raise UserError(f"{key} names {shown}, which does not compile{where}: {getattr(e, 'msg', e)}", key=key,
                        hint=f"fix {path}") from None
    bound = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    if function not in bound and "*" not in bound:
        raise UserError(f"{key} names {function} in {shown}, which defines no {function}", key=key,
                        hint=f"names it defines: {', '.join(sorted(b for b in bound if b != '*')) or 'none'}")


def _check_reward_file(key: str, path: Path, function: str) -> None:
    if not path.is_file():
        raise UserError(f"{key} names {path}, which does not exist", key=key,
                        hint="give a path relative to where you run grpo, or an absolute one")
    _compiled(key, path, function, str(path))


def _check_reward_module(key: str, module: str, function: str) -> None:
    """The module is found as the trainer would import it, without running any of it (nor its packages)."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    parts = module.split(".")
    try:
        spec = find_spec(parts[0])
        for n in range(1, len(parts)):
            locations = spec.submodule_search_locations if spec is not None else None
            spec = PathFinder.find_spec(".".join(parts[:n + 1]), list(locations)) if locations else None
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise UserError(f"{key} names module {module}, which is not installed here", key=key,
                        hint=f"install the package that holds it (pip install -e .), add its folder to PYTHONPATH, "
                             f"or give a file: path/to/file.py:{function}")
    if spec.origin and spec.origin.endswith(".py") and os.path.isfile(spec.origin):
        _compiled(key, Path(spec.origin), function, f"module {module} ({spec.origin})")


def _prompt_tokens(model: str) -> Callable[[str], int] | None:
    """How many tokens a prompt's text takes (its chat template's own tokens aside), where that is known without
    loading the model: the built-in model spells one token a character; a local model's tokenizer.json counts them."""
    if model == BUILTIN_MODEL_DIR:
        return len
    tokenizer_file = Path(model).expanduser() / "tokenizer.json"
    if not (names_a_path(model) and tokenizer_file.is_file()):
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # noqa: BLE001  (a tokenizer this cannot read, or no tokenizers: vLLM counts the tokens)
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _rows(path: str) -> Iterator[dict[str, Any]]:
    """The rows of a .jsonl, .json, .csv or .parquet file, as `datasets` reads them."""
    import csv
    import json

    if path.endswith(".parquet"):
        import pyarrow.parquet

        yield from pyarrow.parquet.read_table(path).to_pylist()
        return
    with open(path, encoding="utf-8", newline="") as f:
        if path.endswith(".csv"):
            yield from csv.DictReader(f)
            return
        text = f.read()
    try:
        whole = json.loads(text)
    except ValueError:  # JSON lines
        whole = None
    if isinstance(whole, dict) and whole and all(isinstance(v, list) for v in whole.values()):
        yield from (dict(zip(whole, row, strict=False)) for row in zip(*whole.values(), strict=False))
    elif isinstance(whole, list):
        yield from whole
    else:
        yield from (json.loads(line) for line in text.splitlines() if line.strip())


def _text(prompt: Any) -> str:
    """A prompt's text: itself, or the contents of its chat messages."""
    if isinstance(prompt, list):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)


def check_data_rows(data: Data, prompt_room: int | None = None,
                    tokens: Callable[[str], int] | None = None) -> None:
    """A files dataset: its files exist, every row has the prompt column (and the answer column, whose dotted path
    reaches into a row), and, where `tokens` counts them, the longest prompt leaves the completion its room."""
    longest, at = 0, ""
    for path in _matching("data.path", data.path):
        try:
            for n, row in enumerate(_rows(path), 1):
                prompt = _column(row, data.prompt_column, "data.prompt_column", path, n)
                if data.answer_column:
                    _column(row, data.answer_column, "data.answer_column", path, n)
                if tokens is not None:
                    size = tokens((data.system_prompt or "") + _text(prompt))
                    longest, at = max((longest, at), (size, f"row {n} of {path}"))
        except (OSError, ValueError, ImportError) as e:
            raise UserError(f"data.path {path} cannot be read as its suffix says: {e}", key="data.path") from None
    if prompt_room is not None and tokens is not None and longest > prompt_room:
        raise UserError(f"the longest prompt of data.path ({at}) takes {longest} tokens, and vLLM serves only "
                        f"{prompt_room} beside the completion", key="data.path",
                        hint="raise vllm.max_model_len, lower trainer.max_completion_length, or drop the long rows")


def _matching(key: str, pattern: str) -> list[str]:
    paths = sorted(glob.glob(os.path.expanduser(pattern)))
    if not paths:
        raise UserError(f"{key} {pattern} matches no file", key=key,
                        hint="give a path relative to where you run grpo, or an absolute one")
    return paths


def _column(row: Any, dotted: str, key: str, path: str, n: int) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            have = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
            raise UserError(f"{key} '{dotted}' is not a column of {path} (row {n} has {have or 'none'})", key=key,
                            hint=f"set {key} to the column holding it")
        value = value[part]
    if value is None and key == "data.prompt_column":
        raise UserError(f"row {n} of {path} has no prompt ('{dotted}' is null)", key=key)
    return value
def check_keys_set(plan: Plan) -> None:
    """A server that requires a key (a proxy beyond loopback) needs it in the environment, where it and its clients
    read it: say so before anything starts."""
    missing = missing_keys(plan, os.environ)
    if missing:
        raise UserError(f"{missing[0]} is not set: the plan's proxy requires the client key it names "
                        f"(placement.async_lora.proxy.api_key_env), and the trainer sends it",
                        key="placement.async_lora.proxy.api_key_env",
                        hint=f"export {missing[0]}=<key> where grpo runs; it is read by name and never written")
