"""FeasibleDraws: an optuna sampler that proposes only architectures known to meet the
study's constraints, when the study's estimator knows them before evaluating.

optuna's samplers learn feasibility from evaluated trials (constrained TPE, constrained
domination in NSGA-II). When the constrained metrics are known in advance (a latency table, a
latency predictor, a parameter count), an evaluation spent on an infeasible candidate is
wasted. :class:`FeasibleDraws` keeps the wrapped sampler's search and its constraint handling
and adds rejection: each trial's architecture is chosen among the first ``screen`` draws of the
wrapped sampler that meet every known constraint and repeat no architecture of the study's
other trials (at most ``max_draws`` draws in all). When no draw qualifies, it is a random
architecture never proposed that meets the constraints (1,000 tries), else the draw that
violates them least. Rejected draws are not evaluated and not recorded; the wrapped sampler's
random state moves on with each draw, so a seed still fixes the whole study.

Repeats are rejected because the wrapped samplers do not avoid them: optuna's TPE, its model
narrowing on the best region, proposes architectures it has evaluated again (19-29 % of the
trials of three 100-trial NAS-Bench-201 studies under a Raspberry Pi 4 latency bound),
and frugalnas's own strategies never evaluate an architecture twice.

Of the feasible draws, the one nearest the constraint boundary is taken when the study has one
objective and its completed trials get better towards the boundary (a positive rank
correlation between the objective and the tightest scaled margin): then the constrained
optimum is likely on the boundary (Schoenauer & Michalewicz, "Evolutionary computation at the
edge of feasibility", PPSN 1996). Otherwise the first feasible draw is taken.

Without known constraints (no constraints, or an estimator that learns them only by
evaluating) every call goes to the wrapped sampler unchanged.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.strategy import StrategyServices, WrappingStrategy
from frugalnas.multiobjective.feasibility import improves_towards_boundary
from frugalnas.multiobjective.pareto import direction_signs

#: Draws of the wrapped sampler per trial before settling for the least violating one.
DEFAULT_MAX_DRAWS = 100
#: Feasible draws per trial among which the one nearest the boundary is taken (when the
#: boundary is active). 10 was chosen on seeds 100-179 of benchmarks/hw_nb201.py with optuna's
#: TPE (against 1, 5, 20 and 40), apart from the reported seeds 0-9.
DEFAULT_SCREEN = 10


class FeasibleDraws(WrappingStrategy):
    """``inner`` (an optuna sampler) restricted to the architectures of ``space`` known to
    meet the study's constraints: up to ``max_draws`` draws a trial, the one nearest the
    boundary of the first ``screen`` feasible ones (see the module docstring; ``screen=1``:
    the first feasible draw)."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: SearchSpace,
                 max_draws: int = DEFAULT_MAX_DRAWS, screen: int = DEFAULT_SCREEN):
        check_range("max_draws", max_draws, 1)
        check_range("screen", screen, 1)
        self.screen = int(screen)
        self.inner = inner
        self.space = space
        self.max_draws = int(max_draws)
        self._known: Callable[[Architecture], tuple[float, ...] | None] | None = None
        self._active: bool | None = None
        #: The known margins and the value of each completed trial, by trial number.
        self._completed: dict[int, tuple[Sequence[float], float]] = {}
        #: Draws made, draws rejected (known infeasible), feasible draws passed over for one
        #: nearer the boundary, draws that repeated an earlier trial, and trials given a
        #: fresh random architecture (no draw qualified) so far, for a user or a test to
        #: inspect.
        self.draws = 0
        self.rejected = 0
        self.passed_over = 0
        self.repeated = 0
        self.fallbacks = 0
        self._seen: set[Architecture] = set()
        self._feed = optuna_compat.TrialFeed()
        self._open: set[int] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FeasibleDraws({self.inner!r}, max_draws={self.max_draws}, screen={self.screen})"

    # -- frugalnas's strategy protocol ---------------------------------------------------
    def bind(self, services: StrategyServices) -> None:
        self._known, self._active = services.known_constraints, None
        self._completed = {}
        self._seen, self._feed, self._open = set(), optuna_compat.TrialFeed(), set()

    def active(self) -> bool:
        """Whether the study's estimator knows the constrained metrics before evaluating
        (asked once per binding, of one fixed architecture of the space)."""
        if self._active is None:
            self._active = (self._known is not None
                            and self._known(self.space.sample(random.Random(0))) is not None)
        return self._active

    # -- optuna's sampler API ------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if not self.active():
            return self.inner.infer_relative_search_space(study, trial)
        return {k: d for k, d in self.space.distributions().items() if not d.single()}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not self.active():
            return self.inner.sample_relative(study, trial, search_space)
        if not search_space:
            return {}
        with self._lock:  # optuna's threads (n_jobs > 1) share the feed and the seen set
            return self._sample_feasible(study, trial, search_space)

    def _sample_feasible(self, study: optuna.Study, trial: FrozenTrial,
                         search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        missed: list[tuple[Architecture, Sequence[float]]] = []
        met: list[tuple[Architecture, Sequence[float]]] = []
        self._catch_up(study, trial.number)
        screen = self.screen if self.screen > 1 and self._completed_improve(study) else 1
        seen = self._seen
        for _ in range(self.max_draws):
            arch = self.space.from_params(self._draw(study, trial, search_space))
            self.draws += 1
            if arch in seen:
                self.repeated += 1
                continue
            margins = self._known(arch) if self._known is not None else None
            if _meets(margins):
                met.append((arch, margins or ()))
                if len(met) >= screen:
                    break
                continue
            self.rejected += 1
            missed.append((arch, margins))
        if met:
            chosen = nearest_boundary(met)
        else:
            self.fallbacks += 1
            fresh = self._fresh_feasible(seen, random.Random(f"feasible:{trial.number}"))
            if fresh is not None:
                chosen = fresh
            elif missed:
                chosen = least_violating(missed)
            else:  # every draw repeated a trial and the space holds no new feasible one
                chosen = self.space.sample(random.Random(trial.number))
        self.passed_over += max(0, len(met) - 1)
        seen.add(chosen)
        return {k: v for k, v in chosen.decisions.items() if k in search_space}

    def _catch_up(self, study: optuna.Study, current: int | None) -> None:
        """Read the trials created since the last call and those then unfinished (not
        ``current``, the trial being sampled): each one's architecture joins the seen set,
        and each completed one's known margins and value are kept."""
        for t in self._feed.read(study, self._open):
            arch = None
            if t.number != current:
                try:
                    arch = self.space.from_params(t.params)
                except Exception:  # decisions still missing, or a trial of another space
                    arch = None
            if arch is not None:
                self._seen.add(arch)
            if not t.state.is_finished():  # read again: it may complete, or set its decisions
                self._open.add(t.number)
                continue
            self._open.discard(t.number)
            if t.state == TrialState.COMPLETE and arch is not None and self._known is not None:
                margins = self._known(arch)
                if margins is not None:
                    self._completed[t.number] = (margins, float(t.value))

    def _fresh_feasible(self, seen: set[Architecture], rng: random.Random,
                        tries: int = 1000) -> Architecture | None:
        """A random architecture never proposed that meets the known constraints, if
        ``tries`` draws find one."""
        for _ in range(tries):
            arch = self.space.sample(rng)
            if arch in seen:
                continue
            if _meets(self._known(arch) if self._known is not None else None):
                return arch
        return None

    def boundary_is_active(self, study: optuna.Study) -> bool:
        """Whether ``study`` has one objective and its completed trials get better towards
        the constraint boundary: a positive rank correlation between the objective (higher
        is better) and the trial's tightest known margin, each margin in units of its
        constraint's spread (at least three trials)."""
        self._catch_up(study, None)
        return self._completed_improve(study)

    def _completed_improve(self, study: optuna.Study) -> bool:
        """:meth:`boundary_is_active` on the completed trials read so far."""
        if len(study.directions) != 1:
            return False
        completed = [self._completed[n] for n in sorted(self._completed)]
        rows = [margins for margins, _ in completed]
        values = [value for _, value in completed]
        if len(rows) < 3:
            return False
        objective = direction_signs(study.directions) * np.asarray(values, dtype=float)
        return improves_towards_boundary(objective, np.asarray(rows, dtype=float))

    def _draw(self, study: optuna.Study, trial: FrozenTrial,
              search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        """One full set of decisions as the wrapped sampler would choose them for ``trial``:
        its relative sample, completed decision by decision by its independent sample."""
        inner_space = self.inner.infer_relative_search_space(study, trial)
        params = dict(self.inner.sample_relative(study, trial, inner_space)) if inner_space else {}
        for name, dist in search_space.items():
            if name not in params:
                params[name] = self.inner.sample_independent(study, trial, name, dist)
        return params


def _meets(margins: Sequence[float] | None) -> bool:
    """Whether known ``margins`` meet every constraint (``None``, nothing known: no reason
    to reject)."""
    return margins is None or all(d <= 0 for d in margins)


def nearest_boundary(met: Sequence[tuple[Architecture, Sequence[float]]]) -> Architecture:
    """Of feasible architectures, the one whose tightest constraint is nearest its bound
    (each margin in units of that constraint's largest margin among ``met``)."""
    width = len(met[0][1])
    scale = [max(abs(m[i]) for _, m in met) or 1.0 for i in range(width)]
    return max(met, key=lambda item: max((d / s for d, s in zip(item[1], scale)),
                                         default=0.0))[0]


def least_violating(missed: Sequence[tuple[Architecture, Sequence[float]]]) -> Architecture:
    """The architecture that violates fewest constraints, then least in all: each violation
    in units of the largest violation of that constraint among ``missed`` (the constraints'
    units differ)."""
    width = len(missed[0][1])
    scale = [max((max(0.0, m[i]) for _, m in missed), default=0.0) or 1.0 for i in range(width)]

    def excess(item: tuple[Architecture, Sequence[float]]) -> tuple[int, float]:
        over = [(max(0.0, d) / s) for d, s in zip(item[1], scale)]
        return sum(o > 0 for o in over), sum(over)

    return min(missed, key=excess)[0]
