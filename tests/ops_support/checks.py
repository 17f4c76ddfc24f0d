"""Assertions shared by the operations tests: the storage holds exactly what the study
promises, and MLflow follows the storage."""

from __future__ import annotations

import warnings
from collections import defaultdict

import optuna
from mlflow import MlflowClient
from optuna.trial import TrialState


def mlflow_runs(uri: str, name: str):
    """(client, trial runs, parent runs) of study ``name``'s experiment."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    assert exp is not None, f"no MLflow experiment {name!r} in {uri}"
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    trial_runs = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    return client, trial_runs, parents


def assert_mlflow_follows_storage(storage: str, uri: str, name: str,
                                  artifacts: bool = True) -> None:
    """One run per finished trial, in the storage's final state, under the one parent run;
    nothing RUNNING; complete trials with their architecture, metrics and artifacts."""
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    client, trial_runs, parents = mlflow_runs(uri, name)
    assert len(parents) == 1, f"{len(parents)} parent runs"
    assert parents[0].info.status == "FINISHED"
    by_number: dict[int, list] = defaultdict(list)
    for r in trial_runs:
        by_number[int(r.data.tags["frugalnas.trial_number"])].append(r)
    finished = {t.number: t for t in trials if t.state.is_finished()}
    assert sorted(by_number) == sorted(finished), \
        f"runs for {sorted(set(by_number) ^ set(finished))} do not match finished trials"
    twice = {n: len(r) for n, r in by_number.items() if len(r) > 1}
    assert not twice, f"trials with several runs: {twice}"
    assert [r.info.run_id for r in trial_runs if r.info.status == "RUNNING"] == []
    for number, t in finished.items():
        run = by_number[number][0]
        assert run.data.tags["state"] == t.state.name, (number, run.data.tags, t.state)
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        if t.state == TrialState.COMPLETE:
            assert run.info.status == "FINISHED"
            assert run.data.params["architecture"] == t.user_attrs["architecture"]
            assert abs(run.data.metrics["objective_value"] - t.value) < 1e-9
            if artifacts:
                names = {a.path for a in client.list_artifacts(run.info.run_id)}
                assert {"architecture.json", "cell.png"} <= names, (number, names)
        else:
            assert run.info.status in ("FAILED", "KILLED") and run.data.tags["fail_reason"]


def assert_exactly_n_distinct(storage: str, name: str, n: int,
                              evaluated: set[int] | None = None) -> list:
    """``n`` COMPLETE trials with ``n`` distinct architectures, nothing RUNNING or WAITING.
    With ``evaluated`` (the trial numbers whose evaluation started), an architecture was
    evaluated twice only when a retry re-ran a trial that its dead worker never finished."""
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == n, \
        {s.name: states.count(s) for s in set(states)}
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    complete = [t.user_attrs["architecture"] for t in trials if t.state == TrialState.COMPLETE]
    assert len(set(complete)) == n, "an architecture is counted twice"
    if evaluated is not None:
        by_number = {t.number: t for t in trials}
        groups: dict[str, list] = defaultdict(list)
        for number in sorted(evaluated):
            t = by_number[number]
            groups[t.user_attrs.get("architecture")].append(t)
        for arch, group in groups.items():
            for later in group[1:]:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    retried = optuna.storages.RetryFailedTrialCallback.retried_trial_number(later)
                assert retried is not None and by_number[retried].state == TrialState.FAIL, \
                    f"{arch} evaluated by trials {[t.number for t in group]}, not as a retry"
    return trials
