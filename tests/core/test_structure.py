"""The structural figures that tools/structure.py prints, held where they meet their goals
(docs/architecture.md, "Structural figures"): no import cycle between modules of the package,
one global statement, no function over 80 lines, create_study with at most 10 parameters,
SearchSpace with at most 12 public methods."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "structure.py"


def _structure():
    spec = importlib.util.spec_from_file_location("structure_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def test_the_package_keeps_its_structural_figures():
    structure = _structure()
    facts = structure.read_modules()
    assert structure.import_cycles(facts) == []
    figures = structure.figures(facts)
    assert figures["global statements"] == "1"
    longest = int(figures["longest function"].split()[0])
    assert longest <= 80, figures["longest function"]
    assert int(figures["create_study parameters"]) <= 10
    methods = int(figures["SearchSpace public members"].split("(")[1].split()[0])
    assert methods <= 12, figures["SearchSpace public members"]


def test_an_import_cycle_is_found_even_through_a_function_local_import(tmp_path, monkeypatch):
    structure = _structure()
    package = tmp_path / "frugalnas"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from frugalnas.b import f\n")
    (package / "b.py").write_text("def f():\n    from frugalnas.a import g\n")
    monkeypatch.setattr(structure, "PACKAGE", package)
    facts = structure.read_modules()
    assert structure.import_cycles(facts) == [["frugalnas.a", "frugalnas.b"]]
    assert [name for fact in facts.values() for name in fact.local_imports] == ["frugalnas.a.g"]
