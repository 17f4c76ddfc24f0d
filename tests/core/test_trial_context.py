"""The estimator's port: a TrialContext is all an estimator receives from its study. It gives
no attribute holding the study, the optuna study or the trial; its history and store are the
storage's (a reopened study reads them); outside a study it works with none."""

import random
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import (EstimateResult, Estimator, MemoryStore, PastTrial,
                                      TrialContext)
from frugalnas.engine.trial_context import OptunaTrialContext, StudyTrialContext
from frugalnas.spaces.nb201.space import NB201Space

OFF = {"disable_plugins": ["mlflow", "progress"]}


class Recorder(Estimator):
    """Keeps the context of each evaluation and reports two steps."""

    name = "recorder"
    needs_dataset = False

    def __init__(self):
        self.contexts: list[TrialContext] = []

    def evaluate(self, arch, context):
        self.contexts.append(context)
        for step in (1, 2):
            context.report(step, {"value": float(step)})
        context.log_metrics({"recorded": 1.0}, step=len(self.contexts))
        return EstimateResult(value=float(len(str(arch))), metrics={"seen": 1.0})


class RecorderPlugin:
    """Registers the estimator above and keeps the study-level metrics."""

    __name__ = "port-recorder"

    def __init__(self):
        self.metrics: list[tuple[dict, int]] = []

    @frugalnas.hookimpl
    def frugalnas_estimators(self):
        return {"recorder": Recorder}

    @frugalnas.hookimpl
    def frugalnas_study_metrics(self, study, metrics, step):
        self.metrics.append((dict(metrics), step))


def _recording_study(**kwargs):
    plugin = RecorderPlugin()
    study = frugalnas.create_study(space="nb201", estimator="recorder", dataset=None,
                                   plugins=[plugin], **OFF, **kwargs)
    return study, plugin


def _forbidden(value):
    from frugalnas.engine.study import Study

    return isinstance(value, (Study, optuna.Study, optuna.Trial, optuna.trial.FrozenTrial,
                              optuna.storages.BaseStorage))


def test_an_estimator_gets_no_attribute_giving_the_study_or_the_trial(tmp_path):
    study, _ = _recording_study(storage=f"sqlite:///{tmp_path / 'port.db'}", study_name="port")
    study.optimize(2)
    context = study.estimator.contexts[-1]
    assert isinstance(context, TrialContext)
    for name in ("study", "trial", "optuna_study", "storage"):
        assert not hasattr(context, name), name
    public = [n for n in dir(context) if not n.startswith("_")]
    for name in public:
        if name == "dataset":  # loaded on first use (this study has none)
            continue
        value = getattr(context, name)
        assert not _forbidden(value), (name, value)
    assert context.trial_number == 1 and context.study_name == "port"
    assert context.directions == ("maximize",)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def test_the_history_is_the_storage_s_and_survives_a_reopened_sqlite_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'h.db'}"
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", dataset=None,
                                   storage=storage, study_name="h", **OFF)
    study.optimize(3)
    study.context().store.write("recorder:note", {"generation": [1, 2]})

    reopened = frugalnas.load_study(study_name="h", storage=storage)
    context = reopened.context()
    assert context.trial_number is None
    history = context.history()
    assert [t.number for t in history] == [0, 1, 2]
    assert all(isinstance(t, PastTrial) and t.state is TrialState.COMPLETE for t in history)
    for past, record in zip(history, study.completed_trials()):
        assert past.architecture == str(record.architecture)
        assert past.values == tuple(record.values)
        assert past.metrics == record.user_attrs["metrics"]
    assert reopened.context().history(states=(TrialState.FAIL,)) == []
    assert len(context.history(states=None)) == 3
    # a copy: changing it changes nothing in the study
    history[0].metrics.clear()
    assert context.history()[0].metrics

    assert context.store.get("recorder:note") == {"generation": [1, 2]}
    assert context.store.identity == reopened.context().store.identity
    assert "frugalnas_config" not in context.store.read()
    with pytest.raises(ConfigError, match="frugalnas's own"):
        context.store.write("frugalnas_config", {})

    assert context.artifact_dir("recorder") == tmp_path / "h-recorder"
    assert context.artifact_file("h.x.pt") == tmp_path / "h.db.h.x.pt"


def test_reports_go_to_the_study_s_pruner_and_metrics_to_its_plugins():
    study, plugin = _recording_study(pruner="median")
    study.optimize(1)
    frozen = study.optuna_study.trials[0]
    assert frozen.intermediate_values == {1: 1.0, 2: 2.0}
    assert plugin.metrics == [({"recorded": 1.0}, 1)]


def test_outside_a_study_the_context_has_no_history_and_reports_nothing():
    context = TrialContext(space=NB201Space(), backend=None)
    assert context.trial_number is None and context.study_name is None
    assert context.history() == [] and context.history(states=None) == []
    assert context.artifact_dir("x") is None and context.artifact_file("x") is None
    context.report(1, {"value": 1.0})  # nothing to report to
    context.log_metrics({"m": 1.0}, 0)
    assert isinstance(context.store, MemoryStore)
    context.store.write("k", [1, 2])
    assert context.store.get("k") == [1, 2] and context.store.get("other") is None
    result = Recorder().evaluate(NB201Space().sample(random.Random(0)), context)
    assert result.value > 0
    with pytest.raises(ValueError, match="needs a dataset"):
        context.dataset


def test_a_study_evaluation_outside_a_trial_has_the_study_but_no_trial_number(tmp_path):
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", dataset=None,
                                   storage=f"sqlite:///{tmp_path / 'e.db'}", study_name="e",
                                   **OFF)
    study.optimize(1)
    context = study.context()
    assert isinstance(context, StudyTrialContext)
    assert context.trial_number is None and context.study_name == "e"
    context.report(1, {"value": 1.0})  # no trial: nothing is reported
    assert len(context.history()) == 1


def test_a_bare_optuna_trial_drives_an_estimator_through_the_port_adapter():
    space = NB201Space()
    estimator = Recorder()
    pruned_before: list[list[int]] = []

    def objective(trial):
        arch = space.suggest(trial)
        context = OptunaTrialContext.of(trial, space=space, backend=None)
        assert context.trial_number == trial.number and context.study_name == "bare"
        assert not hasattr(context, "trial") and not hasattr(context, "study")
        assert isinstance(context.artifact_dir("x"), Path)
        pruned_before.append([t.number for t in context.history(states=(TrialState.PRUNED,))])
        return estimator.evaluate(arch, context).value

    ostudy = optuna.create_study(study_name="bare", direction="maximize",
                                 pruner=optuna.pruners.ThresholdPruner(upper=1.5))
    ostudy.optimize(objective, n_trials=2)
    # the second report (2.0) crosses the pruner's threshold: optuna.TrialPruned
    assert [t.state for t in ostudy.trials] == [TrialState.PRUNED] * 2
    assert ostudy.trials[0].intermediate_values == {1: 1.0, 2: 2.0}
    assert pruned_before == [[], [0]]
