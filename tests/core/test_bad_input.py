"""Bad input, one case per kind: each error names the bad value (and the valid ones where the
set is finite). Complements tests/core/test_errors.py (unknown component names, config-key typos,
directions, a few option values), which these cases do not repeat."""

from __future__ import annotations

import pytest

import frugalnas
from frugalnas import ArchitectureParseError, ConfigError
from frugalnas.cli.main import main
from frugalnas.ports.errors import PluginError

NB201_OPS = ["none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3"]


@pytest.mark.parametrize("kwargs, error, fragments", [
    # config keys inside component option tables
    ({"space_options": {"C2": 8}}, ConfigError, ["'C2'", "nb201", "C, N"]),
    ({"estimator": "train", "estimator_options": {"epoch": 1}}, ConfigError,
     ["'epoch'", "epochs", "batch_size", "lr"]),
    ({"strategy": "regularized-evolution", "strategy_options": {"pop": 3}}, ConfigError,
     ["'pop'", "population_size", "sample_size"]),
    ({"estimator": "train", "dataset_options": {"valid_frac": 0.1}}, ConfigError,
     ["'valid_frac'", "digits", "valid_fraction"]),
    ({"space_options": [8]}, ConfigError, ["space_options", "[8]", "table/dict"]),
    ({"seed": "abc"}, ConfigError, ["seed 'abc'", "integer"]),
    # option ranges of built-in components
    ({"space_options": {"C": 0}}, ConfigError, ["C (channels) 0", "[1, inf]"]),
    ({"estimator": "train", "estimator_options": {"lr": -1.0}}, ConfigError, ["lr -1.0", "[0, inf]"]),
    ({"estimator": "train", "estimator_options": {"batch_size": 0}}, ConfigError, ["batch_size 0", "[1, inf]"]),
    ({"strategy": "regularized-evolution", "strategy_options": {"population_size": 1}}, ConfigError,
     ["population_size 1", "[2, inf]"]),
    ({"strategy": "regularized-evolution", "strategy_options": {"population_size": 4, "sample_size": 9}},
     ConfigError, ["sample_size 9", "[1, 4]"]),
    ({"strategy": "regularized-evolution", "strategy_options": {"n_init": 0}}, ConfigError, ["n_init 0"]),
    ({"trial_timeout": -1}, ConfigError, ["trial_timeout -1", "seconds > 0"]),
    # component names given as options or plugins
    ({"strategy": "regularized-evolution", "strategy_options": {"warm_start_proxy": "synflw"}},
     ConfigError, ["'synflw'", "synflow", "naswot"]),
    ({"plugins": ["no_such_plugin_module"]}, PluginError, ["'no_such_plugin_module'", "No module"]),
])
def test_bad_study_settings(kwargs, error, fragments):
    with pytest.raises(error) as info:
        frugalnas.create_study(disable_plugins=["mlflow"], **kwargs)
    for f in fragments:
        assert f in str(info.value)


@pytest.mark.parametrize("text, fragments", [
    ("|none~0|+|none~0|none~1|", ["'|none~0|+|none~0|none~1|'", "expected 3 nodes", "got 2"]),
    ("|none~1|+|none~0|none~1|+|none~0|none~1|none~2|", ["'none~1'", "node 1", "'OP~0'"]),
    ("|none~0|+|none~0|none~1|+|none~0|none~1|none~2|none~3|", ["node 3 needs 3 inputs, got 4"]),
    ("", ["''", *NB201_OPS]),
])
def test_bad_architecture_strings(text, fragments):
    study = frugalnas.create_study(disable_plugins=["mlflow"])
    with pytest.raises(ArchitectureParseError) as info:
        study.evaluate(text)
    for f in fragments:
        assert f in str(info.value)


def _cli(capsys, *argv: str) -> str:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, fragments", [
    (["run", "--n-trials", "ten"], ["--n-trials", "invalid int value: 'ten'"]),
    (["run", "--direction", "maximise"], ["'maximise'", "maximize", "minimize"]),
    (["run", "-o", "estimatr.epochs=2"], ["'estimatr'", "space, strategy, estimator, backend, dataset"]),
    (["run", "-o", "epochs=2"], ["'epochs=2'", "GROUP.KEY=VALUE"]),
    (["run", "--seed", "1.5"], ["--seed", "invalid int value: '1.5'"]),
    (["run", "--trial-timeout", "0", "--dry-run"], ["trial_timeout 0", "seconds > 0"]),
    (["ui", "--port", "http"], ["--port", "invalid int value: 'http'"]),
])
def test_bad_cli_flags(capsys, argv, fragments):
    err = _cli(capsys, *argv)
    for f in fragments:
        assert f in err


WORKER = ["worker", "--no-tracking", "-q", "--study-name", "bad"]


@pytest.mark.parametrize("extra, fragments", [
    # storage URLs
    (["--storage", "redis://localhost/0", "--n-trials", "3"],
     ["'redis://localhost/0'", "sqlite:///PATH", "journal:PATH", "postgresql://"]),
    (["--storage", "study.db", "--n-trials", "3"], ["'study.db'", "sqlite:///PATH"]),
    (["--n-trials", "3"], ["needs a shared storage URL", "--storage sqlite:///"]),
    # worker settings
    (["--storage", "sqlite:///w.db"], ["needs the study's total number of trials", "--n-trials"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "0"], ["n_trials 0", ">= 1"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "3", "--heartbeat", "0"], ["heartbeat (seconds) 0", "[1, inf]"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "3", "--heartbeat", "2", "--grace", "1"],
     ["grace 1", "heartbeat interval (2 s)"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "3", "--grace", "5"], ["grace 5", "--heartbeat"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "3", "--heartbeat", "1", "--retries", "-1"],
     ["retries -1", "[0, inf]"]),
    (["--storage", "sqlite:///w.db", "--n-trials", "3", "--retries", "2"], ["retries 2", "--heartbeat"]),
    (["--storage", "journal:w.log", "--n-trials", "3", "--heartbeat", "1"],
     ["heartbeats need an RDB storage", "'journal:w.log'"]),
])
def test_bad_worker_settings_and_storage_urls(capsys, tmp_path, extra, fragments):
    err = _cli(capsys, *WORKER, *extra)
    for f in fragments:
        assert f in err, err
