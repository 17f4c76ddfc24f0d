"""The ``prescreen`` strategy: a zero-cost proxy in front of any frugalnas strategy.

For each trial the wrapped (``inner``) strategy proposes ``k`` distinct candidates
(:func:`frugalnas.ports.strategy.propose`), a proxy (or a rank ensemble of proxies) scores their
untrained networks, and the best one becomes the trial's architecture, so the study's
(expensive) estimator only sees pre-screened candidates (Abdelfattah et al., ICLR 2021,
section 5 "warm-up / move proposal"). The chosen candidate's proxy values are kept on the trial
(system attribute :data:`~frugalnas.ports.keys.PRESCREEN_ATTR`), where rank ensembles find them.
In a study with constraints, the proxy chooses only among the candidates the inner strategy's
constraint model predicts feasible (frugalnas's strategies have one).

Scoring goes through a :class:`~frugalnas.proxies.runner.ProxyRunner` kept for the sampler's
life: the batch is drawn once, the proxies are created once, each architecture's network is
built once, and its scores are cached (in memory, and in ``cache_dir`` when given), so a
candidate proposed again in a later trial costs a dictionary look-up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import optuna
import torch
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from frugalnas.ports import optuna_compat
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.keys import PRESCREEN_ATTR
from frugalnas.ports.space import SearchSpace, params_of
from frugalnas.ports.strategy import (Proposer, StrategyServices, WrappingStrategy,
                                     feasible_candidates, propose)
from frugalnas.proxies.base import Proxy, ProxyBatch
from frugalnas.proxies.ensemble import proxy_list, rank_average
from frugalnas.proxies.runner import ProxyRunner

__all__ = ["PRESCREEN_ATTR", "PrescreenSampler", "PrescreenStats", "prescreen_strategy"]


@dataclass
class PrescreenStats:
    """What the pre-screen cost so far: ``evaluations`` (architectures scored),
    ``cache_hits`` (candidates whose scores were already known), ``seconds`` (building and
    scoring the evaluated networks, where they were scored), ``batch_seconds`` (drawing the
    proxy batch, once), ``propose_seconds`` (the inner strategy naming its ``k`` candidates
    and predicting their feasibility), each also in CPU time (``cpu_*``, of the process that
    did the work), and ``pids`` (the processes that scored)."""

    evaluations: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    batch_seconds: float = 0.0
    propose_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cpu_batch_seconds: float = 0.0
    cpu_propose_seconds: float = 0.0
    pids: list[int] = field(default_factory=list)


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


class PrescreenSampler(WrappingStrategy):
    """Draws ``k`` distinct candidates from ``inner`` and keeps the one a zero-cost proxy
    ranks best (``proxy``: a proxy name, a list of them ranked together, or a member preset
    of :data:`~frugalnas.proxies.ensemble.MEMBER_PRESETS` such as ``"selected"``). The proxy's
    batch comes from ``dataset`` when given, else from the dataset of the frugalnas study that
    binds the sampler, else (``data="gaussian"``) random inputs.

    ``workers``: 0 scores in the study's process; 1 or more score in that many persistent
    worker processes (started on the first trial, kept until :meth:`close` or the end of the
    process). ``cache_dir``: also keep the scores on disk (a
    :class:`~frugalnas.proxies.runner.ScoreCache` file), keyed by space, architecture, proxy
    and its options, the batch's options (its digest when the batch is the study's dataset)
    and seed, for later studies with the same proxy and batch."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: SearchSpace, host: Any,
                 seed: int = 0, proxy: str | Sequence[str] = "synflow", k: int = 10,
                 batch_size: int = 64, data: str = "dataset", resize: int | None = None,
                 dataset: str | None = None, dataset_options: dict[str, Any] | None = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 proxy_options: dict[str, Any] | None = None, workers: int = 0,
                 cache_dir: str | None = None):
        check_range("prescreen k", k, 1)
        check_range("prescreen workers", workers, 0)
        self.batch = ProxyBatch(batch_size, data, resize, seed, input_shape, num_classes,
                                what="prescreen")
        if not isinstance(inner, Proposer):
            propose(inner, None, None, k)  # raises the ConfigError that names the problem
        names = proxy_list(proxy)  # an empty list is refused there, naming the presets
        self.inner, self.space, self.host, self.seed = inner, space, host, seed
        self.proxy, self.k = proxy, int(k)
        self.members: list[Proxy] = [host.create("proxies", n, **(proxy_options or {}))
                                     for n in names]
        self.proxy_options = dict(proxy_options or {})
        self.workers, self.cache_dir = int(workers), cache_dir
        self.stats = PrescreenStats()
        self._loader: Callable[[], Dataset] | None = None
        self._batch_source: dict[str, Any] | None = {"dataset": None}
        if dataset is not None:
            options = dict(dataset_options or {})
            host.registry("datasets").get(dataset).check_options(options)
            self._loader = lambda: host.create("datasets", dataset, seed=seed, **options)
            self._batch_source = {"dataset": dataset, "dataset_options": options}
        self._batch: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self._runner: ProxyRunner | None = None

    # -- frugalnas's strategy protocol ---------------------------------------------------
    def bind(self, services: StrategyServices) -> None:
        """Score on the study's dataset unless a dataset was given."""
        if self._loader is None and services.load_dataset is not None:
            self._loader = services.load_dataset
            self._batch_source = None  # the study's dataset: keyed by the batch's digest

    # -- optuna sampler API --------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self.space.distributions())

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        start, cpu = time.perf_counter(), time.process_time()
        candidates = propose(self.inner, study, trial, self.k)
        if not candidates:  # the space is exhausted: let the inner strategy decide
            return {}
        eligible = self._feasible_first(study, trial, candidates)
        self.stats.propose_seconds += time.perf_counter() - start
        self.stats.cpu_propose_seconds += time.process_time() - cpu
        scores = self._scores([candidates[i] for i in eligible])
        combined = scores[:, 0] if len(self.members) == 1 else rank_average(scores)
        top = int(np.argmax(combined))
        best = eligible[top]
        record = {f"proxy_{p.name}": float(v) for p, v in zip(self.members, scores[top])}
        record["prescreen_candidates"] = len(candidates)
        record["prescreen_scored"] = len(eligible)
        optuna_compat.set_trial_system_attr(study, trial, PRESCREEN_ATTR, record)
        return {k: v for k, v in params_of(self.space, candidates[best]).items() if k in search_space}

    def close(self) -> None:
        """Stop the worker processes (a later trial starts new ones)."""
        if self._runner is not None:
            self._runner.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runner"] = None  # worker processes do not travel
        return state

    # -- internals -----------------------------------------------------------------------
    def _feasible_first(self, study: optuna.Study, trial: FrozenTrial,
                        candidates: list[Architecture]) -> list[int]:
        """The candidates the proxy may choose from: those the inner strategy calls feasible
        (:meth:`~frugalnas.strategies.base.ArchSampler.feasible_candidates`; all of them
        until a trial has violated a constraint, or when the inner strategy has no constraint
        model). A proxy alone would pick the largest network, which is what a latency or size
        bound rules out."""
        return feasible_candidates(self.inner, study, trial, candidates)

    def _scores(self, archs: list[Architecture]) -> np.ndarray:
        """One row per architecture, one column per member; each architecture's network is
        built (under ``torch.manual_seed(seed)``) and scored only if no score is cached."""
        runner = self._proxy_runner()
        result = runner.run(archs)
        if result.errors:
            arch, proxy, message = result.errors[0]
            raise RuntimeError(f"prescreen proxy {proxy!r} failed on {arch}: {message}")
        self.stats.evaluations += result.scored
        self.stats.cache_hits += len(archs) - result.scored
        self.stats.seconds += result.busy_seconds
        self.stats.cpu_seconds += result.busy_cpu_seconds
        self.stats.pids.extend(p for p in result.pids if p not in self.stats.pids)
        return np.array([[result.values[p.name][i] for p in self.members]
                         for i in range(len(archs))])

    def _proxy_runner(self) -> ProxyRunner:
        if self._runner is None:
            names = list(dict.fromkeys(p.name for p in self.members))
            data_key = None
            if self._batch_source is not None:  # the batch is fixed by the options alone
                data_key = json.dumps({**asdict(self.batch), **self._batch_source},
                                      sort_keys=True, default=str)
            self._runner = ProxyRunner(
                self.host, space=self.space, proxies=names,
                data=self._fixed_batch, data_key=data_key, seed=self.seed,
                cache_dir=self.cache_dir, workers=max(self.workers, 1),
                spawn=self.workers > 0, threads=torch.get_num_threads(), progress=False,
                proxy_options={n: self.proxy_options for n in names})
        return self._runner

    def _fixed_batch(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self._batch is None:
            start, cpu = time.perf_counter(), time.process_time()
            self._batch = self.batch.draw(
                _DatasetContext(self._loader) if self._loader else None,
                need_dataset=self.batch.uses_dataset(self.members))
            self.stats.batch_seconds += time.perf_counter() - start
            self.stats.cpu_batch_seconds += time.process_time() - cpu
        return self._batch


def prescreen_strategy(space: SearchSpace | None = None, seed: int = 0, host: Any = None,
                       inner: str = "random", inner_options: dict[str, Any] | None = None,
                       proxy: str | Sequence[str] = "synflow", k: int = 10,
                       batch_size: int = 64, data: str = "dataset", resize: int | None = None,
                       dataset: str | None = None,
                       dataset_options: dict[str, Any] | None = None,
                       input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                       proxy_options: dict[str, Any] | None = None, workers: int = 0,
                       cache_dir: str | None = None) -> PrescreenSampler:
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
                            num_classes=num_classes, proxy_options=proxy_options,
                            workers=workers, cache_dir=cache_dir)
