"""Isolation covers a user's define-by-run builder: one defined in the script being run
(``__main__``) reaches the evaluation process by value, one that cannot travel is refused
(``process``) or run in-process with one warning (``auto``), and one that aborts the process
for some architectures never takes ``frugalnas run --isolate process`` down, neither while
the space's decisions are discovered nor while a trial is proposed.

Real processes: a Python script run as ``__main__`` and ``frugalnas run`` with
``tests/ops_support/builders.py``'s ``mixed_abort`` builder, which calls ``os.abort()``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ops_support.chaos import env_with_tests

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import os
    import sys
    import threading

    import frugalnas
    from torch import nn

    LOCK = threading.RLock()  # a builder that uses it cannot be pickled


    def tiny(trial, widths=(4, 8)):
        with open(os.environ["BUILDER_PIDS"], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        width = trial.suggest_categorical("width", list(widths))
        return nn.Sequential(nn.Conv2d(trial.in_channels, width, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(width, trial.num_classes))


    def locked(trial, widths=(4, 8)):
        with LOCK:
            return tiny(trial, widths)


    if __name__ == "__main__":
        mode, builder = sys.argv[1], {"tiny": tiny, "locked": locked}[sys.argv[2]]
        study = frugalnas.create_study(space=builder, estimator="train", dataset="digits",
                                       estimator_options={"epochs": 1}, seed=0)
        try:
            study.optimize(n_trials=2, isolate=mode)
        except frugalnas.ConfigError as exc:
            print(f"refused: {exc}")
            print(f"trials: {len(study.trials)}")
            sys.exit(2)
        print("states:", " ".join(t.state.name for t in study.trials))
        print("best:", study.best_trial.architecture)
''')


def _script(tmp_path: Path, mode: str, builder: str) -> tuple[subprocess.CompletedProcess, set]:
    script = tmp_path / "search.py"
    script.write_text(SCRIPT)
    pids = tmp_path / f"{mode}-{builder}.pids"
    env = {**env_with_tests(TESTS), "BUILDER_PIDS": str(pids)}
    proc = subprocess.Popen([sys.executable, str(script), mode, builder], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    seen = {int(p) for p in pids.read_text().split()} if pids.exists() else set()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), \
        {p for p in seen if p != proc.pid}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["process", "auto"])
def test_a_builder_defined_in_the_running_script_reaches_the_evaluation_process(tmp_path, mode):
    proc, elsewhere = _script(tmp_path, mode, "tiny")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "states: COMPLETE COMPLETE" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert elsewhere, "the builder never ran outside the script's process"


@pytest.mark.slow
def test_a_builder_that_cannot_travel_is_refused_or_run_in_process_with_one_warning(tmp_path):
    refused, elsewhere = _script(tmp_path, "process", "locked")
    assert refused.returncode == 2, refused.stdout + refused.stderr[-3000:]
    lines = [line for line in refused.stdout.splitlines() if line.startswith("refused: ")]
    assert len(lines) == 1, refused.stdout
    assert "'__main__:locked'" in lines[0] and "isolate 'none'" in lines[0], lines[0]
    assert "trials: 0" in refused.stdout and not elsewhere

    auto, elsewhere = _script(tmp_path, "auto", "locked")
    assert auto.returncode == 0, auto.stderr[-3000:]
    assert "states: COMPLETE COMPLETE" in auto.stdout
    warnings = [line for line in auto.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "'__main__:locked'" in warnings[0], auto.stderr[-3000:]
    assert not elsewhere  # evaluated in the script's own process


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "frugalnas.cli.main", "run", "-q", "-p", "ops_support.builders",
           "--space", "ops_support.builders:mixed_abort", "--estimator", "ops-build",
           "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "b",
           "--no-tracking", "--isolate", "process", "--seed", "0", *extra]
    return subprocess.run(cmd, cwd=tmp_path, env=env_with_tests(TESTS), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_builder_that_aborts_during_discovery_is_one_line(tmp_path):
    proc = _run(tmp_path, "--n-trials", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("frugalnas: error: builder ops_support.builders:mixed_abort "
                               "failed after deciding width0="), lines[0]
    assert "width1=" in lines[0] and "SIGABRT" in lines[0], lines[0]
    assert not (tmp_path / "optuna.db").exists()  # refused before anything is written


@pytest.mark.slow
def test_a_builder_that_aborts_while_a_trial_is_proposed_fails_that_trial(tmp_path):
    # Without random discovery the builder's first and last choices are replayed (whole
    # networks): the crash comes while the strategy proposes.
    proc = _run(tmp_path, "-o", "space.discovery=0", "--n-trials", "6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    study = optuna.load_study(study_name="b", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 6 and not any(t.state == TrialState.RUNNING for t in trials)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert failed and done
    for t in failed:  # the strategy's own replay of the architecture it drew crashed
        reason = t.user_attrs["fail_reason"]
        found = re.match(r"ConfigError: builder ops_support\.builders:mixed_abort failed after "
                         r"deciding width0=(\d+), width1=(\d+): BuilderCrash: its process was "
                         r"killed by SIGABRT$", reason)
        assert found and found[1] != found[2], reason
    assert all(t.params["width0"] == t.params["width1"] for t in done)
