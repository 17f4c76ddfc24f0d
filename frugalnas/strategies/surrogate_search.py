"""Surrogate-assisted strategies: surrogate-screened evolution and BANANAS.

Both refit a surrogate (a registered ``surrogates`` component) on every completed trial
before each proposal, score candidate architectures with an acquisition function, and
propose the best unseen one. Every ``quality_every`` completed trials they also measure the
surrogate's rank quality prospectively: a copy fitted without the latest ``quality_holdout``
trials predicts them, and Kendall tau / Spearman rho go to the proposing trial's system
attributes (``frugalnas:surrogate_kendall_tau``, ...) and to ``report`` (a frugalnas study's
``log_metrics``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import optuna
from scipy.stats import norm
from optuna.trial import FrozenTrial

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.strategy import StrategyServices
from frugalnas.multiobjective.hypervolume import (check_reference_point, hypervolume_improvement,
                                                 nondominated_rows)
from frugalnas.multiobjective.pareto import direction_signs
from frugalnas.surrogates.acquisition import ACQUISITIONS, acquisition
from frugalnas.surrogates.choice import make_encoding, preferred_encoding
from frugalnas.surrogates.quality import rank_quality
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.history import History
from frugalnas.strategies.regularized import RegularizedEvolutionSampler

#: Monte-Carlo draws of the expected hypervolume improvement (several objectives, a reference
#: point).
EHVI_SAMPLES = 32


class SurrogateMixin:
    """Surrogate fitting, candidate scoring and quality reporting for an :class:`ArchSampler`."""

    # The random initial design of the surrogate strategies; 40 with known constraints was
    # chosen on seeds 100-199 (surrogate-evolution) and 100-129 (BANANAS) of
    # benchmarks/hw_nb201.py, apart from the reported seeds 0-9.
    default_n_init = 10
    known_constraints_n_init = 40

    def _init_surrogate(self, surrogate: Any, surrogate_options: dict[str, Any] | None,
                        encoding: str, encoding_options: dict[str, Any] | None,
                        acquisition: str, kappa: float, quality_every: int,
                        quality_holdout: int, reference_point: Sequence[float] | None) -> None:
        check_choice("acquisition", acquisition, ACQUISITIONS)
        self.reference_point = check_reference_point(reference_point)
        check_range("quality_every", quality_every, 0)
        check_range("quality_holdout", quality_holdout, 2)
        self.surrogate, self.surrogate_options = surrogate, dict(surrogate_options or {})
        self.encoding, self.encoding_options = encoding, dict(encoding_options or {})
        self.acquisition, self.kappa = acquisition, float(kappa)
        self.quality_every, self.quality_holdout = int(quality_every), int(quality_holdout)
        if isinstance(surrogate, str):
            if self.host is None:
                raise ConfigError(f"surrogate {surrogate!r} is a component name: the strategy "
                                  "needs the study's plugin host (host=) to create it")
            self.host.registry("surrogates").get(surrogate).check_options(self.surrogate_options)
        options = dict(self.encoding_options)
        if encoding == "proxy":
            options.setdefault("host", self.host)
        self._encoder = make_encoding(encoding, self.space, **options)
        self._features: dict[str, np.ndarray] = {}
        self._fitted: tuple[tuple[int, int], Any] | None = None

    def _new_surrogate(self) -> Any:
        from sklearn.base import clone

        if not isinstance(self.surrogate, str):
            return clone(self.surrogate)
        comp = self.host.registry("surrogates").get(self.surrogate)
        opts = dict(self.surrogate_options)
        if "seed" in comp.options():
            opts.setdefault("seed", self.seed)
        return comp.create(self.host, **opts)

    def _encode(self, archs: list[Architecture]) -> np.ndarray:
        missing = [a for a in archs if a.key not in self._features]
        if missing:
            for a, row in zip(missing, self._encoder.encode(missing)):
                self._features[a.key] = row
        return np.stack([self._features[a.key] for a in archs])

    def score(self, study: optuna.Study, trial: FrozenTrial, hist: History,
              candidates: list[Architecture], rng: random.Random) -> np.ndarray:
        """Acquisition values of ``candidates`` under a surrogate fitted on ``hist``.

        With constraints, once some trial violated them, the acquisition is weighted by the
        predicted probability of feasibility: constrained expected improvement over the best
        feasible fitness (Gardner et al., ICML 2014) for ``ei``, a feasible-first draw for
        Thompson sampling (``its``); for every acquisition the candidates predicted feasible
        (probability >= ``feasibility_threshold``) come first. The probability comes from the
        strategy's constraint model (ridge regression of each constraint's margin,
        :meth:`ArchSampler.constraint_prediction`);
        with ``constraint_model=False`` from a second surrogate of the study's kind fitted on
        the largest scaled margin. When the study's estimator knows the constrained metrics
        (:meth:`ArchSampler.known_margins`), the candidates known to meet them go first by
        acquisition and the others follow by their known violation; nothing is predicted.

        With several objectives and a ``reference_point``, the acquisition is the expected
        hypervolume improvement over the evaluated feasible front instead: one surrogate per
        objective the estimator does not know before evaluating, the known ones
        (:meth:`ArchSampler.known_objective_rows`) exact."""
        constrained = any(v > 0 for v in hist.violations)
        y = self.fitness(study, hist.values)
        # Several objectives and a reference point: one surrogate per objective the estimator
        # does not know before evaluation, expected hypervolume improvement.
        ehvi = len(study.directions) > 1 and self.reference_point is not None
        unknown: list[int] = []
        if ehvi:
            signs = direction_signs(study.directions)
            check_reference_point(self.reference_point, len(signs))
            obj = np.asarray(hist.values, dtype=float) * signs
            known_obj = self.known_objective_rows(candidates)
            exact = (np.full((len(candidates), len(signs)), np.nan) if known_obj is None
                     else known_obj * signs)
            unknown = list(np.flatnonzero(np.isnan(exact).any(0)))
        key = (trial.number, len(hist))
        if self._fitted is None or self._fitted[0] != key:  # once per trial, even for k proposals
            X = self._encode(hist.archs)
            self._maybe_quality(study, trial, X, y)
            margin_model = None
            if constrained and not self.constraint_model:
                diffs = np.asarray(hist.constraint_diffs, dtype=float)
                margin = (diffs / (diffs.std(0) + 1e-12)).max(1)
                margin_model = self._new_surrogate().fit(X, margin)
            targets = [obj[:, j] for j in unknown] if ehvi else [y]
            self._fitted = (key, ([self._new_surrogate().fit(X, t) for t in targets],
                                  margin_model))
        models, margin_model = self._fitted[1]
        features = self._encode(candidates)
        draws = np.random.default_rng(rng.getrandbits(63))
        feasible = np.asarray(hist.violations) <= 0
        if ehvi:
            acq = self._expected_improvement_of_front(
                obj[feasible] if feasible.any() else obj[:0],
                np.asarray(self.reference_point) * signs, exact, unknown,
                [m.predict(features) for m in models], draws)
        else:
            mean, std = models[0].predict(features)
            best = float(np.max(y[feasible])) if feasible.any() else float(np.min(y))
            acq = acquisition(self.acquisition, mean, std, best=best, kappa=self.kappa,
                              rng=draws)
        return self._feasible_first(acq, hist, candidates, features, margin_model, constrained,
                                    draws)

    def _feasible_first(self, acq: np.ndarray, hist: History, candidates: list[Architecture],
                        features: np.ndarray, margin_model: Any, constrained: bool,
                        draws: np.random.Generator) -> np.ndarray:
        """``acq`` reordered so that the candidates known, or predicted, to meet the
        constraints come first (see :meth:`score`)."""
        known = self.known_margin_rows(candidates)
        if known is not None:  # exact: the candidates known to be feasible first
            ok = (known <= 0).all(1)
            excess = np.maximum(known / self._margin_scale(hist, known.shape[1]), 0.0).sum(1)
            return np.where(ok, acq, float(np.min(acq)) - 1.0 - excess)
        if not constrained:
            return acq
        if margin_model is not None:
            m_mean, m_std = margin_model.predict(features)
            m_mean = np.asarray(m_mean, float)[:, None]
            m_std = np.maximum(np.asarray(m_std, float), 1e-12)[:, None]
            scale = np.ones(1)
        else:
            cmodel, scale = self._constraint_model(hist)
            m_mean, m_std = cmodel.predict(self._encode_onehot(candidates))
        prob = norm.cdf(-m_mean / m_std).prod(1)
        if self.acquisition == "its":
            ok = (m_mean + m_std * draws.standard_normal(m_mean.shape) <= 0).all(1)
        else:
            ok = prob >= self.feasibility_threshold
        if self.acquisition == "ei":
            # EI spans orders of magnitude when the surrogate is confident, so weighting alone
            # would let a large EI outbid a small probability of feasibility: the candidates
            # predicted feasible go first whatever their EI.
            acq = acq * prob
        # Predicted-feasible candidates by acquisition, then the others by margin.
        low = float(np.min(acq)) if len(acq) else 0.0
        return np.where(ok, acq, low - 1.0 - np.maximum((m_mean / scale).max(1), 0.0))

    def _expected_improvement_of_front(
            self, evaluated: np.ndarray, ref: np.ndarray, known: np.ndarray,
            unknown: list[int], predictions: list[tuple[np.ndarray, np.ndarray]],
            draws: np.random.Generator) -> np.ndarray:
        """Each candidate's expected hypervolume improvement (Emmerich et al., IEEE TEVC
        2006) over the front of ``evaluated`` (objectives maximised, reference ``ref``): the
        ``known`` objectives exact, the ``unknown`` ones drawn ``EHVI_SAMPLES`` times from the
        surrogates' ``predictions`` (mean, std)."""
        front = evaluated[nondominated_rows(evaluated)]
        samples = np.repeat(known[None], EHVI_SAMPLES, axis=0)
        for j, (mean, std) in zip(unknown, predictions):
            noise = draws.standard_normal((EHVI_SAMPLES, len(known)))
            samples[:, :, j] = np.asarray(mean, float) + np.asarray(std, float) * noise
        gain = hypervolume_improvement(samples.reshape(-1, known.shape[1]), front, ref)
        return gain.reshape(EHVI_SAMPLES, -1).mean(0)

    def _maybe_quality(self, study: optuna.Study, trial: FrozenTrial, X: np.ndarray,
                       y: np.ndarray) -> None:
        n, h = len(y), self.quality_holdout
        if not self.quality_every or n % self.quality_every or n - h < 5:
            return
        mean, _ = self._new_surrogate().fit(X[:-h], y[:-h]).predict(X[-h:])
        q = rank_quality(y[-h:], mean)
        self.emit(study, trial, {"surrogate_kendall_tau": q["kendall_tau"],
                                 "surrogate_spearman": q["spearman"],
                                 "surrogate_train_size": float(n - h)}, n)

    def pick(self, study: optuna.Study, trial: FrozenTrial, hist: History,
             candidates: list[Architecture], rng: random.Random) -> Architecture:
        scores = self.score(study, trial, hist, candidates, rng)
        return candidates[int(np.argmax(scores))]


class SurrogateEvolutionSampler(SurrogateMixin, RegularizedEvolutionSampler):
    """Surrogate-assisted regularized evolution: a surrogate pre-screens the offspring.

    ``n_candidates`` mutated children (20, or 100 with known constraints) are scored by the
    acquisition (EI, UCB, mean or Thompson sampling) and the best one is evaluated; with
    several objectives and a ``reference_point``, by their expected hypervolume improvement
    (:meth:`SurrogateMixin.score`). With known constraints, once the evaluated trials get
    better towards the boundary, the one nearest it among the ``screen_size`` (10) best known
    to meet them is evaluated instead (chosen on seeds 100-159 of benchmarks/hw_nb201.py on
    three constraint sets, against 1, 30 and 100, apart from the reported seeds 0-9).
    ``encoding`` defaults to ``adjacency`` on a space that has it (NB201), else ``onehot``. The population and tournament sizes
    default as regularized evolution's (20 and 5; 40 and 10 with constraints known before
    evaluation), and ``n_init`` to 10, or 40 with known constraints (chosen on seeds 100-199
    of benchmarks/hw_nb201.py, apart from the reported seeds 0-9)."""

    # 100 candidates with known constraints were chosen on seeds 100-259 of
    # benchmarks/hw_nb201.py, apart from the reported seeds 0-9.
    default_candidates: ClassVar[int] = 20
    known_constraints_candidates: ClassVar[int] = 100

    def __init__(self, space: SearchSpace, seed: int = 0, population_size: int | None = None,
                 sample_size: int | None = None, n_candidates: int | None = None,
                 surrogate: Any = "lightgbm",
                 surrogate_options: dict[str, Any] | None = None, encoding: str | None = None,
                 encoding_options: dict[str, Any] | None = None, acquisition: str = "ei",
                 kappa: float = 2.0, quality_every: int = 10, quality_holdout: int = 10,
                 n_init: int | None = None, *, reference_point: Sequence[float] | None = None,
                 **common: Any):
        if n_candidates is not None:
            check_range("n_candidates", n_candidates, 1)
        super().__init__(space, seed, population_size, sample_size, n_init,
                         **common)
        self.n_candidates = n_candidates
        self._candidates = n_candidates or self.default_candidates
        self._init_surrogate(surrogate, surrogate_options,
                             encoding or preferred_encoding(space, "adjacency"), encoding_options,
                             acquisition, kappa, quality_every, quality_holdout,
                             reference_point)

    def bind(self, services: StrategyServices) -> None:
        super().bind(services)
        self._candidates = self.n_candidates or (
            self.known_constraints_candidates if self.constraints_known()
            else self.default_candidates)

    def default_initial_design(self, constraints_known: bool) -> int:
        """10, or 40 with known constraints (not the population size)."""
        return self.known_constraints_n_init if constraints_known else self.default_n_init

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        archs, fit = self.population(study, hist)
        chosen: dict[str, Architecture] = {}
        for _ in range(self._candidates):
            child = self.fresh_mutation(self.tournament(archs, fit, rng), hist, rng, set(chosen))
            chosen[child.key] = child
        candidates = list(chosen.values())
        scores = self.score(study, trial, hist, candidates, rng)
        known = self.known_margin_rows(candidates)
        ok = np.flatnonzero((known <= 0).all(1)) if known is not None else np.zeros(0, int)
        if not len(ok):
            return candidates[int(np.argmax(scores))]
        # Known constraints: regularized evolution's screen over the screen_size best known to
        # meet them (nearest the boundary once it is active, else the best).
        best = ok[np.argsort(-scores[ok], kind="stable")[:self.screen_size]]
        return self.prefer_feasible(study, hist, [candidates[i] for i in best])

class BananasSampler(SurrogateMixin, ArchSampler):
    """BANANAS (White et al., AAAI 2021): ensemble surrogate, path encoding, mutation search.

    The acquisition (Thompson sampling by default) is maximised over mutations of the
    ``top_k`` best architectures so far. ``encoding`` defaults to ``path`` on a space that
    has it (NB201), else ``onehot``. ``n_init`` defaults to 10, and to 40 with constraints
    known before evaluation (chosen on seeds 100-129 of benchmarks/hw_nb201.py, apart from
    the reported seeds 0-9)."""

    def __init__(self, space: SearchSpace, seed: int = 0, n_candidates: int = 100,
                 top_k: int = 10, surrogate: Any = "mlp-ensemble",
                 surrogate_options: dict[str, Any] | None = None, encoding: str | None = None,
                 encoding_options: dict[str, Any] | None = None, acquisition: str = "its",
                 kappa: float = 2.0, quality_every: int = 10, quality_holdout: int = 10,
                 n_init: int | None = None, *, reference_point: Sequence[float] | None = None,
                 **common: Any):
        check_range("n_candidates", n_candidates, 1)
        check_range("top_k", top_k, 1)
        super().__init__(space, seed, n_init,
                         **common)
        self.n_candidates, self.top_k = int(n_candidates), int(top_k)
        self._init_surrogate(surrogate, surrogate_options,
                             encoding or preferred_encoding(space, "path"), encoding_options,
                             acquisition, kappa, quality_every, quality_holdout,
                             reference_point)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        fit = self.fitness(study, hist.values, hist.violations)
        top = [hist.archs[i] for i in sorted(range(len(hist)),
                                             key=lambda i: (-fit[i], hist.numbers[i]))[:self.top_k]]
        chosen: dict[str, Architecture] = {}
        for c in range(self.n_candidates):
            child = self.fresh_mutation(top[c % len(top)], hist, rng, set(chosen))
            chosen[child.key] = child
        return self.pick(study, trial, hist, list(chosen.values()), rng)
