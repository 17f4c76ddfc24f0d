"""The command line answers what needs no component without importing optuna, torch, MLflow,
LightGBM, scikit-learn or scipy: ``--help``, a misspelt flag, ``plugins`` and an unknown
component name each run in a fresh interpreter whose imported modules are read at exit. The
built-in plugins register lazy references whose summaries and options are those of the
components they name."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from frugalnas.builtins import BUILTIN_PLUGINS
from frugalnas.ports.errors import ConfigError, PluginError, UnknownComponentError
from frugalnas.host.kinds import KINDS
from frugalnas.host.plugins import PluginHost
from frugalnas.host.registry import LazyFactory

#: What the answers below must not import.
HEAVY = ("torch", "mlflow", "lightgbm", "sklearn", "scipy", "optuna")

#: Runs ``frugalnas ARGS`` as the console script does and writes the imported modules' top-level
#: names to the file given first.
WRAPPER = """
import sys
out, argv = sys.argv[1], sys.argv[2:]
try:
    from frugalnas.cli.main import main
    code = main(argv)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    f.write(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
sys.exit(code)
"""


def run_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    modules = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(modules), *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return done, set(modules.read_text().split())


@pytest.mark.slow
def test_help_plugins_and_bad_names_import_no_heavy_library(tmp_path):
    done, modules = run_cli(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert "plugins" in done.stdout and "ui" in done.stdout  # the mlflow plugin's command
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))

    done, modules = run_cli(tmp_path, "run", "--help")
    assert done.returncode == 0 and "--tracking-uri" in done.stdout  # a plugin's flag
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))

    for args, said in (
            (["run", "--space", "nosuch", "--dry-run"], "unknown search space 'nosuch'"),
            (["run", "--space", "nosuch"], "unknown search space 'nosuch'"),
            (["run", "--strategy", "nosuch"], "unknown strategy 'nosuch'"),
            (["run", "--estimator", "nosuch", "--dry-run"], "unknown estimator 'nosuch'"),
            (["run", "--dataset", "nosuch"], "unknown dataset 'nosuch'"),
            (["run", "--pruner", "nosuch"], "unknown pruner 'nosuch'"),
            (["run", "--spcae", "nb201"], "unrecognized arguments: --spcae")):
        done, modules = run_cli(tmp_path, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("frugalnas: error: ") and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not modules & set(HEAVY), (args, sorted(modules & set(HEAVY)))
    assert "registered search space" in run_cli(tmp_path, "run", "--space", "nosuch")[0].stderr

    done, modules = run_cli(tmp_path, "run", "--space", "nosuch", "-o", "space.N=1")
    assert "unknown search space 'nosuch'" in done.stderr
    assert not modules & set(HEAVY)

    done, modules = run_cli(tmp_path, "plugins")
    assert done.returncode == 0, done.stderr
    assert "nb201" in done.stdout and "NAS-Bench-201" in done.stdout  # a lazy summary
    assert "lightgbm" in done.stdout  # listed without importing LightGBM
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_a_run_file_naming_an_unknown_space_imports_no_heavy_library(tmp_path):
    (tmp_path / "run.toml").write_text('space = "nosuch"\nestimator = "nb201-table"\n')
    done, modules = run_cli(tmp_path, "run", "run.toml", "--dry-run")
    assert done.returncode == 2
    assert done.stderr.startswith("frugalnas: error: unknown search space 'nosuch'")
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_importing_frugalnas_imports_no_heavy_library_until_a_name_is_used():
    code = ("import sys, frugalnas; before = {m.split('.')[0] for m in sys.modules}; "
            "frugalnas.SearchSpace; frugalnas.Study; print(sorted(before & set(%r))); "
            "print(frugalnas.Study.__module__, frugalnas.SearchSpace.__name__)" % (HEAVY,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "frugalnas.engine.study SearchSpace"]


def test_a_lazy_factory_is_imported_to_create_and_to_check_options():
    host = PluginHost(autoload=False)
    component = host.registry("search_spaces").get("nb201")
    assert isinstance(component.registered, LazyFactory)
    from frugalnas.spaces.nb201.space import NB201Space

    assert component.factory is NB201Space  # the class itself, as registered eagerly
    assert isinstance(component.create(N=1, C=4), NB201Space)
    with pytest.raises(ConfigError, match=r"unknown option 'c' for search space 'nb201'; "
                                          r"valid options: C, N"):
        component.create(c=4)
    with pytest.raises(UnknownComponentError):
        host.registry("search_spaces").get("nosuch")
    lazy = LazyFactory("frugalnas.spaces.nb201.space:NB201Space")
    assert isinstance(lazy(N=1, C=4), NB201Space)  # called like the factory it names
    with pytest.raises(ValueError, match="expected 'package.module:attribute'"):
        LazyFactory("frugalnas.spaces.nb201.space.NB201Space")


@pytest.mark.slow
def test_every_lazy_summary_is_its_components_docstring():
    """The summaries written beside the lazy references say what the docstrings say, and every
    reference names an importable factory."""
    host = PluginHost(autoload=False)
    checked = 0
    for kind in [*KINDS, "_all_estimators"]:
        registry = host.estimators() if kind == "_all_estimators" else host.registry(kind)
        for name in registry:
            component = registry.get(name)
            if not isinstance(component.registered, LazyFactory) \
                    or component.plugin not in BUILTIN_PLUGINS:
                continue
            factory = component.registered.load()
            doc = (inspect.getdoc(factory) or "").strip()
            if not component.registered.args:  # a derived estimator's summary is composed
                assert component.summary == " ".join(doc.split("\n\n")[0].split()), (kind, name)
            assert callable(factory)
            checked += 1
    assert checked >= 50


def test_a_lazy_factory_that_does_not_import_is_a_plugin_error_naming_it():
    class Broken:
        @staticmethod
        def frugalnas_search_spaces():
            return {"broken": LazyFactory("frugalnas_no_such_module:Space", "A space.")}

    host = PluginHost([Broken()], autoload=False)
    assert host.registry("search_spaces").get("broken").summary == "A space."  # listed
    with pytest.raises(PluginError, match=r"plugin 'Broken': search space 'broken' names "
                                          r"'frugalnas_no_such_module:Space', which failed to "
                                          r"import: ModuleNotFoundError"):
        host.create("search_spaces", "broken")
