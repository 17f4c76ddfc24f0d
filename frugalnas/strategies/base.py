"""ArchSampler: an optuna sampler that proposes whole architectures of a frugalnas space.

Each call rebuilds what it needs from the study's storage (completed trials in trial-number
order, plus every architecture already proposed or running), and draws its randomness from a
generator seeded by ``(seed, trial number)``. A proposal is therefore a function of the seed and the
storage contents: a study reloaded from its storage continues exactly where it stopped, and
workers sharing a storage share one population (the pattern of optuna's NSGA-II sampler).
"""

from __future__ import annotations

import inspect
import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports.strategy import Strategy, StrategyServices
from frugalnas.host.registry import declared_parameters
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.keys import STRATEGY_METRIC_PREFIX
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.work_progress import work_progress
from frugalnas.multiobjective.feasibility import ConstraintModel, improves_towards_boundary
from frugalnas.surrogates.encodings import OneHotEncoding
from frugalnas.surrogates.proxy_features import ProxyScorer
from frugalnas.strategies.history import FinishedPrefix, History, fitness, read_history

__all__ = ["ArchSampler", "strategy_factory"]


_S = TypeVar("_S", bound="ArchSampler")
#: Random feasible draws among which the initial design takes the one nearest the boundary
#: (known constraints, active boundary).
INITIAL_SCREEN = 10
#: Proposals kept for trials not yet finished; beyond it the oldest go (trials asked and never
#: told, whose ``after_trial`` never comes).
MAX_OPEN_PROPOSALS = 1024


class ArchSampler(Strategy):
    """Base of frugalnas's search strategies: subclasses implement :meth:`choose`.

    Options common to all: ``n_init`` architectures are drawn at random before the strategy
    starts (or, with ``warm_start_proxy``, the ``n_init`` best of ``warm_start_pool`` random
    architectures by that zero-cost proxy). When a study binds the sampler
    (:mod:`frugalnas.ports.strategy`), study-level metrics go to ``study.log_metrics``.
    Every ArchSampler can :meth:`propose` ``k`` distinct candidates for one trial, so any of
    them can sit inside a pre-screen.
    """

    #: Options of the base class a subclass sets itself: its ``__init__`` does not name them
    #: and the registry refuses them as user options, saying so.
    fixed_options: tuple[str, ...] = ()
    #: ``n_init`` when it is not given: by default, and when the study's estimator knows the
    #: constrained metrics before evaluating (resolved in :meth:`bind`).
    default_n_init: ClassVar[int] = 10
    known_constraints_n_init: ClassVar[int] = 10

    def __init__(self, space: SearchSpace, seed: int = 0, n_init: int | None = None,
                 warm_start_proxy: str | None = None, warm_start_pool: int = 100,
                 warm_start_options: dict[str, Any] | None = None,
                 constraint_model: bool = True, feasibility_threshold: float = 0.5,
                 screen_size: int = 10, violation_penalty: float = 5.0,
                 bridge_infeasible: bool = True, host: Any = None):
        if space is None:
            raise ConfigError(f"strategy {type(self).__name__} needs a search space (space=...)")
        if n_init is not None:
            check_range("n_init", n_init, 1)
        check_range("warm_start_pool", warm_start_pool, 1)
        check_range("feasibility_threshold", feasibility_threshold, 0.0, 1.0)
        check_range("screen_size", screen_size, 1)
        check_range("violation_penalty", violation_penalty, 0.0)
        if not isinstance(constraint_model, bool):
            raise ConfigError(f"invalid constraint_model {constraint_model!r}; valid: True, False")
        if not isinstance(bridge_infeasible, bool):
            raise ConfigError(f"invalid bridge_infeasible {bridge_infeasible!r}; valid: True, False")
        self.constraint_model, self.bridge_infeasible = constraint_model, bridge_infeasible
        self.feasibility_threshold, self.screen_size = float(feasibility_threshold), int(screen_size)
        self.violation_penalty = float(violation_penalty)
        self._onehot = OneHotEncoding(space)
        self._onehot_rows: dict[str, np.ndarray] = {}
        self._cmodel: tuple[tuple[int, ...], ConstraintModel] | None = None
        self._scale_memo: tuple[tuple[int, int, int], np.ndarray] | None = None
        self._boundary_memo: tuple[tuple[Any, ...], bool] | None = None
        self._screen_each = True  # False while naming several candidates with known constraints
        self._known: Callable[[Architecture], tuple[float, ...] | None] | None = None
        self._known_margins: dict[str, tuple[float, ...] | None] = {}
        self._knows: bool | None = None
        self._known_obj: Callable[[Architecture], tuple[float | None, ...]] | None = None
        self.space, self.seed = space, int(seed)
        self._n_init_given = n_init is not None
        self.n_init = int(n_init) if n_init is not None else self.default_initial_design(False)
        self.warm_start_proxy = warm_start_proxy
        self.warm_start_pool = int(warm_start_pool)
        self.warm_start_options = dict(warm_start_options or {})
        self.host = host
        self._parsed: dict[str, Architecture | None] = {}
        self._finished: dict[str, FinishedPrefix] = {}
        self._proposals: dict[tuple[str, int], Architecture] = {}
        # A history's lists grow in place: one proposal at a time reads them (n_jobs > 1).
        self._proposing = threading.RLock()
        self.report: Callable[[dict[str, float], int], None] | None = None
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._warm: list[Architecture] | None = None
        if warm_start_proxy is not None:
            if host is None:
                raise ConfigError(f"warm_start_proxy {warm_start_proxy!r} needs the study's "
                                  "plugin host (host=) to create the proxy")
            # Validates the proxy name now; scoring waits for the first proposal.
            self._scorer = ProxyScorer(space, [warm_start_proxy], host=host, seed=self.seed,
                                       **self.warm_start_options)

    # -- frugalnas's strategy protocol ---------------------------------------------------
    def bind(self, services: StrategyServices) -> None:
        """Report study-level metrics (surrogate quality, ...) to the study; use the
        constraint values the study's estimator knows before evaluating, if any."""
        self.report = services.log_metrics
        self._known, self._known_margins, self._knows = services.known_constraints, {}, None
        self._known_obj = services.known_objectives
        if not self._n_init_given:
            self.n_init = self.default_initial_design(self.constraints_known())

    def default_initial_design(self, constraints_known: bool) -> int:
        """``n_init`` when it is not given (:attr:`default_n_init`, or
        :attr:`known_constraints_n_init` when the constraints are known before evaluating)."""
        return self.known_constraints_n_init if constraints_known else self.default_n_init

    def propose(self, study: optuna.Study, trial: FrozenTrial, k: int) -> list[Architecture]:
        """``k`` distinct candidates this strategy would evaluate at ``trial``, in the order
        it would choose them; none already evaluated or running (while the space has room).
        With known constraints and ``k`` > 1, each mutation is repaired towards feasibility
        but not screened (:meth:`screened_mutation`), and each initial draw is one feasible
        draw (:meth:`initial`): the caller chooses among the candidates itself
        (:meth:`feasible_candidates`), so ``k`` screens would multiply the work of a proposal
        by ``screen_size`` for nothing."""
        check_range("k", k, 1)
        with self._proposing:
            hist = read_history(study, self.space, exclude=trial.number, parsed=self._parsed,
                                finished=self._finished)
            rng = self._rng(trial)
            out: list[Architecture] = []
            self._screen_each = k == 1 or not self.constraints_known()
            try:
                for _ in range(k):
                    arch = self._next(study, trial, hist, rng)
                    if arch.key in hist.seen:  # the strategy repeated itself: any unseen one
                        arch = self.fresh_random(hist, rng)
                    if arch.key in hist.seen:  # the space is exhausted
                        break
                    hist.seen.add(arch.key)
                    out.append(arch)
            finally:
                self._screen_each = True
            return out

    def _rng(self, trial: FrozenTrial) -> random.Random:
        return random.Random(f"{type(self).__name__}:{self.seed}:{trial.number}")

    def _next(self, study: optuna.Study, trial: FrozenTrial, hist: History,
              rng: random.Random) -> Architecture:
        if len(hist) < self.n_init:
            return self.initial(hist, rng, study)
        return self.choose(study, trial, hist, rng)

    # -- optuna's sampler API ------------------------------------------------------------
    # The strategy chooses a whole architecture at a trial's first suggest and hands it out
    # decision by decision through sample_independent. Through sample_relative, optuna would
    # compare each decision's distribution with the relative search space's, element by
    # element: about a tenth of a table study's time per trial.
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """The trial's architecture's decisions that are in ``search_space`` (a wrapping
        sampler may ask for them at once; optuna itself asks decision by decision)."""
        if not search_space:
            return {}
        arch = self.proposal(study, trial)
        return {k: v for k, v in arch.decisions.items() if k in search_space}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        arch = self.proposal(study, trial)
        try:
            value = arch[param_name]
        except KeyError:  # a decision the strategy's architecture does not have
            value = None
        else:
            if param_distribution._contains(param_distribution.to_internal_repr(value)):
                return value
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def proposal(self, study: optuna.Study, trial: FrozenTrial) -> Architecture:
        """The architecture this strategy chooses for ``trial``: chosen at the first call for
        it, the same one until optuna reports the trial finished (:meth:`after_trial`)."""
        key = (study.study_name, trial.number)
        arch = self._proposals.get(key)  # asked once per decision: no lock to read
        if arch is not None:
            return arch
        with self._proposing:
            arch = self._proposals.get(key)
            if arch is not None:
                return arch
            hist = read_history(study, self.space, exclude=trial.number, parsed=self._parsed,
                                finished=self._finished)
            arch = self._next(study, trial, hist, self._rng(trial))
            # The trial records this text; reading it back needs no parse (nor a new key).
            self._parsed.setdefault(str(arch), arch)
            self._proposals[key] = arch
            while len(self._proposals) > MAX_OPEN_PROPOSALS:  # trials asked and never told
                del self._proposals[next(iter(self._proposals))]
            return arch

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        with self._proposing:
            self._proposals.pop((study.study_name, trial.number), None)

    # -- strategy ------------------------------------------------------------------------
    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        """The strategy's next architecture given the history (after the initial design);
        prefer ones not in ``hist.seen``."""
        raise NotImplementedError

    def initial(self, hist: History, rng: random.Random,
                study: optuna.Study | None = None) -> Architecture:
        """An unseen architecture of the initial design (random, or proxy-ranked); with known
        constraints one that meets them, and once the boundary is active
        (:meth:`boundary_is_active`, given ``study``) the one nearest the boundary of
        ``INITIAL_SCREEN`` random feasible draws."""
        if self.warm_start_proxy is not None:
            for arch in self.warm_pool():
                if arch.key not in hist.seen and self.known_feasible(arch) is not False:
                    return arch
        arch = self.fresh_random(hist, rng)
        if (study is None or not self._screen_each or not self.constraints_known()
                or self.screen_size == 1 or not self.boundary_is_active(study, hist)):
            return arch
        draws = {arch.key: arch}
        for _ in range(INITIAL_SCREEN - 1):
            other = self.fresh_random(History(seen=hist.seen | set(draws)), rng)
            draws.setdefault(other.key, other)
        return self.prefer_feasible(study, hist, list(draws.values()))

    def warm_pool(self) -> list[Architecture]:
        """``warm_start_pool`` random architectures (fixed by the seed), best proxy score first."""
        if self._warm is None:
            rng = random.Random(f"warm:{self.seed}")
            pool: dict[str, Architecture] = {}
            for _ in range(self.warm_start_pool * 20):
                a = self.space.sample(rng)
                pool.setdefault(a.key, a)
                if len(pool) >= self.warm_start_pool:
                    break
            archs = list(pool.values())
            scores = [float(self._scorer.score(a)[0]) for a in
                      work_progress(archs, f"warm start: scoring {len(archs)} architectures by "
                                           f"{self.warm_start_proxy}")]
            order = sorted(range(len(archs)), key=lambda i: -np.nan_to_num(scores[i], nan=-np.inf))
            self._warm = [archs[i] for i in order]
        return self._warm

    def fresh_random(self, hist: History, rng: random.Random, tries: int = 1000) -> Architecture:
        """A random architecture not proposed before (any one if the space is exhausted);
        with known constraints, one known to meet them while ``tries`` draws find one."""
        arch = self.space.sample(rng)
        unseen: Architecture | None = None
        for _ in range(tries):
            if arch.key not in hist.seen:
                if self.known_feasible(arch) is not False:
                    return arch
                unseen = unseen or arch
            arch = self.space.sample(rng)
        return unseen or arch

    def fresh_mutation(self, parent: Architecture, hist: History, rng: random.Random,
                       avoid: set[str] = frozenset(), tries: int = 30) -> Architecture:
        """A mutation of ``parent`` never proposed before: random mutations first, then any
        unseen neighbour, then a random unseen architecture. With known constraints (the
        study's estimator knows the constrained metrics, :meth:`known_feasible`) it repairs:
        it mutates until a child meets them (``tries`` mutations, then the unseen neighbours
        that meet them); when none does, the unseen child that violates them least. With
        ``bridge_infeasible``, a child known to violate them is mutated once more, and that
        grandchild is taken when it meets them: the step crosses the infeasible band that
        separates pockets of the feasible region."""
        blocked = hist.seen | set(avoid)
        infeasible: list[Architecture] = []
        for _ in range(tries):
            child = self.space.mutate(parent, rng)
            feasible = self.known_feasible(child)
            if child.key not in blocked:
                if feasible is not False:
                    return child
                infeasible.append(child)
            if self.bridge_infeasible and feasible is False:
                onward = self.space.mutate(child, rng)
                if (onward.key not in blocked and onward.key != parent.key
                        and self.known_feasible(onward)):
                    return onward
        fresh = [n for n in self.space.neighbours(parent) if n.key not in blocked]
        if infeasible or (fresh and self.constraints_known()):
            ok = [n for n in fresh if self.known_feasible(n) is not False]
            if ok:
                return rng.choice(ok)
            fallback = infeasible + fresh
            return min(fallback, key=lambda a: self.known_excess(hist, a))
        if fresh:
            return rng.choice(fresh)
        return self.fresh_random(History(seen=blocked), rng)

    # -- constraints ---------------------------------------------------------------------
    def known_margins(self, arch: Architecture) -> tuple[float, ...] | None:
        """``value - bound`` of each of the study's constraints for ``arch`` (constraint-name
        order), known without evaluating it (``StrategyServices.known_constraints``);
        ``None`` when the study's estimator does not know them, or outside a study."""
        if self._known is None:
            return None
        if arch.key not in self._known_margins:
            self._known_margins[arch.key] = self._known(arch)
        return self._known_margins[arch.key]

    def known_feasible(self, arch: Architecture) -> bool | None:
        """Whether ``arch`` is known to meet every constraint (``None``: not known)."""
        margins = self.known_margins(arch)
        return None if margins is None else all(d <= 0 for d in margins)

    def constraints_known(self) -> bool:
        """Whether the study's estimator knows the constrained metrics before evaluating (asked
        once per binding, of one fixed architecture of the space)."""
        if self._knows is None:
            self._knows = (self._known is not None
                           and self.known_margins(self.space.sample(random.Random(0))) is not None)
        return self._knows

    def known_margin_rows(self, candidates: Sequence[Architecture]) -> np.ndarray | None:
        """The known margins of every candidate, one row each; ``None`` unless all are
        known."""
        rows = [self.known_margins(a) for a in candidates]
        if not rows or any(r is None for r in rows):
            return None
        return np.asarray(rows, dtype=float)

    def known_objective_rows(self, candidates: Sequence[Architecture]) -> np.ndarray | None:
        """Each candidate's objective values as the study's estimator knows them before
        evaluating (``StrategyServices.known_objectives``), one row each in objective order,
        NaN where an objective is not known; ``None`` when no objective is known for every
        candidate (one objective, or outside a study)."""
        if self._known_obj is None or not candidates:
            return None
        rows = np.array([[np.nan if v is None else v for v in self._known_obj(a)]
                         for a in candidates], dtype=float)
        known = ~np.isnan(rows).any(0)
        return rows if known.any() else None

    def known_excess(self, hist: History, arch: Architecture) -> float:
        """How far ``arch`` is known to lie outside the feasible region: its positive margins
        in units of each constraint's spread over the history (``inf``: not known)."""
        margins = self.known_margins(arch)
        if margins is None:
            return math.inf
        scale = self._margin_scale(hist, len(margins))
        return float(sum(max(0.0, d) / s for d, s in zip(margins, scale)))

    def _margin_scale(self, hist: History, width: int) -> np.ndarray:
        """Each constraint's spread (std of ``value - bound``) over the evaluated trials that
        recorded it; 1 where there are fewer than two such trials."""
        # Asked once per candidate: computed once per history length (histories only grow).
        key = (id(hist.constraint_diffs), len(hist.constraint_diffs), width)
        if self._scale_memo is not None and self._scale_memo[0] == key:
            return self._scale_memo[1]
        rows = [d for d in hist.constraint_diffs if len(d) == width]
        if len(rows) < 2:
            scale = np.ones(width)
        else:
            spread = np.asarray(rows, dtype=float).std(0)
            scale = np.where(spread > 0, spread, 1.0)
        self._scale_memo = (key, scale)
        return scale

    def screens(self, hist: History) -> bool:
        """Whether candidates are screened for feasibility: the study's estimator knows the
        constrained metrics, or the constraint model applies (:meth:`constrained`)."""
        return self.constraints_known() or self.constrained(hist)

    def constrained(self, hist: History) -> bool:
        """Whether the constraint model applies: the option is on and some evaluated trial
        violated a constraint (before that, every candidate looks feasible)."""
        return self.constraint_model and hist.any_violation()

    def constraint_prediction(self, hist: History, candidates: Sequence[Architecture]
                              ) -> tuple[np.ndarray, np.ndarray] | None:
        """For each candidate: the predicted probability that it meets every constraint, and
        its predicted largest margin in units of each constraint's spread
        (``max((value - bound) / std)``: < 0 inside the feasible region, about 0 at the
        boundary). Known constraint values (:meth:`known_margins`) give both exactly
        (probability 0 or 1); otherwise the constraint model predicts them, and the answer is
        ``None`` when :meth:`constrained` is false."""
        known = self.known_margin_rows(candidates)
        if known is not None:
            scale = self._margin_scale(hist, known.shape[1])
            return (known <= 0).all(1).astype(float), (known / scale).max(1)
        if not self.constrained(hist) or not candidates:
            return None
        model, scale = self._constraint_model(hist)
        X = self._encode_onehot(list(candidates))
        mean, _ = model.predict(X)
        return model.prob_feasible(X), (mean / scale).max(1)

    def feasible_candidates(self, study: optuna.Study, trial: FrozenTrial,
                            candidates: Sequence[Architecture]) -> list[int]:
        """For a wrapper choosing among :meth:`propose`'s candidates (the pre-screen): the
        indices of those it may choose from given the study's history at ``trial``, by
        :meth:`predicted_feasible` (exact with known constraints); all of them when nothing
        is known and :meth:`constrained` is false."""
        with self._proposing:
            hist = read_history(study, self.space, exclude=trial.number, parsed=self._parsed,
                                finished=self._finished)
            pred = self.constraint_prediction(hist, candidates)
        return list(range(len(candidates))) if pred is None else self.predicted_feasible(pred[0])

    def predicted_feasible(self, prob: np.ndarray) -> list[int]:
        """Indices of the candidates whose probability of feasibility is at least
        ``feasibility_threshold``; when none is, the most probably feasible one alone."""
        ok = [i for i in range(len(prob)) if prob[i] >= self.feasibility_threshold]
        return ok or [int(np.argmax(prob))]

    @staticmethod
    def _constraint_rows(hist: History) -> tuple[list[int], np.ndarray]:
        """The trials that recorded every constraint (the widest records) and their
        ``value - bound`` margins, one row each."""
        width = max(len(d) for d in hist.constraint_diffs)
        rows = [i for i, d in enumerate(hist.constraint_diffs) if len(d) == width]
        return rows, np.asarray([hist.constraint_diffs[i] for i in rows], dtype=float)

    def _constraint_model(self, hist: History) -> tuple[ConstraintModel, np.ndarray]:
        rows, diffs = self._constraint_rows(hist)
        key = tuple(hist.numbers[i] for i in rows)
        if self._cmodel is None or self._cmodel[0] != key:
            X = self._encode_onehot([hist.archs[i] for i in rows])
            self._cmodel = (key, (ConstraintModel().fit(X, diffs), diffs.std(0) + 1e-12))
        return self._cmodel[1]

    def _encode_onehot(self, archs: list[Architecture]) -> np.ndarray:
        for a in archs:
            if a.key not in self._onehot_rows:
                self._onehot_rows[a.key] = self._onehot.encode_one(a)
        return np.stack([self._onehot_rows[a.key] for a in archs])

    def boundary_is_active(self, study: optuna.Study, hist: History) -> bool:
        """Whether the evaluated trials get better towards the constraint boundary: a
        positive rank correlation between the unpenalised fitness and the largest scaled
        margin. Then the constrained optimum is likely on the boundary (Schoenauer &
        Michalewicz, "Evolutionary computation at the edge of feasibility", PPSN 1996)."""
        if len(hist) < 3:
            return False
        # Asked once per screened child: computed once per history length.
        key = (id(hist.values), len(hist), tuple(study.directions))
        if self._boundary_memo is not None and self._boundary_memo[0] == key:
            return self._boundary_memo[1]
        rows, diffs = self._constraint_rows(hist)
        fit = fitness([hist.values[i] for i in rows], study.directions)
        active = improves_towards_boundary(fit, diffs)
        self._boundary_memo = (key, active)
        return active

    def prefer_feasible(self, study: optuna.Study, hist: History,
                        candidates: list[Architecture]) -> Architecture:
        """The candidate to evaluate among ``candidates`` (in the order the strategy would
        take them). Without a constraint model: the first. With one: among the candidates
        predicted feasible (probability >= ``feasibility_threshold``), the one predicted
        closest to the boundary when :meth:`boundary_is_active` (else the first of them); when
        none is predicted feasible, the most probably feasible one."""
        pred = self.constraint_prediction(hist, candidates)
        if pred is None:
            return candidates[0]
        prob, margin = pred
        ok = self.predicted_feasible(prob)
        if len(ok) > 1 and self.boundary_is_active(study, hist):
            return candidates[max(ok, key=lambda i: (margin[i], -i))]
        return candidates[ok[0]]

    def screened_mutation(self, study: optuna.Study, parent: Architecture, hist: History,
                          rng: random.Random, avoid: set[str] = frozenset()) -> Architecture:
        """A fresh mutation of ``parent`` (:meth:`fresh_mutation`); with a constraint model,
        ``screen_size`` distinct ones and the one :meth:`prefer_feasible` picks."""
        child = self.fresh_mutation(parent, hist, rng, avoid)
        if not self._screen_each or not self.screens(hist) or self.screen_size == 1:
            return child
        children = {child.key: child}
        for _ in range(self.screen_size - 1):
            other = self.fresh_mutation(parent, hist, rng, set(avoid) | set(children))
            children.setdefault(other.key, other)
        return self.prefer_feasible(study, hist, list(children.values()))

    def fitness(self, study: optuna.Study, values: Sequence[Sequence[float]],
                violations: Sequence[float] | None = None) -> np.ndarray:
        """Higher is better; infeasible trials (``violations`` > 0) penalised by
        ``violation_penalty`` (:func:`fitness`). With known constraints, feasibility first
        (Deb's rule, an infinite penalty): a repairing strategy needs no infeasible parent to
        reach the boundary."""
        penalty = math.inf if self.constraints_known() else self.violation_penalty
        return fitness(values, study.directions, violations, penalty)

    def emit(self, study: optuna.Study, trial: FrozenTrial, metrics: dict[str, float],
             step: int) -> None:
        """Record metrics on the trial (system attribute ``frugalnas:<name>``) and report them."""
        for k, v in metrics.items():
            optuna_compat.set_trial_system_attr(study, trial, f"{STRATEGY_METRIC_PREFIX}{k}",
                                                float(v))
        if self.report is not None:
            self.report(metrics, step)


def strategy_factory(cls: type[_S]) -> type[_S]:
    """``cls`` itself, checked to be registrable as a strategy factory: the study calls it as
    ``cls(space=..., seed=..., host=..., **options)``, and the registry reads its options and
    their defaults from the signature of ``cls.__init__`` and, where that passes
    ``**common`` on, from its bases' (:func:`~frugalnas.host.registry.declared_parameters`),
    so a misspelt option is a :class:`ConfigError` listing the valid ones before the first
    trial and the common options of :class:`ArchSampler` reach every subclass without being
    restated. ``__init__`` must take no ``*args`` and no ``**options`` that no base declares;
    it must not name an option of ``cls.fixed_options``."""
    params = inspect.signature(cls).parameters
    loose = [p.name for p in params.values() if p.kind is p.VAR_POSITIONAL]
    if loose or declared_parameters(cls)[1]:
        raise TypeError(f"strategy {cls.__name__}: __init__ takes options no class declares; "
                        "name each option it accepts (or pass **common on to ArchSampler) so "
                        "the registry can check them")
    fixed = [n for n in cls.fixed_options if n in params]
    if fixed:
        raise TypeError(f"strategy {cls.__name__}: __init__ names {fixed[0]!r}, which "
                        "fixed_options says it sets itself")
    return cls
