"""The optuna compatibility layer reads a storage through frugalnas's worker wrapper."""

from __future__ import annotations

import optuna
from optuna.storages import InMemoryStorage, RDBStorage

from frugalnas.ports import optuna_compat
from frugalnas.distribution.quota_storage import QuotaStorage


def _quota_study(inner, url):
    storage = QuotaStorage(inner, url, n_trials=5)
    return optuna.create_study(storage=storage, study_name="wrapped"), storage


def test_the_worker_storage_is_a_declared_wrapper_read_through():
    study, storage = _quota_study(InMemoryStorage(), None)
    assert isinstance(storage, optuna_compat.StorageWrapper)
    assert optuna_compat.unwrapped(storage) is storage.inner
    assert optuna_compat.unwrapped(storage.inner) is storage.inner
    assert optuna_compat.is_in_memory(study)
    assert optuna_compat.storage_url(study) is None

    feed = optuna_compat.TrialFeed()
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    assert [t.number for t in feed.read(study)] == [0, 1, 2]
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert [t.number for t in feed.read(study)] == [3, 4]  # only what is new
    assert feed.read(study) == []


def test_a_wrapped_database_is_not_in_memory_and_keeps_its_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    study, _ = _quota_study(RDBStorage(url), url)
    assert not optuna_compat.is_in_memory(study)
    assert optuna_compat.storage_url(study) == url
    plain = optuna.create_study(storage=url, study_name="plain")
    assert not optuna_compat.is_in_memory(plain)
    assert optuna_compat.storage_url(plain) == url
    assert optuna_compat.is_in_memory(optuna.create_study())
