"""The tree matches docs/architecture.md: every room imports only what its row of the table allows, the table
itself has no cycle, no module imports itself in a cycle, and nothing outside a placement's module compares a
placement's name."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo_launch"


def allowed_imports() -> dict[str, set[str]]:
    """Room -> the rooms it may import, from the table in docs/architecture.md."""
    rows = re.findall(r"^\| `(\w+)` \| .* \| (.+) \|$", (ROOT / "docs" / "architecture.md").read_text(), re.M)
    table = {}
    for room, allowed in rows:
        table[room] = {"*"} if allowed.strip() == "every room" else set(re.findall(r"`(\w+)`", allowed))
    return table


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def room_of(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def imports_of(module: str) -> set[str]:
    """Every grpo_launch module `module` imports, anywhere in its body (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: grpo-launch imports absolutely"
            base = node.module or ""
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("grpo_launch"):
                while name not in MODULES:
                    name = name.rpartition(".")[0]
                found.add(name)
    found.discard(module)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_room_is_in_the_table():
    rooms = {room_of(m) for m in MODULES if m != "grpo_launch"}
    assert rooms == set(allowed_imports()), "docs/architecture.md's table and the tree disagree"


def test_rooms_import_only_what_the_table_allows():
    table = allowed_imports()
    wrong = []
    for module, targets in GRAPH.items():
        room = room_of(module)
        for target in targets:
            other = room_of(target)
            if other != room and "*" not in table[room] and other not in table[room]:
                wrong.append(f"{module} imports {target} ({room} may import {sorted(table[room]) or 'nothing'})")
    assert not wrong, "\n".join(wrong)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_room_table_has_no_cycle():
    table = {room: allowed - {"*"} for room, allowed in allowed_imports().items()}
    assert _cycle(table) is None


def test_no_import_cycle_between_modules():
    cycle = _cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle)


def test_placement_names_are_compared_only_in_their_own_modules():
    names = ("colocate", "server", "async-lora", "GRPOConfig", "AsyncGRPOConfig")
    quoted = "|".join(map(re.escape, names))
    comparison = re.compile(rf"""(==|!=|\bin)\s*\(?["']({quoted})["']""")
    trl_mode = re.compile(r"\.mode\s*(==|!=)")  # TRL's own vllm_mode (VLLMGeneration.mode): TRL's words, not ours
    found = [line for line in _lines_matching(comparison, skip=lambda m: m.startswith("grpo_launch.plan.placements.")
                                              or m == "grpo_launch.compose.trl_fields")
             if not trl_mode.search(line)]
    assert not found, "\n".join(found)


def _lines_matching(pattern: re.Pattern, skip=lambda module: False) -> list[str]:
    found = []
    for module, path in MODULES.items():
        if skip(module):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_device_is_asked_not_compared():
    """What differs between a GPU and a CPU is the device strategy's (contracts/devices.py): nothing else compares
    cluster.accelerator, or a value, with a device's name."""
    from grpo_launch.contracts.devices import DEVICES

    names = "|".join(map(re.escape, DEVICES))
    switch = re.compile(rf"""accelerator\s*(==|!=)|(==|!=|\bin)\s*\(?["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = _lines_matching(switch, skip=lambda m: m == "grpo_launch.contracts.devices")
    assert not found, "\n".join(found)


def test_the_plan_is_read_by_typed_fields():
    """The processes and the planner read the plan's typed fields: no key of its batch, its TRL arguments or its
    generated files is looked up (TRL's arguments pass to TRL whole; `trl_fields.effective` reads a TRL field with
    its default), and roles, trainers, weight syncs and shardings are enumerations, not strings compared."""
    lookup = re.compile(r"""\.(batch|trainer_args|files)\s*(\[|\.get\()""")
    compared = re.compile(r"""\.(role|trainer|weight_sync|sharding)\s*(==|!=|\bin)\s*\(?["']""")
    found = _lines_matching(lookup) + _lines_matching(compared)
    assert not found, "\n".join(found)


def _comparisons_outside(names: tuple[str, ...], allowed) -> list[str]:
    """Lines outside the modules `allowed(module)` accepts that compare a value with one of `names`."""
    quoted = "|".join(map(re.escape, names))
    comparison = re.compile(rf"""(==|!=|\bin)\s*\(?["']({quoted})["']|["']({quoted})["']\s*(==|!=)""")
    return _lines_matching(comparison, skip=allowed)


def test_scheduler_names_are_compared_only_in_their_own_modules():
    """The CLI, the rehearsal and the supervisor ask a scheduler (its planner, its launcher); only a scheduler's own
    modules (plan/schedulers/NAME.py, launch/schedulers/NAME.py) know its name."""
    from grpo_launch.contracts.schedulers import DECLARED

    for d in DECLARED:
        own = {f"grpo_launch.plan.schedulers.{d.name.replace('-', '_')}",
               f"grpo_launch.launch.schedulers.{d.name.replace('-', '_')}"}
        found = _comparisons_outside((d.name,), lambda m, own=own: m in own)
        assert not found, "\n".join(found)


def test_trainers_and_weight_syncs_are_compared_only_in_their_own_modules():
    """What the trainer entrypoint runs (contracts.plan.Trainer) is dispatched in trainer/main.py; how weights reach
    vLLM (contracts.devices.WeightSync) is read by the trainer module that does it (trainer/vllm_sync.py). The
    placements choose them (and the device strategy its own weight sync); nothing else compares either, by name or
    by member."""
    from grpo_launch.contracts.devices import WeightSync
    from grpo_launch.contracts.plan import Trainer

    def choosers(module: str) -> bool:
        return module.startswith("grpo_launch.plan.placements.")

    found = _comparisons_outside(tuple(Trainer), lambda m: m == "grpo_launch.trainer.main" or choosers(m))
    found += _comparisons_outside(tuple(WeightSync), lambda m: m == "grpo_launch.trainer.vllm_sync" or choosers(m))
    members = re.compile(r"(==|!=|\bin)\s*\(?(Trainer|WeightSync)\.|\b(Trainer|WeightSync)\.\w+\s*(==|!=)")
    found += _lines_matching(members, skip=lambda m: choosers(m) or m in (
        "grpo_launch.trainer.main", "grpo_launch.trainer.vllm_sync", "grpo_launch.contracts.devices"))
    assert not found, "\n".join(found)


def test_every_declared_scheduler_has_a_planner_a_launcher_and_a_group_file():
    """Adding a scheduler: its declaration (contracts.schedulers), its planning module, its launch module and its
    recipe group file; the schema's choices come from the declarations."""
    from grpo_launch.compose.schema import type_at
    from grpo_launch.contracts.schedulers import DECLARED
    from grpo_launch.launch.schedulers import LAUNCHERS
    from grpo_launch.plan.schedulers import SCHEDULERS

    names = [d.name for d in DECLARED]
    assert list(SCHEDULERS) == names and list(LAUNCHERS) == names
    assert {p.stem for p in (ROOT / "recipes" / "scheduler").glob("*.yaml")} == set(names)
    for d in DECLARED:
        if d.key:
            assert type_at(f"scheduler.{d.key}") is d.settings
