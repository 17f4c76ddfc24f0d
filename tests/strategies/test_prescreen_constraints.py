"""The pre-screen in a constrained study: its proxy chooses among the candidates the inner
strategy's constraint model predicts feasible, so a proxy that favours large networks does not
steer a size-bounded search into infeasible cells."""

import numpy as np

import frugalnas
from frugalnas.ports.keys import PRESCREEN_ATTR
from frugalnas.spaces.nb201.table import nb201_data

SMALL = {"N": 1, "C": 8}


def constrained_prescreen(constraint_model: bool, bound: float) -> frugalnas.Study:
    study = frugalnas.create_study(
        space_options=SMALL, estimator="nb201-table", dataset=None, seed=3,
        # params known only once evaluated: the inner strategy's model predicts feasibility;
        # the proxy builds the small networks, the table scores the cells as in the benchmark
        estimator_options={"known_hardware": False, "any_network": True},
        constraints={"params": bound}, disable_plugins=["mlflow", "progress"],
        strategy="prescreen",
        strategy_options={"inner": "regularized-evolution", "proxy": "params", "k": 8,
                          "data": "gaussian", "input_shape": [3, 8, 8], "batch_size": 2,
                          "inner_options": {"population_size": 8, "sample_size": 3,
                                            "constraint_model": constraint_model}})
    study.optimize(40)
    return study


def test_the_proxy_picks_among_predicted_feasible_candidates():
    # the bound: the median parameter count of the table's cells (benchmark networks)
    bound = float(np.median(nb201_data().params))
    aware = constrained_prescreen(True, bound)
    blind = constrained_prescreen(False, bound)

    def feasible_share(study: frugalnas.Study, start: int) -> float:
        return float(np.mean([t.user_attrs["feasible"] for t in study.trials[start:]]))

    # the blind pre-screen keeps the largest of 8 candidates: always over the median here; the
    # aware one keeps the largest of those predicted feasible, so it works at the boundary
    # and lands on either side of it
    assert feasible_share(blind, 0) < 0.1
    assert feasible_share(aware, 10) > 0.3
    # fewer candidates are scored once the model rules some out, and the best trial is feasible
    scored = [t.system_attrs[PRESCREEN_ATTR]["prescreen_scored"] for t in aware.trials[10:]]
    assert min(scored) < 8
    assert aware.best_trial.user_attrs["feasible"]
