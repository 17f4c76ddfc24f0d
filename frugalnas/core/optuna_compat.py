"""The one place frugalnas touches optuna internals. Every call here has no public equivalent
in the supported optuna range (``SUPPORTED_OPTUNA`` below, declared in pyproject.toml); a test
runs each against the installed optuna, so an upgrade that breaks one fails there, not in a
user's study."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

__all__ = ["SUPPORTED_OPTUNA", "BaseHeartbeat", "storage_of", "trial_id", "set_trial_system_attr",
           "fresh_trials", "storage_url", "heartbeat_interval"]

#: The optuna versions frugalnas is tested with (lower bound inclusive, upper exclusive).
SUPPORTED_OPTUNA = ("4.0", "6.0")

try:  # optuna >= 4: heartbeats live in a private module; there is no public alias.
    from optuna.storages._heartbeat import BaseHeartbeat
except ImportError:  # pragma: no cover - outside the supported range
    BaseHeartbeat = None  # type: ignore[assignment,misc]


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage behind ``study`` (``optuna.Study`` keeps it private)."""
    return study._storage


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    """The storage id of a trial (optuna exposes only its number)."""
    return trial._trial_id


def set_trial_system_attr(study: optuna.Study, trial: FrozenTrial | optuna.Trial, key: str,
                          value: Any) -> None:
    """Record a system attribute on a trial from inside a sampler, where only the frozen trial
    is at hand (``optuna.Trial.set_system_attr`` is deprecated and not available there)."""
    storage_of(study).set_trial_system_attr(trial_id(trial), key, value)


def fresh_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Every trial of ``study`` read from its storage now, bypassing the per-process cache,
    so trials written by other workers since the last read are included."""
    return study._get_trials(deepcopy=False, use_cache=False)


def storage_url(study: optuna.Study) -> str | None:
    """The database URL of an RDB storage (``None`` for other storages)."""
    storage = storage_of(study)
    inner = getattr(storage, "inner", storage)  # frugalnas's quota wrapper keeps it as .inner
    url = getattr(inner, "url", None)
    if url is None:
        url = getattr(getattr(inner, "_backend", None), "url", None)
    return url


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """The heartbeat interval of a storage that supports heartbeats, else ``None``."""
    if BaseHeartbeat is not None and isinstance(storage, BaseHeartbeat):
        return storage.get_heartbeat_interval()
    return None
