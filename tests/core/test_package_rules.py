"""Rules of the package's structure, read from its source: no import cycle between
subpackages (or with the root package), no module-level mutable state except the listed
ones (each with its reason), and no ``getattr``/``hasattr`` probing of a component of another
kind except the listed ones (each a capability still to be declared)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "frugalnas"

#: Module-level state that is mutated at run time, by module and name, with the reason.
MUTABLE_STATE = {
    ("backends/out_of_core/profile.py", "_BANDWIDTH"):
        "host-device copy bandwidth is a property of the machine, measured once per process",
    ("backends/virtual_node/world.py", "_ACTIVE"):
        "torch.distributed has one default process group per process; this mirrors it",
    ("distribution/locks.py", "_LOCKS"):
        "fcntl locks belong to the process: threads of one process share one lock per file",
    ("proxies/runner.py", "_STATE"):
        "the state of a proxy pool's worker process, set by the pool's initializer",
    ("testing/_suite.py", "_QUIET_HOSTS"):
        "the conformance suite builds the same quiet host for many checks (test tooling)",
    ("testing/fixtures.py", "_TEMPLATE"):
        "an empty MLflow store made once per test process and copied (test tooling)",
    ("tracking/mlflow/plugin.py", "_OPEN"):
        "trackers whose writes are drained at interpreter exit (atexit runs per process)",
}

#: Components a module must not probe with getattr/hasattr unless it is their own kind's
#: module; the names are the variables such components are held in.
COMPONENT_NAMES = {"space", "model", "network", "net", "builder", "strategy", "sampler",
                   "estimator", "backend", "pruner", "study", "trial", "dataset", "surrogate",
                   "proxy"}

#: Probes that remain, by module and probed attribute: each a capability still to declare.
KNOWN_PROBES = {
    ("engine/study.py", "report"): "a trial that takes intermediate values",
    ("engine/study.py", "prune_vector"): "a pruner for objective vectors",
    ("engine/planning.py", "prune_vector"): "a pruner for objective vectors",
    ("distribution/locks.py", "optuna_study"): "a frugalnas Study or an optuna study",
    ("leaderboard.py", "dataset"): "the study's configuration",
    ("engine/planning.py", "check_options"): "a dataset factory's optional check of its options",
    ("engine/runner.py", "set_constraint"): "optuna < 5 trials have no set_constraint",
    ("multiobjective/constraints.py", "set_constraint"): "optuna < 5 trials have no "
                                                         "set_constraint",
    ("proxies/base.py", "score"): "whether a proxy overrides Proxy.score (its own kind)",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(PACKAGE)), ast.parse(path.read_text()))
            for path in sorted(PACKAGE.rglob("*.py"))]


def _unit(module: str) -> str:
    """The subpackage (or top-level module) a dotted ``frugalnas...`` name belongs to."""
    parts = module.split(".")
    return "frugalnas" if len(parts) == 1 else parts[1]


def _own_unit(rel: str) -> str:
    parts = Path(rel).with_suffix("").parts
    return "frugalnas" if parts == ("__init__",) else parts[0]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        getattr(node.test, "id", None) == "TYPE_CHECKING"
        or getattr(node.test, "attr", None) == "TYPE_CHECKING")


def _imports(tree: ast.Module, typing_only: bool = False) -> list[tuple[str, int]]:
    """The ``frugalnas`` modules a module imports at run time, wherever the import stands
    (or, with ``typing_only``, those it names only under ``if TYPE_CHECKING:``)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, in_typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            typing = in_typing or _is_type_checking(child)
            if typing == typing_only and isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                    [f"{child.module}.{a.name}" for a in child.names] \
                    if child.level == 0 and child.module else []
                found.extend((n, child.lineno) for n in names
                             if n == "frugalnas" or n.startswith("frugalnas."))
            visit(child, typing)

    visit(tree, False)
    return found


def test_no_import_cycle_between_subpackages_or_with_the_root_package():
    edges: dict[str, dict[str, str]] = {}
    for rel, tree in _modules():
        src = _own_unit(rel)
        for name, _ in _imports(tree):
            dst = _unit(name)
            if dst != src:
                edges.setdefault(src, {}).setdefault(dst, rel)

    def reaches(start: str, goal: str) -> list[str] | None:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, {}):
                if nxt == goal:
                    return [*path, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = []
    for src, targets in edges.items():
        for dst, where in targets.items():
            back = reaches(dst, src)
            if back:
                cycles.append(f"{src} -> {dst} ({where}) and back: {' -> '.join(back)}")
    assert not cycles, "\n".join(cycles)


#: The layers of the core, bottom up: each may import the layers before it, never one after.
LAYERS = ("ports", "host", "engine", "distribution", "cli")

#: Names of a higher layer a lower one uses in annotations only (``if TYPE_CHECKING:``), by
#: module and imported module, with the reason; each is a port still to be declared.
ANNOTATION_ONLY = {
    ("host/hookspecs.py", "frugalnas.engine.study.Study"):
        "the lifecycle hooks receive the engine's Study (a study port is to replace it)",
    ("host/hookspecs.py", "frugalnas.distribution.launcher.Launcher"):
        "frugalnas_launcher returns a distribution Launcher",
}


def _layer(unit: str) -> int | None:
    return LAYERS.index(unit) if unit in LAYERS else None


def test_the_core_layers_import_only_downwards():
    """The layer matrix: a module of layer L imports (at run time, anywhere in the module)
    only modules of layers up to L; a typing-only reference upwards is listed above."""
    wrong, upward_types = [], set()
    for rel, tree in _modules():
        own = _layer(_own_unit(rel))
        if own is None:
            continue
        for name, line in _imports(tree):
            target = _layer(_unit(name))
            if target is not None and target > own:
                wrong.append(f"{rel}:{line} ({LAYERS[own]}) imports {name} ({LAYERS[target]})")
        for name, line in _imports(tree, typing_only=True):
            target = _layer(_unit(name))
            if target is not None and target > own:
                upward_types.add((rel, name))
    assert not wrong, "imports against the layer matrix:\n" + "\n".join(wrong)
    unlisted = sorted(upward_types - set(ANNOTATION_ONLY))
    assert not unlisted, f"typing-only references to a higher layer: {unlisted}"
    stale = sorted(set(ANNOTATION_ONLY) - upward_types)
    assert not stale, f"listed but no longer there (drop them from ANNOTATION_ONLY): {stale}"


def test_no_import_cycle_between_modules_of_the_core_layers():
    """Within the core no module imports one that imports it back, even from inside a
    function (a local import that only dodges a cycle counts)."""
    graph: dict[str, set[str]] = {}
    for rel, tree in _modules():
        if _layer(_own_unit(rel)) is None:
            continue
        module = "frugalnas." + ".".join(Path(rel).with_suffix("").parts)
        graph[module.removesuffix(".__init__")] = {n for n, _ in _imports(tree)}
    for module in graph:
        graph[module] = {_owner(n, graph) for n in graph[module]} - {None, module}
    cycles = set()
    for start in graph:
        stack = [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    cycles.add(" -> ".join(sorted(path)))
                elif nxt not in path and len(path) < 8:
                    stack.append((nxt, (*path, nxt)))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))


def _owner(name: str, graph: dict[str, set[str]]) -> str | None:
    while name and name not in graph:
        name = name.rpartition(".")[0]
    return name or None


MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend",
            "insert", "remove", "discard"}


def test_no_module_level_mutable_state_outside_the_list():
    found = set()
    for rel, tree in _modules():
        names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found |= {(rel, n) for n in node.names}
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if not isinstance(node, ast.AugAssign) else [node.target]
                found |= {(rel, t.value.id) for t in targets if isinstance(t, ast.Subscript)
                          and isinstance(t.value, ast.Name) and t.value.id in names}
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in names):
                found.add((rel, node.func.value.id))
    unlisted = sorted(found - set(MUTABLE_STATE))
    assert not unlisted, f"module-level state mutated at run time: {unlisted}"
    stale = sorted(set(MUTABLE_STATE) - found)
    assert not stale, f"listed but no longer there (drop them from MUTABLE_STATE): {stale}"


def _leaf(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "type" and node.args:
        return _leaf(node.args[0])
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def test_no_probing_of_other_kinds_components_outside_the_list():
    found = set()
    for rel, tree in _modules():
        if rel.startswith("testing/") or rel.endswith("checks.py"):
            continue  # conformance checks inspect the component they check
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                continue
            holder = _leaf(node.args[0])
            if holder not in COMPONENT_NAMES and not (
                    isinstance(node.args[0], ast.Attribute) and _leaf(node.args[0].value)
                    in COMPONENT_NAMES):
                continue
            attr = node.args[1].value if isinstance(node.args[1], ast.Constant) else "*"
            found.add((rel, attr))
    unlisted = sorted(found - set(KNOWN_PROBES))
    assert not unlisted, ("getattr/hasattr on a component: declare the capability (a protocol "
                          f"or a base-class default) instead: {unlisted}")
    stale = sorted(set(KNOWN_PROBES) - found)
    assert not stale, f"listed but no longer there (drop them from KNOWN_PROBES): {stale}"
