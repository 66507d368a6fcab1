"""The house's rules that a module's source shows, each a function from a module's name and source to the lines
that break it: the architecture test runs them over the tree, and over small sources that break them, so a rule
that would let everything through fails too.

- the file-level import graph: what a module's import runs, its packages' `__init__` included;
- TRL's arguments read by name only where the recipe is composed and the plan is built;
- the run directory's files read only through their contract (`contracts.rundir`);
- a step's phases named only through their enumeration (`contracts.phases.Phase`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

# -- the import graph ---------------------------------------------------------------------------------------------


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether `node` sits under `if TYPE_CHECKING:`, which never runs."""
    while node in parents:
        node, child = parents[node], node
        if isinstance(node, ast.If) and child in node.body and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def imported_names(module: str, source: str, known: set[str]) -> set[str]:
    """The grpo-launch modules `module`'s imports name (lazy ones included, type-checking-only ones left out)."""
    tree = ast.parse(source)
    parents = _parents(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: grpo-launch imports absolutely"
            base = node.module or ""
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        for name in names:
            if name.startswith("grpo_launch"):
                while name not in known:
                    name = name.rpartition(".")[0]
                found.add(name)
    found.discard(module)
    return found


def ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def file_graph(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the modules importing it runs: each one it imports, and the packages above that one (their
    `__init__` runs first), but for its own packages, which are running already when it is."""
    graph = {}
    for module, targets in imports.items():
        own = set(ancestors(module))
        graph[module] = {m for target in targets for m in (*ancestors(target), target)
                         if m in imports and m not in own and m != module}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One loop of `graph`, as the path around it; None when it has none."""
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


# -- the rules over a module's source ------------------------------------------------------------------------------

def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(the name of the function a node is in, or "" at module level, the node) for every node."""
    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            yield inner, child
            yield from walk(child, inner)
    yield from walk(tree, "")


def _line(source: str, node: ast.AST) -> str:
    return source.splitlines()[node.lineno - 1].strip()


# TRL's arguments by name: through contracts.trl_fields (a TRL field's value, with the pinned TRL's default), or
# looked up in the recipe's `trainer` section or the plan's `trainer_args`.
TRL_READERS = ("effective", "default_of", "trainer_facts")
TRL_SECTIONS = ("trainer", "trainer_args")


def trl_reads(module: str, source: str, allowed: Callable[[str, str], bool]) -> list[str]:
    """Reads of a TRL argument by name in `module` where `allowed(module, function)` says no."""
    tree = ast.parse(source)
    readers = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "grpo_launch.contracts.trl_fields" for alias in node.names
               if alias.name in TRL_READERS}
    modules = {alias.asname or "trl_fields" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "grpo_launch.contracts" for alias in node.names if alias.name == "trl_fields"}

    def by_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in readers:
                return True
            if isinstance(f, ast.Attribute) and f.attr in TRL_READERS and isinstance(f.value, ast.Name) \
                    and f.value.id in modules:
                return True
            if isinstance(f, ast.Attribute) and f.attr == "get" and _section(f.value) and node.args \
                    and isinstance(node.args[0], ast.Constant):
                return True
        if isinstance(node, ast.Subscript) and _section(node.value) and isinstance(node.slice, ast.Constant):
            return True
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(map(_section, node.comparators)):
            return True
        return False

    return [f"{module}:{node.lineno}: {_line(source, node)}" for function, node in _functions(tree)
            if by_name(node) and not allowed(module, function)]


def _section(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in TRL_SECTIONS


# The run directory's files that grpo-launch reads back, by their names in contracts.rundir and as written.
RECORD_NAMES = ("PLAN_FILE", "CONFIG_FILE", "OVERRIDES_FILE", "SUBMITTED_FILE", "METRICS_FILE", "NODE_FAILURES",
                "TRAINER_FAILURE", "TIMELINE_SEGMENTS")
RECORD_TEXTS = ("plan.json", "config.yaml", "overrides.yaml", "submitted.json", "metrics.jsonl", ".failure.json",
                ".timeline.jsonl")
READ_METHODS = ("read_text", "read_bytes", "open")
READ_FUNCTIONS = ("open", "load", "loads", "safe_load", "LogTail")


def _names_a_record(node: ast.AST, tainted: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and (n.id in RECORD_NAMES or n.id in tainted):
            return True
        if isinstance(n, ast.Attribute) and n.attr in RECORD_NAMES:
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and any(t in n.value for t in RECORD_TEXTS):
            return True
    return False


def record_reads(module: str, source: str) -> list[str]:
    """Reads of a run directory's record file in `module` that do not go through its contract: a read (`read_text`,
    `open`, `json.load`, `yaml.safe_load`, a tail) of a path built from the file's name, directly or through names
    assigned from it (a loop over a glob of it included)."""
    tree = ast.parse(source)
    found = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]:
        nodes = list(ast.walk(scope))
        tainted: set[str] = set()
        while True:  # names bound to a record's path, until no more are
            more = set()
            for n in nodes:
                if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None \
                        and _names_a_record(n.value, tainted):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    more |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
                elif isinstance(n, ast.For | ast.comprehension) and _names_a_record(n.iter, tainted):
                    more |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
                elif isinstance(n, ast.withitem) and n.optional_vars is not None \
                        and _names_a_record(n.context_expr, tainted):
                    more |= {t.id for t in ast.walk(n.optional_vars) if isinstance(t, ast.Name)}
            if more <= tainted:
                break
            tainted |= more
        for n in nodes:
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Attribute) and f.attr in READ_METHODS and _names_a_record(f.value, tainted):
                found.append(n)
            elif (isinstance(f, ast.Name) and f.id in READ_FUNCTIONS
                  or isinstance(f, ast.Attribute) and f.attr in READ_FUNCTIONS) \
                    and any(_names_a_record(a, tainted) for a in n.args):
                found.append(n)
    return sorted({f"{module}:{n.lineno}: {_line(source, n)}" for n in found})


def phase_strings(module: str, source: str, phases: set[str]) -> list[str]:
    """A phase named by a bare string in `module`: anywhere as a key looked up or a value compared with; and in a
    module that uses the phases' enumeration, as any string at all."""
    tree = ast.parse(source)
    uses_vocabulary = any(isinstance(n, ast.ImportFrom) and n.module == "grpo_launch.contracts.phases"
                          for n in ast.walk(tree))

    def is_phase(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in phases

    found = []
    for node in ast.walk(tree):
        if uses_vocabulary:
            hits = [node] if is_phase(node) else []
        elif isinstance(node, ast.Subscript):
            hits = [node.slice] if is_phase(node.slice) else []
        elif isinstance(node, ast.Compare):
            hits = [n for side in (node.left, *node.comparators) for n in ast.walk(side) if is_phase(n)
                    and (n is side or isinstance(side, ast.Tuple | ast.List | ast.Set))]
        else:
            hits = []
        found += [f"{module}:{n.lineno}: {_line(source, n)}" for n in hits]
    return sorted(set(found))
