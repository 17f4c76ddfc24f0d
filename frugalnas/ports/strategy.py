"""What a study may ask of its strategy beyond optuna's sampler API.

A strategy is any ``optuna.samplers.BaseSampler``. A frugalnas strategy subclasses
:class:`Strategy`, which declares the optional capabilities below with defaults that do
nothing; the study and wrapping strategies call them only on a :class:`Strategy` and never
look for other attributes. A plain optuna sampler has none of them.

``inner``
    A *wrapping* strategy (a pre-screen, a plugin's filter) keeps the strategy it wraps in
    ``inner`` and forwards optuna's calls it does not handle. :func:`strategy_chain` walks
    the ``inner`` links from the outermost strategy to the innermost.
``propose(study, trial, k) -> list[Architecture]`` (the :class:`Proposer` protocol)
    ``k`` distinct candidates for ``trial`` that the strategy would choose, best first, none
    already evaluated or running. A pre-screen ranks these; a strategy without ``propose``
    cannot be pre-screened (:func:`propose` raises a :class:`ConfigError` saying so).
``feasible_candidates(study, trial, candidates) -> list[int] | None``
    Which of ``candidates`` the strategy predicts to meet the study's constraints (indices);
    ``None``: it makes no prediction. A pre-screen scores only those.
``shared_state() -> object | None``
    A typed object the strategy shares with the study's estimator (SI-EvoNAS's generation
    plans). The study puts it into every trial's context; the estimator asks
    ``context.shared(PlanType)``.
``bind(services)``
    Called once when a study starts using the strategy, with :class:`StrategyServices`: what
    the strategy may use of the study (report study-level metrics, load the study's dataset,
    its backend), never the study itself.
``should_stop(study) -> bool``
    Asked after each trial with the optuna study; ``True`` ends ``Study.optimize`` (the study
    stops, not the strategy: a strategy whose search has a natural end, like a fixed number
    of generations).
``planned_trials() -> int | None``
    The number of trials the whole search has when it has a natural end (``None``: open
    ended). The progress bar counts towards it and ``frugalnas run`` says when it is below
    ``n_trials``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.errors import ConfigError

if TYPE_CHECKING:
    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.backend import Backend
    from frugalnas.ports.data import DataSource


@dataclass(frozen=True)
class StrategyServices:
    """What a study lends its strategy (:meth:`Strategy.bind`).

    ``log_metrics(metrics, step)`` reports study-level metrics (surrogate quality, training
    curves) to the study's plugins; ``load_dataset()`` is the study's dataset (``None`` when
    the study has none); ``backend()`` is the study's training backend.

    ``known_constraints(arch)``: in a study with constraints, each constraint's
    ``value - bound`` for ``arch`` (<= 0: met), in constraint-name order (sorted, the order of
    a trial's recorded constraints), when the study's estimator knows every constrained metric
    before evaluating (:meth:`~frugalnas.ports.estimator.Estimator.known_metrics`); ``None``
    when it does not. The field is ``None`` in a study without constraints.

    ``known_objectives(arch)``: in a study with several objectives, each objective's value for
    ``arch`` in the study's objective order, as the estimator knows it before evaluating
    (``None`` for an objective it does not know, such as accuracy beside a tabulated latency).
    The field is ``None`` in a study with one objective."""

    log_metrics: Callable[[dict[str, float], int], None]
    load_dataset: Callable[[], DataSource] | None
    backend: Callable[[], Backend]
    known_constraints: Callable[[Architecture], tuple[float, ...] | None] | None = None
    known_objectives: Callable[[Architecture], tuple[float | None, ...]] | None = None


class Strategy(optuna.samplers.BaseSampler):
    """Base of frugalnas strategies: optuna's sampler API plus the optional capabilities of
    this module, each a no-op here."""

    #: The strategy a wrapping strategy wraps (``None``: it wraps none).
    inner: optuna.samplers.BaseSampler | None = None

    def bind(self, services: StrategyServices) -> None:
        """Called once when a study starts using this strategy."""

    def should_stop(self, study: optuna.Study) -> bool:
        """Whether the search is over (asked after each trial)."""
        return False

    def planned_trials(self) -> int | None:
        """Trials of the whole search when it has a natural end."""
        return None

    def shared_state(self) -> object | None:
        """An object shared with the study's estimator."""
        return None

    def feasible_candidates(self, study: optuna.Study, trial: FrozenTrial,
                            candidates: Sequence[Architecture]) -> list[int] | None:
        """Indices of the ``candidates`` predicted feasible; ``None``: no prediction."""
        return None


class WrappingStrategy(Strategy):
    """Base of a strategy that chooses each trial's decisions itself, through
    ``sample_relative``, around the sampler it wraps (``inner``, set by the subclass): every
    other call of optuna's sampler API goes to ``inner``, so its state follows the study."""

    inner: optuna.samplers.BaseSampler

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


@runtime_checkable
class Proposer(Protocol):
    """A strategy that can name ``k`` distinct candidates for one trial."""

    def propose(self, study: optuna.Study, trial: FrozenTrial, k: int) -> list[Architecture]: ...


def strategy_chain(sampler: optuna.samplers.BaseSampler) -> Iterator[optuna.samplers.BaseSampler]:
    """``sampler`` and every strategy it wraps (through ``inner``), outermost first."""
    seen: set[int] = set()
    current: optuna.samplers.BaseSampler | None = sampler
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.inner if isinstance(current, Strategy) else None


def strategies_of(sampler: optuna.samplers.BaseSampler) -> Iterator[Strategy]:
    return (s for s in strategy_chain(sampler) if isinstance(s, Strategy))


def propose(sampler: optuna.samplers.BaseSampler, study: optuna.Study, trial: FrozenTrial,
            k: int) -> list[Architecture]:
    """``k`` distinct candidates from ``sampler``, or a ConfigError naming a strategy that
    cannot give them."""
    if not isinstance(sampler, Proposer):
        raise ConfigError(
            f"strategy {type(sampler).__name__} cannot propose several distinct candidates per "
            "trial (it has no propose(study, trial, k)); use a frugalnas strategy such as "
            "'random', 'regularized-evolution', 'local-search', 'surrogate-evolution' or "
            "'bananas' inside a pre-screen")
    return sampler.propose(study, trial, k)


def shared_states(sampler: optuna.samplers.BaseSampler) -> dict[type, Any]:
    """The objects the strategies of the chain share with estimators, keyed by type."""
    found: dict[type, Any] = {}
    for s in strategies_of(sampler):
        state = s.shared_state()
        if state is not None:
            found.setdefault(type(state), state)
    return found


def known_constraint_margins(known: Mapping[str, float], constraints: Mapping[str, float]
                             ) -> tuple[float, ...] | None:
    """``value - bound`` of each constraint (sorted by name) from the ``known`` metrics of an
    architecture; ``None`` unless every constrained metric is known and finite."""
    margins = []
    for name in sorted(constraints):
        value = known.get(name)
        if value is None or not math.isfinite(float(value)):
            return None
        margins.append(float(value) - float(constraints[name]))
    return tuple(margins)


def known_objective_values(known: Mapping[str, float], objectives: Sequence[str]
                           ) -> tuple[float | None, ...]:
    """Each objective's value among the ``known`` metrics of an architecture (``None`` where
    it is missing or not finite)."""
    out: list[float | None] = []
    for name in objectives:
        value = known.get(name)
        out.append(float(value) if value is not None and math.isfinite(float(value)) else None)
    return tuple(out)


def can_stop(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether any strategy of the chain can end the search (overrides ``should_stop``)."""
    return any(type(s).should_stop is not Strategy.should_stop for s in strategies_of(sampler))


def should_stop(sampler: optuna.samplers.BaseSampler, study: optuna.Study) -> bool:
    """Whether any strategy of the chain says the search of ``study`` is over."""
    return any(s.should_stop(study) for s in strategies_of(sampler))


def planned_trials(sampler: optuna.samplers.BaseSampler) -> int | None:
    """The fewest trials any strategy of the chain plans for the whole search (``None``
    when none of them has a natural end)."""
    plans = [int(total) for s in strategies_of(sampler)
             if (total := s.planned_trials()) is not None]
    return min(plans) if plans else None


def feasible_candidates(sampler: optuna.samplers.BaseSampler, study: optuna.Study,
                        trial: FrozenTrial, candidates: Sequence[Architecture]) -> list[int]:
    """The indices of ``candidates`` that ``sampler`` predicts feasible; all of them when it
    makes no prediction."""
    chosen = sampler.feasible_candidates(study, trial, candidates) \
        if isinstance(sampler, Strategy) else None
    return list(range(len(candidates))) if chosen is None else chosen
