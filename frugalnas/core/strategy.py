"""What a study may ask of its strategy beyond optuna's sampler API.

A strategy is any ``optuna.samplers.BaseSampler``. A frugalnas strategy may also implement
the optional methods below; the study and wrapping strategies look for them, never for other
attributes:

``inner``
    A *wrapping* strategy (a pre-screen, a plugin's filter) keeps the strategy it wraps in
    ``inner`` and forwards optuna's calls it does not handle. :func:`strategy_chain` walks
    the ``inner`` links from the outermost strategy to the innermost.
``propose(study, trial, k) -> list[Architecture]``
    ``k`` distinct candidates for ``trial`` that the strategy would choose, best first, none
    already evaluated or running. A pre-screen ranks these; a strategy without ``propose``
    cannot be pre-screened (:func:`propose` raises a :class:`ConfigError` saying so).
``shared_state() -> object``
    A typed object the strategy shares with the study's estimator (SI-EvoNAS's generation
    plans). The study puts it into every :class:`EvaluationContext`; the estimator asks
    ``context.shared(PlanType)``.
``bind(study)``
    Called once when a study starts using the strategy, with the :class:`Study` (to report
    study-level metrics with ``study.log_metrics``).
``should_stop(study) -> bool``
    Asked after each trial; ``True`` ends ``Study.optimize`` (the study stops, not the
    strategy: a strategy whose search has a natural end, like a fixed number of generations).
``planned_trials() -> int | None``
    The number of trials the whole search has when it has a natural end (``None``: open
    ended). The progress bar counts towards it and ``frugalnas run`` says when it is below
    ``n_trials``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import optuna
from optuna.trial import FrozenTrial

from frugalnas.core.errors import ConfigError

if TYPE_CHECKING:
    from frugalnas.core.architecture import Architecture


@runtime_checkable
class Proposer(Protocol):
    """A strategy that can name ``k`` distinct candidates for one trial."""

    def propose(self, study: optuna.Study, trial: FrozenTrial, k: int) -> list[Architecture]: ...


def strategy_chain(sampler: optuna.samplers.BaseSampler) -> Iterator[optuna.samplers.BaseSampler]:
    """``sampler`` and every strategy it wraps (through ``inner``), outermost first."""
    seen: set[int] = set()
    while sampler is not None and id(sampler) not in seen:
        seen.add(id(sampler))
        yield sampler
        sampler = getattr(sampler, "inner", None)


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
    for s in strategy_chain(sampler):
        share = getattr(s, "shared_state", None)
        if callable(share):
            state = share()
            if state is not None:
                found.setdefault(type(state), state)
    return found


def bind(sampler: optuna.samplers.BaseSampler, study: Any) -> None:
    """Call ``bind(study)`` on every strategy of the chain that has it."""
    for s in strategy_chain(sampler):
        hook = getattr(s, "bind", None)
        if callable(hook):
            hook(study)


def can_stop(sampler: optuna.samplers.BaseSampler) -> bool:
    """Whether any strategy of the chain can end the search (has ``should_stop``)."""
    return any(callable(getattr(s, "should_stop", None)) for s in strategy_chain(sampler))


def should_stop(sampler: optuna.samplers.BaseSampler, study: Any) -> bool:
    """Whether any strategy of the chain says the search is over."""
    for s in strategy_chain(sampler):
        hook = getattr(s, "should_stop", None)
        if callable(hook) and hook(study):
            return True
    return False


def planned_trials(sampler: optuna.samplers.BaseSampler) -> int | None:
    """The fewest trials any strategy of the chain plans for the whole search (``None``
    when none of them has a natural end)."""
    plans = []
    for s in strategy_chain(sampler):
        plan = getattr(s, "planned_trials", None)
        total = plan() if callable(plan) else None
        if total is not None:
            plans.append(int(total))
    return min(plans) if plans else None
