"""The services a study lends its strategy (:class:`~frugalnas.ports.strategy.StrategyServices`),
made from the study's configuration, estimator, dataset and backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import optuna

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.strategy import (StrategyServices, known_constraint_margins,
                                      known_objective_values, strategies_of)

if TYPE_CHECKING:
    from frugalnas.engine.study import Study


def services_of(study: Study) -> StrategyServices:
    """The services a frugalnas :class:`~frugalnas.engine.study.Study` lends its strategy."""
    constraints = dict(study.config.constraints)
    objectives = list(study.config.objectives)

    def known_constraints(arch: Architecture) -> tuple[float, ...] | None:
        # The estimator is created on first use, as for a trial.
        return known_constraint_margins(study.estimator.known_metrics(arch, study.space),
                                        constraints)

    def known_objectives(arch: Architecture) -> tuple[float | None, ...]:
        return known_objective_values(study.estimator.known_metrics(arch, study.space),
                                      objectives)

    return StrategyServices(
        log_metrics=study.log_metrics,
        load_dataset=study.load_dataset if study.config.dataset is not None else None,
        backend=lambda: study.backend,
        known_constraints=known_constraints if constraints else None,
        known_objectives=known_objectives if len(objectives) > 1 else None)


def bind_strategy(sampler: optuna.samplers.BaseSampler, study: Study) -> None:
    """Bind every strategy of the chain to ``study``'s :class:`StrategyServices`."""
    services = services_of(study)
    for s in strategies_of(sampler):
        s.bind(services)
