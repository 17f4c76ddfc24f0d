"""PrescreenSampler: put a zero-cost proxy in front of any strategy.

For each trial the wrapped sampler proposes ``k`` candidates, a proxy (or a rank ensemble of
proxies) scores their untrained networks, and the best one becomes the trial's architecture,
so the study's (expensive) estimator only sees pre-screened candidates (Abdelfattah et al.,
ICLR 2021, section 5 "warm-up / move proposal"). The chosen candidate's proxy values are
kept on the trial (system attribute ``frugalnas_prescreen``), where rank ensembles find them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
import torch
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from frugalnas.core.architecture import Architecture
from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.space import SearchSpace
from frugalnas.proxies.base import DATA_SOURCES, Proxy, proxy_batch
from frugalnas.proxies.ensemble import rank_average

PRESCREEN_ATTR = "frugalnas_prescreen"


class _DatasetContext:
    """The little of an EvaluationContext that :func:`proxy_batch` reads."""

    def __init__(self, loader: Any):
        self.dataset_loader = loader
        self._data = None

    @property
    def dataset(self):
        if self._data is None:
            self._data = self.dataset_loader()
        return self._data


class PrescreenSampler(optuna.samplers.BaseSampler):
    """Draws ``k`` candidates from ``sampler`` and keeps the one a zero-cost proxy ranks best."""

    def __init__(self, sampler: optuna.samplers.BaseSampler, space: SearchSpace, host: Any = None,
                 seed: int = 0, proxy: str | Sequence[str] = "synflow", k: int = 10,
                 batch_size: int = 64, data: str = "dataset", resize: int | None = None,
                 dataset: str | None = None, dataset_options: dict[str, Any] | None = None,
                 input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                 proxy_options: dict[str, Any] | None = None):
        check_range("prescreen k", k, 1)
        check_range("prescreen batch_size", batch_size, 1)
        if data not in DATA_SOURCES:
            raise ConfigError(f"invalid prescreen data {data!r}; valid: {', '.join(DATA_SOURCES)}")
        if host is None:
            from frugalnas.core.plugins import get_host

            host = get_host()
        names = [proxy] if isinstance(proxy, str) else list(proxy)
        if not names:
            raise ConfigError("prescreen proxy list is empty; give a proxy name or a list")
        self.sampler, self.space, self.host, self.seed = sampler, space, host, seed
        self.proxy, self.k, self.batch_size, self.data, self.resize = proxy, int(k), batch_size, data, resize
        self.dataset, self.dataset_options = dataset, dict(dataset_options or {})
        self.input_shape, self.num_classes = tuple(input_shape), num_classes
        self.members: list[Proxy] = [host.create("proxies", n, **(proxy_options or {}))
                                     for n in names]
        self._batch: tuple[torch.Tensor, torch.Tensor, int] | None = None

    # -- optuna sampler API --------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space.distributions())

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        candidates = self._candidates(study, trial)
        scores = np.array([self._score(arch, study) for arch in candidates])
        if len(self.members) == 1:
            best = int(np.argmax(scores[:, 0]))
        else:
            best = int(np.argmax(rank_average(scores)))
        record = {f"proxy_{p.name}": float(v) for p, v in zip(self.members, scores[best])}
        record["prescreen_candidates"] = len(candidates)
        study._storage.set_trial_system_attr(trial._trial_id, PRESCREEN_ATTR, record)
        return {k: v for k, v in self.space.to_params(candidates[best]).items() if k in search_space}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.sampler.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any,
                    values: Sequence[float] | None) -> None:
        self.sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.sampler.reseed_rng()

    # -- internals -----------------------------------------------------------------------
    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> Architecture:
        """One proposal of the wrapped sampler for this trial."""
        dists = self.space.distributions()
        rel_space = self.sampler.infer_relative_search_space(study, trial)
        rel = self.sampler.sample_relative(study, trial, rel_space) if rel_space else {}
        params = {name: rel[name] if name in rel else
                  self.sampler.sample_independent(study, trial, name, dist)
                  for name, dist in dists.items()}
        return self.space.from_params(params)

    def _candidates(self, study: optuna.Study, trial: FrozenTrial) -> list[Architecture]:
        """``k`` distinct candidates: the wrapped sampler's proposals, topped up with seeded
        uniform samples when it repeats itself (deterministic samplers do)."""
        rng = random.Random(self.seed * 1_000_003 + trial.number)
        seen: dict[str, Architecture] = {}
        for _ in range(self.k):
            arch = self._propose(study, trial)
            for _ in range(20):
                if arch.key not in seen:
                    break
                arch = self.space.sample(rng)
            seen.setdefault(arch.key, arch)
        return list(seen.values())

    def _score(self, arch: Architecture, study: optuna.Study) -> list[float]:
        x, y, num_classes = self._fixed_batch(study)
        with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's RNG untouched
            torch.manual_seed(self.seed)
            model = self.space.build(arch, num_classes, tuple(x.shape[1:]))
        return [p.score(model, x, y) for p in self.members]

    def _fixed_batch(self, study: optuna.Study) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self._batch is None:
            need = self.data == "dataset" and any(p.needs_data for p in self.members)
            name, options = self.dataset, self.dataset_options
            if name is None:
                stored = study.user_attrs.get("frugalnas_config")
                cfg = json.loads(stored) if stored else {}
                name = cfg.get("dataset")
                options = {**cfg.get("dataset_options", {}), **options}
            loader = None
            if name is not None:
                def loader():
                    return self.host.create("datasets", name, seed=self.seed, **options)
            self._batch = proxy_batch(_DatasetContext(loader) if loader else None,
                                      batch_size=self.batch_size, data=self.data,
                                      resize=self.resize, seed=self.seed,
                                      input_shape=self.input_shape, num_classes=self.num_classes,
                                      need_dataset=need)
        return self._batch
