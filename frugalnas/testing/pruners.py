"""The pruner checks of the conformance suite."""

from __future__ import annotations

from typing import Any

from frugalnas.testing._suite import Suite, describe


class PrunerChecks(Suite):
    """The pruner contract: an ``optuna.pruners.BasePruner`` whose ``prune(study, trial)``
    returns a bool for trials of a real in-memory study that report intermediate values; a
    pruner with ``prune_vector`` (several objectives) returns a bool for objective vectors of
    a two-objective study, and never prunes before any other trial reported."""

    kind = "pruners"
    checks = ("check_is_pruner", "check_decides")

    def __init__(self, pruner: Any, *, name: str | None = None):
        self.pruner = pruner
        self.subject = describe("pruner", pruner, name)

    def check_is_pruner(self) -> None:
        import optuna

        if not isinstance(self.pruner, optuna.pruners.BasePruner):
            self.fail(f"is a {type(self.pruner).__name__}, not an optuna.pruners.BasePruner")

    def check_decides(self) -> None:
        import numpy as np
        import optuna

        vector = getattr(self.pruner, "prune_vector", None)
        if not callable(vector):
            study = optuna.create_study(pruner=self.pruner)
            for i in range(6):
                trial = study.ask()
                for step in range(3):
                    trial.report(float(i * (step + 1)), step)
                    frozen = study.get_trials(deepcopy=False)[trial.number]
                    answer = self.pruner.prune(study, frozen)
                    if not isinstance(answer, (bool, np.bool_)):
                        self.fail(f"prune() returned {answer!r}; expected a bool")
                study.tell(trial, float(i))
            return
        study = optuna.create_study(directions=["maximize", "minimize"])
        if vector(study, 0, 1, [1.0, 1.0]) is not False:
            self.fail("prune_vector() pruned the first trial of a study (nothing to compare "
                      "with)")
        for i in range(8):
            trial = study.ask()
            trial.set_user_attr("intermediate_values", {"1": [float(i), float(i)]})
            answer = vector(study, trial.number, 1, [float(i), float(i)])
            if not isinstance(answer, bool):
                self.fail(f"prune_vector() returned {answer!r}; expected a bool")
            study.tell(trial, [float(i), float(i)])
