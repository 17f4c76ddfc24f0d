"""Print the structural figures of the installed package, read from its source.

    python tools/structure.py            # the figures, one per line
    python tools/structure.py --cycles   # also each import cycle's modules

Figures: import cycles between modules of ``frugalnas/`` (every ``import`` of a frugalnas
module counts, wherever it stands, except under ``if TYPE_CHECKING:``), function-local imports
(all, and those of frugalnas modules), ``global`` statements, the longest function, the largest
module, the parameters of ``create_study``, the public members of ``SearchSpace`` and the
package's lines (all, and those of code and docstrings: blank and comment lines left out).
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "frugalnas"


@dataclass
class ModuleFacts:
    """What one module's source says about its structure."""

    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)
    local_imports: list[str] = field(default_factory=list)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement brings in (relative ones resolved): for
    ``from P import N``, ``P.N`` (resolved later to the submodule ``P.N`` or to ``P``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def _walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield from _walk(other, in_function)
            continue
        nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda))
        yield child, in_function
        yield from _walk(child, nested)


def read_modules() -> dict[str, ModuleFacts]:
    facts: dict[str, ModuleFacts] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        facts[name] = ModuleFacts(name, path, ast.parse(path.read_text(), str(path)))
    for fact in facts.values():
        is_package = fact.path.name == "__init__.py"
        for node, in_function in _walk(fact.tree, False):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _imported(node, fact.name, is_package)
            if in_function:
                fact.local_imports.append(names[0])
            for name in names:
                target = _known_module(name, facts)
                if target and target != fact.name:
                    fact.imports.add(target)
    return facts


def _known_module(name: str, facts: dict[str, ModuleFacts]) -> str | None:
    """The frugalnas module ``name`` refers to (a module, or the module holding the name)."""
    while name:
        if name in facts:
            return name
        name = name.rpartition(".")[0]
    return None


def import_cycles(facts: dict[str, ModuleFacts]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(facts[node].imports):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for name in sorted(facts):
        if name not in index:
            visit(name)
    return sorted(found, key=len, reverse=True)


def longest_function(facts: dict[str, ModuleFacts]) -> tuple[int, str]:
    best = (0, "")
    for fact in facts.values():
        for node in ast.walk(fact.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                best = max(best, (length, f"{fact.name}.{node.name}"))
    return best


def code_lines(path: Path) -> int:
    """Lines holding code or docstrings: blank lines and comment-only lines not counted."""
    lines: set[int] = set()
    with path.open("rb") as handle:
        for token in tokenize.tokenize(handle.readline):
            if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER):
                continue
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def _function_parameters(facts: dict[str, ModuleFacts], module: str, name: str) -> int:
    for node in ast.walk(facts[module].tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            args = node.args
            return len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + (
                1 if args.vararg else 0) + (1 if args.kwarg else 0)
    raise LookupError(f"{module}.{name}")


def _public_members(facts: dict[str, ModuleFacts], module: str, name: str) -> tuple[int, int]:
    """The public methods and the public class attributes of class ``name``."""
    for node in ast.walk(facts[module].tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            methods, attributes = set(), set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    methods.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    attributes.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    attributes |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            return (sum(1 for m in methods if not m.startswith("_")),
                    sum(1 for a in attributes if not a.startswith("_")))
    raise LookupError(f"{module}.{name}")


def _defining_module(facts: dict[str, ModuleFacts], kind: type[ast.AST], name: str) -> str:
    for module, fact in facts.items():
        if any(isinstance(node, kind) and getattr(node, "name", None) == name
               for node in fact.tree.body):
            return module
    raise LookupError(name)


def figures(facts: dict[str, ModuleFacts]) -> dict[str, str]:
    cycles = import_cycles(facts)
    local = [name for fact in facts.values() for name in fact.local_imports]
    local_own = [name for name in local if name.split(".")[0] == "frugalnas"]
    globals_ = sum(isinstance(node, ast.Global) for fact in facts.values()
                   for node in ast.walk(fact.tree))
    longest, where = longest_function(facts)
    largest = max((len(f.path.read_text().splitlines()), f.name) for f in facts.values())
    study = _defining_module(facts, ast.FunctionDef, "create_study")
    members = _public_members(facts, _defining_module(facts, ast.ClassDef, "SearchSpace"),
                              "SearchSpace")
    return {
        "import cycles": f"{len(cycles)} over {sum(map(len, cycles))} modules",
        "function-local imports": str(len(local)),
        "function-local imports of frugalnas modules": str(len(local_own)),
        "global statements": str(globals_),
        "longest function": f"{longest} lines ({where})",
        "largest module": f"{largest[0]} lines ({largest[1]})",
        "create_study parameters": str(_function_parameters(facts, study, "create_study")),
        "SearchSpace public members": "{} ({} methods, {} class attributes)".format(
            sum(members), *members),
        "package lines": f"{sum(len(f.path.read_text().splitlines()) for f in facts.values())} "
                         f"({sum(code_lines(f.path) for f in facts.values())} of code and "
                         "docstrings)",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", action="store_true", help="list each cycle's modules")
    args = parser.parse_args(argv)
    facts = read_modules()
    for label, value in figures(facts).items():
        print(f"{label}: {value}")
    if args.cycles:
        for cycle in import_cycles(facts):
            print(f"cycle of {len(cycle)}: {' '.join(cycle)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
