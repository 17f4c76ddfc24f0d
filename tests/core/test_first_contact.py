"""What a newcomer meets first: bad command lines answered in one line (exit 2, nothing
written), where the results are, a progress bar that is up to date, and plugin names given
as one string."""

from __future__ import annotations

import os
import sys

import optuna
import pytest
from ops_support.cli_driver import cli_cases

import frugalnas
from frugalnas.ports.errors import ConfigError, PluginError

BAD_INPUT = [
    (["run", "--n-trials", "abc"], "argument --n-trials: invalid int value: 'abc'"),
    (["run", "--space", "dag", "--estimator", "nb201-table", "--storage",
      "sqlite:///study.db", "--n-trials", "2"],
     "estimator 'nb201-table' looks cells up in the NAS-Bench-201 table and cannot score "
     "architectures of search space 'dag'"),
    (["run", "--space", "nb201", "-o", "space.N=1", "-o", "space.C=8", "--estimator",
      "nb201-table", "--storage", "sqlite:///study.db", "--n-trials", "2"],
     "estimator 'nb201-table' holds the values of the benchmark network and cannot score space "
     "'nb201' with N=1, C=8; valid: N=5, C=16"),
    (["run", "--no-tracking", "--tracking-uri", "sqlite:///t.db", "--storage",
      "sqlite:///study.db"], "--tracking-uri sqlite:///t.db and --no-tracking contradict"),
    (["worker", "--n-trials", "x"], "argument --n-trials: invalid int value: 'x'"),
    (["nosuch"], "argument command: invalid choice: 'nosuch'"),
]


def test_bad_command_lines_are_one_line_exit_2_and_write_nothing(tmp_path):
    results = cli_cases([argv for argv, _ in BAD_INPUT], tmp_path,
                        env={**os.environ, "FRUGALNAS_PROGRESS": "1"})
    for (argv, message), result in zip(BAD_INPUT, results):
        assert result["rc"] == 2, (argv, result)
        assert result["err"].count("\n") == 1 and result["err"].startswith("frugalnas: error: "), \
            (argv, result["err"])
        assert message in result["err"], (argv, result["err"])
        assert "usage:" not in result["err"] and "Traceback" not in result["err"]
    # no study.db, no t.db, no mlflow.db (the suite's own default store was there before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default-mlflow.db"]


def test_space_and_estimator_mismatch_is_refused_before_the_storage_is_touched(tmp_path):
    db = tmp_path / "s.db"
    with pytest.raises(ConfigError, match="cannot score architectures of search space 'dag'"):
        frugalnas.create_study(space="dag", estimator="nb201-table",
                               storage=f"sqlite:///{db}", disable_plugins=["mlflow"])
    assert not db.exists()
    with pytest.raises(ConfigError, match="estimator 'supernet' needs a search space with "
                                          "weight sharing"):
        frugalnas.create_study(space="plain", estimator="supernet",
                               strategy=optuna.samplers.RandomSampler(),
                               disable_plugins=["mlflow"], host=_host_with_plain_space())


def _host_with_plain_space():
    """A host with the space ``plain``: NB201 cells without shared weights (as a third-party
    space that does not implement them)."""
    from frugalnas.host.plugins import PluginHost, hookimpl
    from frugalnas.spaces.nb201.space import NB201Space

    class PlainSpace(NB201Space):
        """NB201 cells without weight sharing."""

        capabilities = {}

    class Plugin:
        @hookimpl
        def frugalnas_search_spaces(self):
            return {"plain": PlainSpace}

    return PluginHost([Plugin()])


def test_plugins_given_as_one_string_are_one_name():
    with pytest.raises(PluginError, match="plugin 'nosuch' failed to import module 'nosuch'"):
        frugalnas.create_study(plugins="nosuch", disable_plugins="mlflow")
    study = frugalnas.create_study(disable_plugins="mlflow")
    assert "mlflow" not in study.host.infos and study.config.disable_plugins == ["mlflow"]


def test_progress_bar_shows_the_best_value_including_the_last_trial(capsys, monkeypatch):
    monkeypatch.setenv("FRUGALNAS_PROGRESS", "1")
    study = frugalnas.create_study(disable_plugins=["mlflow"], seed=3)
    study.optimize(n_trials=6)
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "6/6" in final and f"best={study.best_value:.4g}" in final, final
    assert err.count("best=") >= 6


def test_run_says_where_the_results_are(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "m.db")
    (result, memory) = cli_cases(
        [["run", "--storage", "sqlite:///s.db", "--study-name", "here", "--n-trials", "2",
          "--tracking-uri", uri, "-q"],
         ["run", "--n-trials", "1", "--no-tracking", "-q"]], tmp_path)
    assert result["rc"] == 0, result
    lines = [line for line in result["out"].splitlines() if line.startswith("results: ")]
    assert lines[0].startswith("results: optuna study 'here' in sqlite:///s.db")
    assert lines[1].startswith(f"results: MLflow experiment 'here' in {uri}")
    assert f"frugalnas ui --tracking-uri {uri} --study-name here" in lines[1]
    assert memory["rc"] == 0 and "the optuna study was in memory" in memory["out"]
    assert "MLflow" not in memory["out"]


def test_warm_start_shows_its_progress(capsys, monkeypatch):
    monkeypatch.setenv("FRUGALNAS_PROGRESS", "1")
    study = frugalnas.create_study(strategy="regularized-evolution", disable_plugins=["mlflow"],
                                   strategy_options={"warm_start_proxy": "params",
                                                     "warm_start_pool": 7, "n_init": 2})
    study.optimize(n_trials=1)
    err = capsys.readouterr().err
    assert "warm start: scoring 7 architectures by params" in err and "7/7" in err


def test_a_trial_failed_elsewhere_as_stale_does_not_kill_the_worker(tmp_path):
    """Another worker's stale check can fail a trial that still runs (its heartbeat starved on
    a loaded machine): ``frugalnas worker`` says so in one line and goes on to its quota."""
    import subprocess
    import textwrap

    url = f"sqlite:///{tmp_path / 'w.db'}"
    (tmp_path / "failed_elsewhere.py").write_text(textwrap.dedent(f'''
        import optuna
        from optuna.trial import TrialState

        from frugalnas.ports.estimator import Estimator, EstimateResult
        from frugalnas.host.plugins import hookimpl


        class FailedElsewhere(Estimator):
            """Trial 1 is failed in the storage while it runs, as a stale check does."""
            needs_dataset = False

            def evaluate(self, arch, context):
                if context.trial_number == 1:
                    study = optuna.load_study(study_name="w", storage={url!r})
                    trial = next(t for t in study.trials if t.number == 1)
                    storage = optuna.storages.RDBStorage({url!r})
                    storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
                return EstimateResult(value=float(context.trial_number))


        @hookimpl
        def frugalnas_estimators():
            return {{"failed-elsewhere": FailedElsewhere}}
    '''))
    proc = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "worker", "--storage", url, "--study-name",
         "w", "--n-trials", "4", "--estimator", "failed-elsewhere", "-p", "failed_elsewhere",
         "--no-tracking", "-q"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "failed as stale by another worker" in proc.stderr
    states = [t.state.name for t in optuna.load_study(study_name="w", storage=url).trials]
    assert states.count("COMPLETE") == 4 and states[1] == "FAIL", states


def _doc_blocks(language: str):
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S):
            yield path.name, block


def test_every_config_shown_in_the_docs_is_a_run_file_frugalnas_reads():
    import tomllib
    from dataclasses import fields

    from frugalnas.ports.config import RUN_KEYS, StudyConfig, check_keys

    assert not [name for lang in ("yaml", "yml") for name, _ in _doc_blocks(lang)]
    valid = [f.name for f in fields(StudyConfig)] + list(RUN_KEYS)
    blocks = list(_doc_blocks("toml"))
    assert len(blocks) >= 4
    for name, block in blocks:
        if block.lstrip().startswith("[project"):  # a plugin's pyproject.toml
            continue
        data = tomllib.loads(block)
        check_keys(f"a run file in {name}", data, valid)


def test_a_yaml_run_file_is_refused_saying_run_files_are_toml(tmp_path):
    from frugalnas.ports.config import load_run_file

    path = tmp_path / "config.yaml"
    path.write_text("backend: virtual-node\n")
    with pytest.raises(ConfigError, match="run files are TOML"):
        load_run_file(path)


def test_a_strategy_with_a_natural_end_sets_the_trials_to_run():
    study = frugalnas.create_study(
        space="dag", strategy="si-evolution", estimator="inherited", dataset="digits",
        space_options={"channels": 4, "nodes": 3, "reductions": 1},
        strategy_options={"population_size": 4, "generations": 2, "offspring": 3},
        disable_plugins=["mlflow"])
    assert study.trials_to_run(1000) == 4 + 2 * 3
    assert study.trials_to_run(5) == 5 and study.trials_to_run(None) == 10
    open_ended = frugalnas.create_study(disable_plugins=["mlflow"])
    assert open_ended.trials_to_run(1000) == 1000 and open_ended.trials_to_run(None) is None
