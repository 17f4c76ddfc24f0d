"""The result of an SI-EvoNAS search: one candidate of the last generation's selection pool.

The pool is the last generation's population, re-scored after that generation's sampled
training, and its offspring, scored on the same weights; so every member was scored by the
same store. :func:`final_choice` returns the member with the best inherited accuracy, or, with
``proxies``, the best by a hybrid of two percentile ranks within the pool: the inherited
accuracy's and a zero-cost rank ensemble's (the proxies read the untrained network). The
idea: inherited weights favour operations that need little training (pooling, skip
connections), while the winner is retrained from scratch. Measured on mnist5k over eight
search seeds, neither choice retrains better than ``study.best_architecture``
(docs/benchmarks.md); the pool with its scores serves as a shortlist to retrain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.proxies.ensemble import RankEnsembleEstimator, proxy_list, rank_average
from frugalnas.sievo.plan import GenerationPlans


@dataclass(frozen=True)
class FinalChoice:
    """The chosen architecture and how the pool scored: ``candidates`` (architecture strings),
    their ``fitness`` (inherited, higher is better), ``proxy_scores`` (the ensemble's percentile
    rank within the pool; empty without proxies) and ``scores`` (what the choice maximised),
    and the ``cost`` of the proxies' passes."""

    architecture: Architecture
    candidates: tuple[str, ...]
    fitness: tuple[float, ...]
    proxy_scores: tuple[float, ...]
    scores: tuple[float, ...]
    cost: Cost


def last_pool(study: Any) -> tuple[int, dict[str, float]]:
    """The last generation with a completed trial and its selection pool (architecture string
    -> fitness, higher is better)."""
    plans = study.context().shared(GenerationPlans)
    numbers = [t.number for t in study.completed_trials()]
    if not numbers:
        raise ConfigError("no completed trial: the search has no result to choose from")
    generation = plans.generation_of(max(numbers))
    return generation, plans.selection_pool(study.optuna_study, generation)


def final_choice(study: Any, proxies: Sequence[str] | str | None = None,
                 proxy_weight: float = 0.5, **ensemble_options: Any) -> FinalChoice:
    """The search's result from the last generation's pool of a ``si-evolution`` study: by
    inherited fitness alone, or with ``proxies`` (a proxy name, a list of names, or a member
    preset such as ``"selected"``) by ``(1 - proxy_weight)`` x the fitness's percentile rank +
    ``proxy_weight`` x the proxy ensemble's. ``ensemble_options`` go to
    :class:`~frugalnas.proxies.ensemble.RankEnsembleEstimator` (``batch_size``, ``data``,
    ``aggregation``, ...); the proxies score on the study's dataset by default."""
    check_range("proxy_weight", proxy_weight, 0.0, 1.0)
    _, pool = last_pool(study)
    candidates = tuple(pool)
    fitness = np.array([pool[a] for a in candidates], dtype=float)
    if not proxies:
        best = int(np.argmax(fitness))
        return FinalChoice(study.space.parse(candidates[best]), candidates, tuple(fitness), (),
                           tuple(fitness), Cost())
    ensemble = RankEnsembleEstimator(proxy_list(proxies), host=study.host, **ensemble_options)
    context = study.context()
    measured, cost = [], Cost()
    for text in candidates:
        values, spent = ensemble.measure(study.space.parse(text), context)
        measured.append(values)
        cost = cost + spent
    proxy = ensemble.population_scores(measured[-1], measured[:-1], ensemble.weights)
    scores = rank_average(np.column_stack([fitness, proxy]), [1.0 - proxy_weight, proxy_weight])
    best = int(np.argmax(scores))
    return FinalChoice(study.space.parse(candidates[best]), candidates, tuple(fitness),
                       tuple(float(p) for p in proxy), tuple(float(s) for s in scores), cost)
