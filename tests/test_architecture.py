"""The tree matches docs/architecture.md: every room imports only what its row of the table allows, the table
itself has no cycle, the file-level import graph has no loop and every module imports alone, nothing outside a
placement's module compares a placement's name, TRL's arguments are read by name only where the plan is built, the
run directory's files only through their contract, and a step's phases only through their enumeration. Each rule
over the source (`house_rules`) is also run over a small source that breaks it, so it cannot pass everything."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import house_rules
import pytest

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
    """Every grpo_launch module `module` imports, anywhere in its body (lazy imports included, imports for type hints
    alone left out)."""
    return house_rules.imported_names(module, MODULES[module].read_text(), set(MODULES))


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


def test_the_room_table_has_no_cycle():
    table = {room: allowed - {"*"} for room, allowed in allowed_imports().items()}
    assert house_rules.cycle(table) is None


def test_the_file_level_import_graph_has_no_loop():
    """Importing a module runs its packages' `__init__` first: plan/placements/__init__ importing async_lora,
    which imported trainer_args, which imported placements.base (and so the package) was a loop that only worked
    because plan/__init__ happened to import placements first."""
    loop = house_rules.cycle(house_rules.file_graph(GRAPH))
    assert loop is None, " -> ".join(loop)


def test_a_loop_through_a_package_init_is_found():
    imports = {"p": set(), "p.pkg": {"p.pkg.a"}, "p.pkg.a": {"p.other"}, "p.other": {"p.pkg.base"},
               "p.pkg.base": set()}
    assert house_rules.cycle(house_rules.file_graph(imports)) == ["p.other", "p.pkg", "p.pkg.a", "p.other"]
    assert house_rules.cycle(imports) is None  # module by module there is none: the package's __init__ makes it
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.pkg.base import X\n"
    assert house_rules.imported_names("p.other", source.replace("p.", "grpo_launch."),
                                      {"grpo_launch.pkg.base", "grpo_launch.pkg"}) == set()


# Imports each module given, each in a process of its own, forked from one that has loaded what grpo-launch imports
# from elsewhere and nothing of grpo-launch: a module that imports only because another was imported first fails.
ALONE = """
import importlib, json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
assert not [m for m in sys.modules if m.split(".")[0] == "grpo_launch"]
failed = {}
for module in json.loads(sys.argv[2]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            code = 0
        except BaseException:
            os.write(write, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    if os.waitpid(pid, 0)[1]:
        failed[module] = said
print(json.dumps(failed))
"""


def _loaded_at_import(path: Path) -> set[str]:
    """What a module's top level imports from outside grpo-launch."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return {name for name in found if not name.startswith("grpo_launch") and name != "__future__"}


def _imported_alone(modules: list[str], cache: Path) -> dict[str, str]:
    third_party = sorted(set().union(*map(_loaded_at_import, MODULES.values())))
    # Bytecode kept in `cache`: each module is compiled once, not once per fork (most of the time without it).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPYCACHEPREFIX": str(cache)}
    done = subprocess.run([sys.executable, "-c", ALONE, json.dumps(third_party), json.dumps(modules)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_module_imports_alone_in_a_fresh_interpreter(tmp_path):
    failed = _imported_alone(sorted(m for m in MODULES if not m.endswith("__main__")), tmp_path)
    assert not failed, "\n\n".join(f"{m}:\n{why}" for m, why in failed.items())


def test_a_module_that_imports_only_after_another_is_found(tmp_path, monkeypatch):
    package = tmp_path / "grpo_launch_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("import sys\nsys.modules[__name__].ready = True\n")
    (package / "second.py").write_text("import grpo_launch_probe\nassert grpo_launch_probe.first.ready\n")
    done = subprocess.run([sys.executable, "-c", ALONE, "[]", json.dumps(["grpo_launch_probe.second"])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "grpo_launch_probe.second" in json.loads(done.stdout)


def test_placement_names_are_compared_only_in_their_own_modules():
    names = ("colocate", "server", "async-lora", "GRPOConfig", "AsyncGRPOConfig")
    quoted = "|".join(map(re.escape, names))
    comparison = re.compile(rf"""(==|!=|\bin)\s*\(?["']({quoted})["']""")
    trl_mode = re.compile(r"\.mode\s*(==|!=)")  # TRL's own vllm_mode (VLLMGeneration.mode): TRL's words, not ours
    trl = ("grpo_launch.contracts.trl_fields", "grpo_launch.compose.trl_checks")
    found = [line for line in _lines_matching(comparison, skip=lambda m: m.startswith("grpo_launch.plan.placements.")
                                              or m in trl)
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


# -- TRL's arguments by name ----------------------------------------------------------------------------------------
# Where a TRL argument may be read by name: composing the recipe; building the plan (its checks, TRL's rules, the
# trainer's arguments, the rehearsal's config, and a placement's own `plan` and `batch`); and the fields' module,
# which resolves the plan's TrainerFacts for the planner and for the reader of an older plan.json.
TRL_BUILDING = {"grpo_launch.plan", "grpo_launch.plan.checks", "grpo_launch.plan.trl_rules",
                "grpo_launch.plan.trainer_args", "grpo_launch.plan.rehearse", "grpo_launch.contracts.trl_fields"}
PLACEMENT_BUILDING = ("plan", "batch")


def _trl_read_allowed(module: str, function: str) -> bool:
    if module.startswith("grpo_launch.compose") or module in TRL_BUILDING:
        return True
    if module == "grpo_launch.contracts.rundir":
        return function == "_plan_v1_to_v2"
    return module.startswith("grpo_launch.plan.placements.") and function in PLACEMENT_BUILDING


def test_trl_arguments_are_read_by_name_only_where_the_plan_is_built():
    """After planning, what TRL's arguments decide is the plan's TrainerFacts, Batch and TrainerInputs: the memory
    estimate, the step-time model, the report and the diagnosis read those."""
    found = [line for module, path in MODULES.items()
             for line in house_rules.trl_reads(module, path.read_text(), _trl_read_allowed)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source", [
    "from grpo_launch.contracts import trl_fields\ndef f(plan):\n    return trl_fields.effective(plan.trainer_args, "
    "plan.trainer_class, 'beta')\n",
    "from grpo_launch.contracts.trl_fields import effective as get\nx = get({}, 'GRPOConfig', 'beta')\n",
    "def f(plan):\n    return plan.trainer_args['beta']\n",
    "def f(config):\n    return config.trainer.get('output_dir')\n",
    "def f(config):\n    return 'beta' in config.trainer\n",
])
def test_a_trl_argument_read_by_name_after_planning_is_found(source):
    assert house_rules.trl_reads("grpo_launch.report.diagnosis", source, _trl_read_allowed)
    assert not house_rules.trl_reads("grpo_launch.plan.checks", source, _trl_read_allowed)


def test_a_placement_reads_trl_arguments_only_while_it_plans():
    source = textwrap.dedent("""
        from grpo_launch.contracts import trl_fields
        class P:
            def plan(self, ctx):
                return trl_fields.effective(ctx.config.trainer, "GRPOConfig", "max_staleness")
            def step_time(self, model):
                return trl_fields.effective(model.plan.trainer_args, "GRPOConfig", "weight_sync_steps")
        """)
    found = house_rules.trl_reads("grpo_launch.plan.placements.async_lora", source, _trl_read_allowed)
    assert len(found) == 1 and "weight_sync_steps" in found[0]


# -- the run directory's files --------------------------------------------------------------------------------------
def test_run_directory_files_are_read_only_through_their_contract():
    found = [line for module, path in MODULES.items() if module != "grpo_launch.contracts.rundir"
             for line in house_rules.record_reads(module, path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source", [
    "import json\ndef f(run_dir):\n    return json.loads((run_dir / PLAN_FILE).read_text())\n",
    "import yaml\ndef f(run_dir):\n    return yaml.safe_load((run_dir / 'overrides.yaml').read_text())['overrides']\n",
    "def f(run_dir):\n    path = run_dir / SUBMITTED_FILE\n    with path.open() as f:\n        return f.read()\n",
    "def f(run_dir):\n    for p in (run_dir / 'logs').glob(NODE_FAILURES.format(node='*')):\n        p.read_text()\n",
    "def f(run_dir):\n    return [line for line in open(run_dir / rundir.METRICS_FILE)]\n",
])
def test_a_raw_read_of_a_run_directory_file_is_found(source):
    assert house_rules.record_reads("grpo_launch.report.run", source)


def test_naming_a_run_directory_file_is_not_reading_it():
    source = ("def f(run_dir):\n    print(f'{run_dir / METRICS_FILE} is not here yet')\n"
              "    (run_dir / 'x').read_text()\n")
    assert not house_rules.record_reads("grpo_launch.report.run", source)


# -- the phases of a step -------------------------------------------------------------------------------------------
def _phases() -> set[str]:
    from grpo_launch.contracts.phases import Phase

    return {p.value for p in Phase}


def test_phases_are_named_only_by_their_enumeration():
    found = [line for module, path in MODULES.items() if module != "grpo_launch.contracts.phases"
             for line in house_rules.phase_strings(module, path.read_text(), _phases())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source", [
    "def f(share):\n    return share['wait']\n",
    "def f(worst):\n    return worst == 'generate'\n",
    "def f(p):\n    return p in ('generate', 'sync')\n",
    "from grpo_launch.contracts.phases import Phase\nCOLORS = {'train': 'orange'}\n",
    "from grpo_launch.contracts.phases import Phase\ndef f(clock):\n    clock.phase('score')\n",
])
def test_a_phase_named_by_a_bare_string_is_found(source):
    assert house_rules.phase_strings("grpo_launch.report.plots", source, _phases())


def test_the_same_word_meaning_something_else_is_not_a_phase():
    source = "def f(load):\n    return load(split='train'), ['hf', 'buckets', 'sync'], 'train' + ',deepspeed'\n"
    assert not house_rules.phase_strings("grpo_launch.trainer.data", source, _phases())
