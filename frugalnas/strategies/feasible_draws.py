"""FeasibleDraws: an optuna sampler that proposes only architectures known to meet the
study's constraints, when the study's estimator knows them before evaluating.

optuna's samplers learn feasibility from evaluated trials (constrained TPE, constrained
domination in NSGA-II). When the constrained metrics are known in advance (a latency table, a
latency predictor, a parameter count), an evaluation spent on an infeasible candidate is
wasted. :class:`FeasibleDraws` keeps the wrapped sampler's search and its constraint handling
and adds rejection: each trial's architecture is the first of up to ``max_draws`` draws of the
wrapped sampler that meets every known constraint, or the draw that violates them least when
none does. Rejected draws are not evaluated and not recorded; the wrapped sampler's random
state moves on with each draw, so a seed still fixes the whole study.

Without known constraints (no constraints, or an estimator that learns them only by
evaluating) every call goes to the wrapped sampler unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from frugalnas.core.architecture import Architecture
from frugalnas.core.errors import check_range
from frugalnas.core.space import SearchSpace
from frugalnas.core.strategy import Strategy, StrategyServices

#: Draws of the wrapped sampler per trial before settling for the least violating one.
DEFAULT_MAX_DRAWS = 100


class FeasibleDraws(Strategy):
    """``inner`` (an optuna sampler) restricted to the architectures of ``space`` known to
    meet the study's constraints: up to ``max_draws`` draws a trial (see the module
    docstring)."""

    def __init__(self, inner: optuna.samplers.BaseSampler, space: SearchSpace,
                 max_draws: int = DEFAULT_MAX_DRAWS):
        check_range("max_draws", max_draws, 1)
        self.inner = inner
        self.space = space
        self.max_draws = int(max_draws)
        self._known: Callable[[Architecture], tuple[float, ...] | None] | None = None
        self._active: bool | None = None
        #: Draws made and draws rejected so far, for a user or a test to inspect.
        self.draws = 0
        self.rejected = 0

    def __repr__(self) -> str:
        return f"FeasibleDraws({self.inner!r}, max_draws={self.max_draws})"

    # -- frugalnas's strategy protocol ---------------------------------------------------
    def bind(self, services: StrategyServices) -> None:
        self._known, self._active = services.known_constraints, None

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
        missed: list[tuple[Architecture, Sequence[float]]] = []
        chosen: Architecture | None = None
        for _ in range(self.max_draws):
            arch = self.space.from_params(self._draw(study, trial, search_space))
            margins = self._known(arch) if self._known is not None else None
            self.draws += 1
            if margins is None or all(d <= 0 for d in margins):
                chosen = arch
                break
            self.rejected += 1
            missed.append((arch, margins))
        if chosen is None:
            chosen = least_violating(missed)
        return {k: v for k, v in chosen.decisions.items() if k in search_space}

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

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


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
