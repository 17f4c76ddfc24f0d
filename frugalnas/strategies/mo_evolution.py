"""Multi-objective regularized evolution with an elitist archive.

The tournament population is the aging population of regularized evolution (the last
``population_size`` completed trials; Real et al., AAAI 2019) joined with every non-dominated
trial found so far, an elitist archive as in SPEA2 (Zitzler et al., 2001) and Archai's Pareto
evolution, so a front member that has aged out can still be a parent. Tournaments rank by
NSGA-II's order (non-dominated rank, then crowding distance; Deb et al., IEEE TEVC 2002), as
Syne Tune's multi-objective regularized evolution does. Alternatively each parent is drawn from
the front with probability proportional to its exclusive hypervolume contribution (the selection
of SMS-EMOA, Beume et al., EJOR 2007). Optionally ``n_candidates`` children are screened by
their expected hypervolume improvement (Emmerich et al., IEEE TEVC 2006) under a ridge
regression of each objective on a one-hot encoding of the architecture.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import check_choice, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.multiobjective.feasibility import ConstraintModel
from frugalnas.multiobjective.hypervolume import (check_reference_point, contributions,
                                                 hypervolume_improvement, nondominated_rows)
from frugalnas.multiobjective.pareto import direction_signs
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.history import History

PARENTS = ("tournament", "hypervolume")


class MultiObjectiveEvolutionSampler(ArchSampler):
    """Multi-objective regularized evolution (see the module docstring).

    ``parents``: ``tournament`` (default) takes the fittest of ``sample_size`` members drawn
    from the last ``population_size`` trials plus the non-dominated ones; ``hypervolume`` draws
    each parent from the non-dominated trials with probability proportional to its hypervolume
    contribution (plus ``1 / size`` of the mean, so every member can be drawn). The child is a
    mutation of the parent never proposed before. With ``n_candidates > 1``, that many children
    of independently drawn parents are scored by their expected hypervolume improvement
    (``n_samples`` Monte-Carlo draws from the per-objective ridge models) and the best is
    evaluated. ``reference_point`` (one value per objective, in the objectives' units) bounds
    the hypervolume of both; by default the worst value of each objective among the evaluated
    trials. With constraints the front holds feasible trials only, parents are ranked with the
    violation penalty, and children are screened by :class:`ArchSampler`'s constraint model
    (``screen_size`` mutations, one predicted feasible is evaluated)."""

    def __init__(self, space: SearchSpace, seed: int = 0, parents: str = "tournament",
                 population_size: int = 50, sample_size: int = 10, n_candidates: int = 1,
                 n_samples: int = 32, reference_point: Sequence[float] | None = None,
                 n_init: int = 10, **common: Any):
        check_choice("parents", parents, PARENTS)
        check_range("population_size", population_size, 2)
        check_range("sample_size", sample_size, 1, population_size)
        check_range("n_candidates", n_candidates, 1)
        check_range("n_samples", n_samples, 1)
        reference_point = check_reference_point(reference_point)
        super().__init__(space, seed, n_init, **common)
        self.parents, self.population_size = parents, int(population_size)
        self.sample_size, self.n_candidates = int(sample_size), int(n_candidates)
        self.n_samples = int(n_samples)
        self.reference_point = reference_point

    def _reference(self, study: optuna.Study, obj: np.ndarray) -> np.ndarray:
        signs = direction_signs(study.directions)
        if self.reference_point is not None:
            check_reference_point(self.reference_point, len(signs))
            return np.asarray(self.reference_point) * signs
        return obj.min(0)

    # -- strategy ------------------------------------------------------------------------
    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        signs = direction_signs(study.directions)
        obj = np.asarray(hist.values, dtype=float) * signs
        feasible = np.asarray(hist.violations) <= 0
        ref = self._reference(study, obj)
        pick_parent = self._parent_picker(study, hist, obj, feasible, ref, rng)
        if self.n_candidates == 1:
            return self.screened_mutation(study, pick_parent(), hist, rng)
        children: dict[str, Architecture] = {}
        for _ in range(self.n_candidates):
            child = self.fresh_mutation(pick_parent(), hist, rng, set(children))
            children[child.key] = child
        candidates = list(children.values())
        return candidates[self._screen(hist, obj, feasible, ref, candidates, rng)]

    def _elite(self, study: optuna.Study, hist: History, obj: np.ndarray,
               feasible: np.ndarray) -> np.ndarray:
        """Rows of the non-dominated feasible trials; without a feasible trial, the trials of
        the smallest violation."""
        if feasible.any():
            rows = np.flatnonzero(feasible)
            return rows[nondominated_rows(obj[rows])]
        viol = np.asarray(hist.violations)
        return np.flatnonzero(viol <= viol.min())

    def _parent_picker(self, study: optuna.Study, hist: History, obj: np.ndarray,
                       feasible: np.ndarray, ref: np.ndarray,
                       rng: random.Random) -> Callable[[], Architecture]:
        elite = self._elite(study, hist, obj, feasible)
        if self.parents == "tournament":
            rows = sorted(set(range(max(0, len(hist) - self.population_size), len(hist)))
                          | {int(i) for i in elite})
            archs = [hist.archs[i] for i in rows]
            fit = self.fitness(study, [hist.values[i] for i in rows],
                               [hist.violations[i] for i in rows])

            def tournament() -> Architecture:
                idx = rng.sample(range(len(archs)), min(self.sample_size, len(archs)))
                return archs[max(idx, key=lambda i: (fit[i], -i))]
            return tournament
        archs = [hist.archs[i] for i in elite]
        contrib = contributions(obj[elite], ref)
        weights = contrib + (contrib.mean() + 1e-12) / len(elite)
        cum = np.cumsum(weights / weights.sum()).tolist()

        def by_contribution() -> Architecture:
            return archs[min(bisect.bisect_left(cum, rng.random()), len(archs) - 1)]
        return by_contribution

    def _screen(self, hist: History, obj: np.ndarray, feasible: np.ndarray, ref: np.ndarray,
                candidates: list[Architecture], rng: random.Random) -> int:
        """Index of the candidate with the largest expected hypervolume improvement; with a
        constraint model, among those predicted feasible."""
        model = ConstraintModel().fit(self._encode_onehot(hist.archs), obj)
        mean, std = model.predict(self._encode_onehot(candidates))
        front = obj[feasible][nondominated_rows(obj[feasible])] if feasible.any() else obj[:0]
        draws = np.random.default_rng(rng.getrandbits(63)).standard_normal(
            (self.n_samples, 1, obj.shape[1]))
        samples = (mean[None] + std[None] * draws).reshape(-1, obj.shape[1])
        ehvi = hypervolume_improvement(samples, front, ref).reshape(self.n_samples, -1).mean(0)
        order = sorted(range(len(candidates)), key=lambda i: (-ehvi[i], i))
        pred = self.constraint_prediction(hist, candidates)
        if pred is None:
            return order[0]
        ok = set(self.predicted_feasible(pred[0]))
        return next(i for i in order if i in ok)
