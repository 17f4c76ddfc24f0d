"""The typed lifecycle contract: one frozen TrialReport per finished trial, built once by the
study's TrialRunner (or from the storage for a stale trial), the same report mapped once to an
MLflow run, and one stop rule for Study.optimize and the workers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import frugalnas
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.cost import Cost
from frugalnas.engine.runner import STALE_REASON, TrialRunner
from frugalnas.ports.trial_report import TrialReport

REPO = Path(__file__).resolve().parents[2]
OFF = {"disable_plugins": ["mlflow", "progress"]}
SMALL = {"N": 1, "C": 4}


class Scored(frugalnas.Estimator):
    """A quick estimator with a metric, a cost and an artifact; fails when asked to."""

    needs_dataset = False
    provides = ("m",)

    def __init__(self, fail: bool = False):
        self.fail = fail

    def evaluate(self, arch, context):
        if self.fail:
            raise RuntimeError("no score for " + arch.space)
        return frugalnas.EstimateResult(value=float(len(str(arch)) % 7),
                                        metrics={"m": 2.5, "n": np.float32(0.5), "k": 3},
                                        cost=Cost(seconds=0.25, params=5),
                                        artifacts={"note.txt": "hello"})


class Recorder:
    """A lifecycle plugin keeping every report, plus the estimator above."""

    __name__ = "recorder"

    def __init__(self):
        self.reports: list[TrialReport] = []

    @frugalnas.hookimpl
    def frugalnas_estimators(self):
        return {"scored": Scored}

    @frugalnas.hookimpl
    def frugalnas_trial_finished(self, study, report):
        self.reports.append(report)


def _study(recorder, **kwargs):
    return frugalnas.create_study(space="nb201", space_options=SMALL, estimator="scored",
                                  dataset=None, plugins=[recorder], **OFF, **kwargs)


def test_the_hook_gets_one_frozen_report_per_trial_that_the_storage_rebuilds():
    recorder = Recorder()
    study = _study(recorder, constraints={"m": 3.0})
    study.optimize(n_trials=3)
    assert [r.number for r in recorder.reports] == [0, 1, 2]
    report = recorder.reports[0]
    assert report.state is TrialState.COMPLETE
    frozen = study.optuna_study.trials[0]
    assert report.values == tuple(frozen.values)
    assert report.architecture == study.trials[0].architecture
    assert report.architecture_text == frozen.user_attrs["architecture"]
    assert dict(report.metrics) == {"value": frozen.values[0], "m": 2.5, "n": 0.5, "k": 3.0}
    assert all(type(v) is float for v in report.metrics.values())
    assert report.cost == Cost(seconds=0.25, params=5)
    assert dict(report.artifacts) == {"note.txt": "hello"}
    assert report.error is None and report.feasible is True
    assert report.started is not None and report.started <= report.finished
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.state = TrialState.FAIL  # type: ignore[misc]
    with pytest.raises(TypeError):
        report.metrics["m"] = 0.0  # type: ignore[index]

    # the runner's report is the one the constructor makes of the same fields
    assert TrialReport(**{f.name: getattr(report, f.name)
                          for f in dataclasses.fields(report)}) == report
    assert report.intermediate == {} and report.cost is not None

    # from the storage alone: the same report, without the artifacts the storage never had
    rebuilt = TrialReport.from_frozen(frozen, study.space, study.config.objectives)
    assert dataclasses.replace(rebuilt, artifacts=report.artifacts,
                               finished=report.finished) == report


def test_failed_and_pruned_trials_and_ask_tell_get_reports():
    recorder = Recorder()
    study = _study(recorder, estimator_options={"fail": True})
    study.optimize(n_trials=1)
    failed = recorder.reports[-1]
    assert failed.state is TrialState.FAIL and failed.values is None and failed.cost is None
    assert failed.error == "RuntimeError: no score for nb201"
    assert TrialReport.from_frozen(study.optuna_study.trials[0], study.space,
                                   study.config.objectives).error == failed.error

    candidate = study.ask()
    study.tell(candidate, 1.5)
    told = recorder.reports[-1]
    assert (told.number, told.state, told.values) == (candidate.number, TrialState.COMPLETE,
                                                      (1.5,))
    assert told.architecture == candidate.architecture
    candidate = study.ask()
    study.tell(candidate, 2.0, state=TrialState.PRUNED)
    assert recorder.reports[-1].state is TrialState.PRUNED and recorder.reports[-1].values is None
    study.finish()
    with pytest.raises(ValueError, match="finished trial"):
        TrialReport(number=0, state=TrialState.RUNNING, architecture=None)


def test_a_stale_trial_is_reported_from_the_storage():
    recorder = Recorder()
    study = _study(recorder)
    study.optimize(n_trials=1)
    ostudy = study.optuna_study
    trial = ostudy.ask()
    arch = study.space.suggest(trial)
    trial.set_user_attr("architecture", str(arch))
    ostudy.tell(trial, state=TrialState.FAIL)
    study.report_stale_trial(ostudy.trials[-1])
    stale = recorder.reports[-1]
    assert (stale.number, stale.state, stale.error) == (trial.number, TrialState.FAIL,
                                                        STALE_REASON)
    assert stale.architecture == arch and dict(stale.artifacts) == {}
    # a trial killed before its architecture was recorded: nothing to report yet
    broken = ostudy.ask()
    ostudy.tell(broken, state=TrialState.FAIL)
    study.report_stale_trial(ostudy.trials[-1])
    assert recorder.reports[-1] is stale


def test_one_stop_rule_for_optimize_and_the_worker(tmp_path, monkeypatch):
    from frugalnas.distribution.worker import run_worker

    def over_after_two(self):
        return len(self.study.optuna_study.get_trials(deepcopy=False,
                                                      states=(TrialState.COMPLETE,))) >= 2

    study = frugalnas.create_study(**OFF)
    rule = study.runner.stop_rule()
    assert isinstance(study.runner, TrialRunner) and not rule.needed  # random never stops
    own = study.runner.stop_rule(lambda frozen: "mine" if frozen.number >= 1 else None)
    study.optimize(n_trials=5, callbacks=[own])
    assert own.reason == "mine" and len(study.trials) == 2

    monkeypatch.setattr(TrialRunner, "search_is_over", over_after_two)
    monkeypatch.setattr("frugalnas.ports.strategy.can_stop", lambda sampler: True)
    study = frugalnas.create_study(**OFF)
    study.optimize(n_trials=5)
    assert len(study.trials) == 2
    config = StudyConfig(space="nb201", estimator="nb201-table",
                         disable_plugins=["mlflow", "progress"])
    storage = f"sqlite:///{tmp_path / 'w.db'}"
    worker = run_worker(config, storage, "w", 5)
    assert len(worker.trials) == 2 and not worker.runner.started


def test_live_and_reconciled_runs_of_a_trial_are_the_same(stores, tmp_path):
    """The tracker writes a run from the report the study hands it; the reconciliation
    writes one from the report it rebuilds from the storage: one mapping, the same run."""
    from frugalnas.testing import fresh_mlflow_uri
    from ops_support.checks import mlflow_runs

    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="same",
                                   plugin_options={"mlflow": {"tracking_uri": uri}},
                                   disable_plugins=["progress"])
    study.optimize(n_trials=3)
    other = fresh_mlflow_uri(tmp_path / "other.db")
    again = frugalnas.load_study(study_name="same", storage=storage,
                                 plugin_options={"mlflow": {"tracking_uri": other}})
    again.optimize(n_trials=0)
    assert again.plugin_state["mlflow"]["reconciled"]["created"] == 3

    def content(tracking):
        _, runs, _ = mlflow_runs(tracking, "same")
        ignored = ("mlflow.parentRunId", "frugalnas.study_id")
        return {r.data.tags["frugalnas.trial_number"]: (
            r.info.status, r.data.params, r.data.metrics,
            {k: v for k, v in r.data.tags.items() if k not in ignored
             and not k.startswith("mlflow.")}) for r in runs}

    assert content(uri) == content(other)


#: The modules that may reach a study's private parts: the study itself, its trial runner
#: and the one module that touches optuna's internals.
STUDY_INSIDE = {"frugalnas/engine/study.py", "frugalnas/engine/runner.py",
                "frugalnas/ports/optuna_compat.py"}


def test_no_caller_outside_the_study_touches_a_private_part_of_a_study():
    private = re.compile(r"\bstudy\._[a-z]")
    roots = [REPO / "frugalnas", REPO / "tests", REPO / "benchmarks", REPO / "examples"]
    users = sorted(str(p.relative_to(REPO)) for root in roots if root.exists()
                   for p in root.rglob("*.py")
                   if str(p.relative_to(REPO)) not in STUDY_INSIDE
                   and p.name != Path(__file__).name
                   and private.search(p.read_text()))
    assert users == [], users


def test_optuna_is_told_every_trial_through_the_runner():
    """Study.optimize hands optuna the runner's objective (no private method of Study)."""
    seen = []

    class Spy(TrialRunner):
        def run(self, trial: optuna.Trial):
            seen.append(trial.number)
            return super().run(trial)

    study = frugalnas.create_study(**OFF)
    study.runner = Spy(study)
    study.optimize(n_trials=2)
    assert seen == [0, 1]
