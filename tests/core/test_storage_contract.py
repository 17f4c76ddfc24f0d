"""The worker's storages keep optuna's storage contract: what
``make_storage(url)`` and ``QuotaStorage(make_storage(url))`` give a worker behaves as optuna's
``RDBStorage`` for pickling and copies (a study sent to another process), settings, argument
checks and stale detection. Real sqlite files and a real PostgreSQL server, real processes;
no mocks. optuna's own storage tests run against both in tests/core/test_optuna_storage_suite.py."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import time
import warnings

import optuna
import pytest
from optuna.storages import RDBStorage, RetryFailedTrialCallback
from optuna.trial import TrialState

from frugalnas.distribution.quota_storage import QuotaStorage, make_storage
from frugalnas.ports.errors import ConfigError

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}"
    return request.getfixturevalue("postgres_server").new_database("contract")


def _quota(url: str, **kwargs) -> QuotaStorage:
    return QuotaStorage(make_storage(url, **kwargs), url, 10**6)  # type: ignore[abstract]


def _tell_in_child(study: optuna.Study, number: int, value: float) -> None:
    study.tell(number, value)


def test_a_quota_storage_and_its_study_pickle_deepcopy_and_travel_to_another_process(url):
    storage = _quota(url, heartbeat=1, grace=3)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.suggest_float("x", 0, 1)

    again = pickle.loads(pickle.dumps(storage))
    assert isinstance(again, QuotaStorage) and again.inner.url == storage.inner.url
    assert again.get_heartbeat_interval() == 1 and again.inner.grace_period == 3
    assert again.lock is storage.lock  # one lock object per URL in a process
    copied = copy.deepcopy(study)
    assert [t.number for t in copied.trials] == [0]

    # optuna's test_tell_from_another_process: the study travels pickled to a new process.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(_tell_in_child, (study, trial.number, 1.5))
    assert study.trials[0].state == TrialState.COMPLETE and study.trials[0].value == 1.5
    # The storage still works here after its copies: new trials under the quota.
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(study.trials) == 3


def test_settings_written_on_the_wrapper_reach_the_inner_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = _quota(url)
    assert storage.get_heartbeat_interval() is None

    def on_stale(study, trial):
        pass

    storage.heartbeat_interval = 2
    storage.grace_period = 5
    storage.heartbeat_stale_trial_callback = on_stale
    storage.failed_trial_callback = on_stale
    inner = storage.inner
    assert isinstance(inner, RDBStorage)
    assert (inner.heartbeat_interval, inner.grace_period) == (2, 5)
    assert inner.heartbeat_stale_trial_callback is on_stale
    assert inner.failed_trial_callback is on_stale
    assert storage.get_heartbeat_interval() == 2
    assert storage.get_heartbeat_stale_trial_callback() is on_stale
    assert "heartbeat_interval" not in vars(storage)  # one value, the inner storage's
    storage.n_trials = 7  # the wrapper's own settings stay its own
    assert storage.n_trials == 7 and not hasattr(inner, "n_trials")


@pytest.mark.parametrize("where", ["sqlite", "journal", "dask"])
@pytest.mark.parametrize("heartbeat, grace, text", [
    (None, 5, "invalid grace 5 without a heartbeat"),
    (2, 0, "invalid grace 0"),
    (2, -1, "invalid grace -1"),
    (-1, None, "invalid heartbeat -1"),
    (0, None, "invalid heartbeat 0"),
    (1.5, None, "invalid heartbeat 1.5"),
])
def test_make_storage_checks_its_arguments_as_optuna_does(tmp_path, where, heartbeat, grace,
                                                          text):
    url = {"sqlite": f"sqlite:///{tmp_path / 'optuna.db'}",
           "journal": f"journal:{tmp_path / 'j.log'}",
           "dask": "dask:tcp://127.0.0.1:9"}[where]  # refused before any connection
    with pytest.raises(ConfigError) as info:
        make_storage(url, heartbeat=heartbeat, grace=grace)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message
    assert text in message and ">= 1" in message, message
    assert not (tmp_path / "optuna.db").exists()


def test_make_storage_keeps_the_grace_it_is_given(tmp_path):
    storage = make_storage(f"sqlite:///{tmp_path / 'optuna.db'}", heartbeat=3, grace=4)
    assert (storage.heartbeat_interval, storage.grace_period) == (3, 4)
    storage = make_storage(f"sqlite:///{tmp_path / 'two.db'}", heartbeat=3)
    assert (storage.heartbeat_interval, storage.grace_period) == (3, 6)


@pytest.mark.parametrize("wrapped", [False, True], ids=["make_storage", "QuotaStorage"])
def test_an_asked_and_abandoned_trial_goes_stale_and_is_retried(url, wrapped):
    """A live process asks a trial and never tells it: after the grace, optuna's stale check
    (run by the next optimize) fails it, calls the stale callback and queues the retry."""
    called = []

    def on_stale(study, frozen):
        called.append(frozen.number)
        RetryFailedTrialCallback(max_retry=1)(study, frozen)

    storage = make_storage(url, heartbeat=1, grace=2, on_stale=on_stale)
    if wrapped:
        storage = QuotaStorage(storage, url, 10**6)  # type: ignore[abstract]
    study = optuna.create_study(storage=storage, study_name="s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # optuna: heartbeats expect optimize
        abandoned = study.ask()
    abandoned.suggest_float("x", 0, 1)
    storage.record_heartbeat(abandoned._trial_id)  # as optuna's test_heartbeat does
    time.sleep(4)  # the grace, and more, in a process that is alive
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    states = [t.state for t in study.trials]
    assert states[0] == TrialState.FAIL and called == [0], states
    retried = [t for t in study.trials
               if RetryFailedTrialCallback.retried_trial_number(t) == 0]
    assert len(retried) == 1 and retried[0].params == study.trials[0].params
    assert TrialState.RUNNING not in states


def test_the_inner_rdb_storage_is_reachable_as_documented(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    plain = make_storage(url, heartbeat=1)
    assert isinstance(plain, RDBStorage)
    assert isinstance(_quota(url).inner, RDBStorage)
