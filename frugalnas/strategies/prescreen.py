"""The ``prescreen`` strategy: a zero-cost proxy in front of any frugalnas strategy.

For each trial the wrapped (``inner``) strategy proposes ``k`` distinct candidates
(:func:`frugalnas.core.strategy.propose`), a proxy (or a rank ensemble of proxies) scores their
untrained networks, and the best one becomes the trial's architecture, so the study's
(expensive) estimator only sees pre-screened candidates (Abdelfattah et al., ICLR 2021,
section 5 "warm-up / move proposal"). The chosen candidate's proxy values are kept on the trial
(system attribute :data:`~frugalnas.core.keys.PRESCREEN_ATTR`), where rank ensembles find them.
In a study with constraints, the proxy chooses only among the candidates the inner strategy's
constraint model predicts feasible (frugalnas's strategies have one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
import torch
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from frugalnas.core import optuna_compat
from frugalnas.core.architecture import Architecture
from frugalnas.core.data import Dataset
from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.keys import PRESCREEN_ATTR
from frugalnas.core.space import SearchSpace
from frugalnas.core.strategy import (Proposer, Strategy, StrategyServices, feasible_candidates,
                                     propose)
from frugalnas.proxies.base import Proxy, ProxyBatch, score_with
from frugalnas.proxies.ensemble import proxy_list, rank_average
from frugalnas.proxies.shared import SharedPasses

__all__ = ["PRESCREEN_ATTR", "PrescreenSampler", "prescreen_strategy"]


class _DatasetContext:
    """The little of a TrialContext that :meth:`ProxyBatch.draw` reads."""

    def __init__(self, loader: Callable[[], Dataset]):
        self.dataset_loader = loader
        self._data: Dataset | None = None

    @property
    def dataset(self) -> Dataset:
        if self._data is None:
            self._data = self.dataset_loader()
        return self._data


class PrescreenSampler(Strategy):
    """Draws ``k`` distinct candidates from ``inner`` and keeps the one a zero-cost proxy
    ranks best (``proxy``: a proxy name, a list of them ranked together, or a member preset
    of :data:`~frugalnas.proxies.ensemble.MEMBER_PRESETS` such as ``"selected"``). The proxy's
    batch comes from ``dataset`` when given, else from the dataset of the frugalnas study that
    binds the sampler, else (``data="gaussian"``) random inputs."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: SearchSpace, host: Any,
                 seed: int = 0, proxy: str | Sequence[str] = "synflow", k: int = 10,
                 batch_size: int = 64, data: str = "dataset", resize: int | None = None,
                 dataset: str | None = None, dataset_options: dict[str, Any] | None = None,
                 input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                 proxy_options: dict[str, Any] | None = None):
        check_range("prescreen k", k, 1)
        self.batch = ProxyBatch(batch_size, data, resize, seed, input_shape, num_classes,
                                what="prescreen")
        if not isinstance(inner, Proposer):
            propose(inner, None, None, k)  # raises the ConfigError that names the problem
        names = proxy_list(proxy)  # an empty list is refused there, naming the presets
        self.inner, self.space, self.host, self.seed = inner, space, host, seed
        self.proxy, self.k = proxy, int(k)
        self.members: list[Proxy] = [host.create("proxies", n, **(proxy_options or {}))
                                     for n in names]
        self._loader: Callable[[], Dataset] | None = None
        if dataset is not None:
            options = dict(dataset_options or {})
            host.registry("datasets").get(dataset).check_options(options)
            self._loader = lambda: host.create("datasets", dataset, seed=seed, **options)
        self._batch: tuple[torch.Tensor, torch.Tensor, int] | None = None

    # -- frugalnas's strategy protocol ---------------------------------------------------
    def bind(self, services: StrategyServices) -> None:
        """Score on the study's dataset unless a dataset was given."""
        if self._loader is None and services.load_dataset is not None:
            self._loader = services.load_dataset

    # -- optuna sampler API --------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space.distributions())

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        candidates = propose(self.inner, study, trial, self.k)
        if not candidates:  # the space is exhausted: let the inner strategy decide
            return {}
        eligible = self._feasible_first(study, trial, candidates)
        scores = np.array([self._score(candidates[i]) for i in eligible])
        combined = scores[:, 0] if len(self.members) == 1 else rank_average(scores)
        top = int(np.argmax(combined))
        best = eligible[top]
        record = {f"proxy_{p.name}": float(v) for p, v in zip(self.members, scores[top])}
        record["prescreen_candidates"] = len(candidates)
        record["prescreen_scored"] = len(eligible)
        optuna_compat.set_trial_system_attr(study, trial, PRESCREEN_ATTR, record)
        return {k: v for k, v in self.space.to_params(candidates[best]).items() if k in search_space}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: Any,
                    values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()

    # -- internals -----------------------------------------------------------------------
    def _feasible_first(self, study: optuna.Study, trial: FrozenTrial,
                        candidates: list[Architecture]) -> list[int]:
        """The candidates the proxy may choose from: those the inner strategy calls feasible
        (:meth:`~frugalnas.strategies.base.ArchSampler.feasible_candidates`; all of them
        until a trial has violated a constraint, or when the inner strategy has no constraint
        model). A proxy alone would pick the largest network, which is what a latency or size
        bound rules out."""
        return feasible_candidates(self.inner, study, trial, candidates)

    def _score(self, arch: Architecture) -> list[float]:
        x, y, num_classes = self._fixed_batch()
        with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's RNG untouched
            torch.manual_seed(self.seed)
            model = self.space.build(arch, num_classes, tuple(x.shape[1:]))
        shared = SharedPasses(model, x, y) if len(self.members) > 1 else None
        return [score_with(p, model, x, y, shared) for p in self.members]

    def _fixed_batch(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self._batch is None:
            self._batch = self.batch.draw(
                _DatasetContext(self._loader) if self._loader else None,
                need_dataset=self.batch.uses_dataset(self.members))
        return self._batch


def prescreen_strategy(space: SearchSpace | None = None, seed: int = 0, host: Any = None,
                       inner: str = "random", inner_options: dict[str, Any] | None = None,
                       proxy: str | Sequence[str] = "synflow", k: int = 10,
                       batch_size: int = 64, data: str = "dataset", resize: int | None = None,
                       dataset: str | None = None,
                       dataset_options: dict[str, Any] | None = None,
                       input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                       proxy_options: dict[str, Any] | None = None) -> PrescreenSampler:
    """Pre-screen: the inner strategy proposes k candidates, a zero-cost proxy (or a rank
    ensemble of several, or a member preset such as ``"selected"``) keeps the best for the
    estimator."""
    if host is None:
        raise ConfigError("strategy 'prescreen' needs the study's plugin host (host=) to "
                          "create its inner strategy and proxies")
    if inner == "prescreen":
        raise ConfigError("invalid prescreen inner 'prescreen'; wrap a search strategy such as "
                          "'random' or 'regularized-evolution'")
    inner_sampler = host.create("strategies", inner, space=space, seed=seed,
                                **dict(inner_options or {}))
    return PrescreenSampler(inner_sampler, space, host, seed=seed, proxy=proxy, k=k,
                            batch_size=batch_size, data=data, resize=resize, dataset=dataset,
                            dataset_options=dataset_options, input_shape=input_shape,
                            num_classes=num_classes, proxy_options=proxy_options)
