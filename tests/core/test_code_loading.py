"""The code-loading policy, with real processes: a plugin module named only in a run file or
in a study's stored configuration is never imported unless the user allows it (``-p NAME``,
``FRUGALNAS_PLUGINS_ALLOW``); ``report`` and ``export`` import nothing named only in the
storage. Each plugin module here writes a marker file when it is imported."""

import os
import subprocess
import sys
import textwrap

import pytest

import frugalnas
from frugalnas.ports.errors import PluginNotAllowedError
from frugalnas.host.loading import refused_plugins

MARKER_MODULE = "frugalnas_marker_plugin"
SPACE_MODULE = "frugalnas_marker_space"

MARKER_SOURCE = """
import os, pathlib
pathlib.Path(os.environ["MARKER_DIR"], __name__).write_text("imported")
"""
SPACE_SOURCE = MARKER_SOURCE + """
from frugalnas.spaces.nb201 import NB201Space

def frugalnas_search_spaces():
    return {"marker-nb201": NB201Space}
"""


@pytest.fixture
def plugin_dir(tmp_path):
    """A folder on PYTHONPATH with the marker modules; markers go to ``tmp_path/markers``."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{MARKER_MODULE}.py").write_text(MARKER_SOURCE)
    (folder / f"{SPACE_MODULE}.py").write_text(SPACE_SOURCE)
    (tmp_path / "markers").mkdir()
    return folder


def _cli(tmp_path, plugin_dir, *args, env=None):
    full = {**os.environ, "FRUGALNAS_PROGRESS": "0", "MARKER_DIR": str(tmp_path / "markers"),
            "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
            **(env or {})}
    for key in ("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD", "FRUGALNAS_PLUGINS_ALLOW"):
        if key not in (env or {}):
            full.pop(key, None)
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=tmp_path,
                          capture_output=True, text=True, env=full, timeout=600)


def _imported(tmp_path):
    return sorted(p.name for p in (tmp_path / "markers").iterdir())


def _one_error_line(proc):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("frugalnas: error: ")
    return lines[0]


def _run_file(tmp_path, module=MARKER_MODULE):
    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent(f"""\
        space = "nb201"
        estimator = "nb201-table"
        dataset = "digits"
        disable_plugins = ["mlflow"]
        plugins = ["{module}"]
        """))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("env", [{}, {"FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD": "1"},
                                 {"FRUGALNAS_PLUGINS_ALLOW": "some-other-plugin"}],
                         ids=["default", "autoload-disabled", "other-allowed"])
def test_a_run_file_cannot_import_a_module_on_its_own(tmp_path, plugin_dir, env):
    run_file = _run_file(tmp_path)
    for args in (["--dry-run"], ["--storage", f"sqlite:///{tmp_path / 'study.db'}"]):
        proc = _cli(tmp_path, plugin_dir, "run", str(run_file), "-q", *args, env=env)
        line = _one_error_line(proc)
        assert f"'{MARKER_MODULE}'" in line and f"-p {MARKER_MODULE}" in line \
            and "FRUGALNAS_PLUGINS_ALLOW" in line, line
        assert _imported(tmp_path) == [] and proc.stdout == ""
        assert not (tmp_path / "study.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["-p", "allow-list"])
def test_a_run_file_module_loads_when_the_user_allows_it(tmp_path, plugin_dir, how):
    run_file = _run_file(tmp_path)
    extra, env = (["-p", MARKER_MODULE], {}) if how == "-p" else \
        ([], {"FRUGALNAS_PLUGINS_ALLOW": MARKER_MODULE})
    proc = _cli(tmp_path, plugin_dir, "run", str(run_file), "-q", "--dry-run", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    assert _imported(tmp_path) == [MARKER_MODULE]


@pytest.mark.slow
def test_a_run_file_module_blocked_with_no_name_is_neither_refused_nor_imported(tmp_path,
                                                                                 plugin_dir):
    proc = _cli(tmp_path, plugin_dir, "run", str(_run_file(tmp_path)), "-q", "--dry-run",
                "-p", f"no:{MARKER_MODULE}")
    assert proc.returncode == 0, proc.stderr
    assert _imported(tmp_path) == []


def _stored_study(tmp_path, plugin_dir, module, **flags):
    """A study of 3 trials created by ``frugalnas run -p module``; returns its storage URL."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["run", "-q", "-p", module, "-p", "no:mlflow", "--storage", storage,
            "--study-name", "s", "--n-trials", "3", "--dataset", "digits"]
    for flag, value in flags.items():
        args += [f"--{flag}", value]
    proc = _cli(tmp_path, plugin_dir, *args)
    assert proc.returncode == 0, proc.stderr
    assert _imported(tmp_path) == [module]
    (tmp_path / "markers" / module).unlink()
    return storage


@pytest.mark.slow
def test_report_imports_nothing_named_only_in_the_storage(tmp_path, plugin_dir):
    storage = _stored_study(tmp_path, plugin_dir, MARKER_MODULE)
    proc = _cli(tmp_path, plugin_dir, "report", "--storage", storage, "--study-name", "s",
                "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(__import__("json").loads(proc.stdout)) == 3
    assert _imported(tmp_path) == []


@pytest.mark.slow
def test_report_and_export_name_the_plugin_a_study_needs(tmp_path, plugin_dir):
    storage = _stored_study(tmp_path, plugin_dir, SPACE_MODULE, space="marker-nb201")
    out = tmp_path / "exported"
    for command in (["report"], ["export", "--out", str(out), "--no-tracking"]):
        proc = _cli(tmp_path, plugin_dir, *command, "--storage", storage, "--study-name", "s")
        line = _one_error_line(proc)
        assert "search space 'marker-nb201'" in line and f"'{SPACE_MODULE}'" in line \
            and f"-p {SPACE_MODULE}" in line, line
        assert _imported(tmp_path) == [] and not out.exists()
    proc = _cli(tmp_path, plugin_dir, "report", "--storage", storage, "--study-name", "s",
                "-p", SPACE_MODULE)
    assert proc.returncode == 0, proc.stderr
    assert _imported(tmp_path) == [SPACE_MODULE]


@pytest.mark.slow
def test_load_study_refuses_stored_plugins_the_caller_does_not_name(tmp_path, plugin_dir,
                                                                    monkeypatch):
    storage = _stored_study(tmp_path, plugin_dir, SPACE_MODULE, space="marker-nb201")
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("MARKER_DIR", str(tmp_path / "markers"))
    monkeypatch.delenv("FRUGALNAS_PLUGINS_ALLOW", raising=False)
    with pytest.raises(PluginNotAllowedError) as info:
        frugalnas.load_study(study_name="s", storage=storage)
    assert info.value.names == [SPACE_MODULE] and f"plugins=['{SPACE_MODULE}']" in str(info.value)
    with pytest.raises(PluginNotAllowedError, match="search space 'marker-nb201'"):
        frugalnas.load_study(study_name="s", storage=storage, stored_plugins="skip")
    assert SPACE_MODULE not in sys.modules and _imported(tmp_path) == []

    study = frugalnas.load_study(study_name="s", storage=storage, plugins=[SPACE_MODULE],
                                 disable_plugins=["mlflow"])
    assert len(study.completed_trials()) == 3 and _imported(tmp_path) == [SPACE_MODULE]


def test_the_policy_allows_built_ins_named_and_listed_plugins(monkeypatch):
    monkeypatch.delenv("FRUGALNAS_PLUGINS_ALLOW", raising=False)
    monkeypatch.delenv("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    names = ["nb201", "mlflow", "no:progress", "evil.module", "mine"]
    assert refused_plugins(names) == ["evil.module", "mine"]
    assert refused_plugins(names, allowed=["mine"]) == ["evil.module"]
    monkeypatch.setenv("FRUGALNAS_PLUGINS_ALLOW", "evil.module")
    assert refused_plugins(names) == ["mine"]
