"""The rank ensemble's spectral aggregation (label-free weights from the members' agreement)
and the learned ensemble's leave-one-out ridge penalty, on cases with known answers."""

import numpy as np
import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies.ensemble import (AGGREGATIONS, aggregate, fit_weights, rank_average,
                                        spectral_weights)

HOST = PluginHost()


def noisy_copies(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Columns: an exact copy of a hidden ranking, two noisy copies (more noise in the second)
    and pure noise."""
    rng = np.random.default_rng(seed)
    truth = rng.standard_normal(n)
    return np.column_stack([truth, truth + 0.5 * rng.standard_normal(n),
                            truth + 1.5 * rng.standard_normal(n),
                            rng.standard_normal(n)]), truth


def test_spectral_weights_follow_agreement_with_the_hidden_ranking():
    m, _ = noisy_copies()
    w = spectral_weights(m)
    assert w.sum() == pytest.approx(1.0) and w.min() >= 0.0
    assert w[0] == w.max() and w[0] > w[1] > w[2]
    assert w[3] < 0.05  # the noise member agrees with nobody
    # scale-free: any increasing transform of a member leaves its ranks and weight unchanged
    assert spectral_weights(np.column_stack([np.exp(m[:, 0]), m[:, 1:]])) == pytest.approx(w)


def test_spectral_weights_by_hand_on_three_members():
    # columns 0 and 1 agree perfectly, column 2 is reversed: Spearman matrix
    # [[1, 1, -1], [1, 1, -1], [-1, -1, 1]] has leading eigenvector (1, 1, -1) / sqrt(3);
    # oriented to a positive sum and clipped at 0: weights 1/2, 1/2, 0
    m = np.array([[1.0, 10.0, 3.0], [2.0, 20.0, 2.0], [3.0, 30.0, 1.0]])
    assert spectral_weights(m) == pytest.approx([0.5, 0.5, 0.0])
    assert aggregate(m, None, "spectral") == pytest.approx(rank_average(m, [1.0, 1.0, 0.0]))


def test_spectral_weights_are_equal_on_tiny_populations_and_constant_members():
    assert spectral_weights(np.array([[1.0, 2.0], [2.0, 1.0]])) == pytest.approx([0.5, 0.5])
    assert spectral_weights(np.array([[1.0, 5.0, 7.0]])) == pytest.approx([1 / 3] * 3)
    # a constant member correlates with nothing (weight 0); the two that agree share the rest
    m = np.array([[1.0, 1.0, 4.0], [2.0, 2.0, 4.0], [3.0, 3.0, 4.0], [4.0, 4.0, 4.0]])
    assert spectral_weights(m) == pytest.approx([0.5, 0.5, 0.0])


def test_spectral_aggregation_beats_equal_weights_when_a_member_is_noise():
    m, truth = noisy_copies(seed=1)
    m = np.column_stack([m[:, 1:3], m[:, 3], np.random.default_rng(2).standard_normal(len(m))])

    def rho(score):
        return np.corrcoef(np.argsort(np.argsort(score)), np.argsort(np.argsort(truth)))[0, 1]

    assert rho(aggregate(m, None, "spectral")) > rho(aggregate(m, None, "mean-rank")) + 0.05


def test_bad_aggregation_and_spectral_with_weights_are_refused():
    assert AGGREGATIONS == ("mean-rank", "log-rank", "spectral")
    m, _ = noisy_copies(n=10)
    with pytest.raises(ConfigError, match="'mean-rank', 'log-rank', 'spectral'"):
        aggregate(m, None, "eigen")
    with pytest.raises(ConfigError, match="spectral"):
        aggregate(m, [1.0] * 4, "spectral")
    with pytest.raises(ConfigError, match="'mean-rank', 'log-rank', 'spectral'"):
        HOST.create_estimator("rank-ensemble", {"aggregation": "eigen"})
    with pytest.raises(ConfigError, match="weights"):
        HOST.create_estimator("rank-ensemble", {"aggregation": "spectral",
                                                "proxies": ["params", "synflow"],
                                                "weights": [1.0, 2.0]})
    with pytest.raises(ConfigError, match="'mean-rank', 'log-rank'"):
        HOST.create_estimator("learned-ensemble", {"teacher": "nb201-table",
                                                   "aggregation": "spectral"})
    with pytest.raises(ConfigError, match="'none', 'loo'"):
        HOST.create_estimator("learned-ensemble", {"teacher": "nb201-table",
                                                   "penalty": "lasso"})
    with pytest.raises(ConfigError, match="'none', 'loo'"):
        fit_weights(m, m[:, 0], "l1")


def test_rank_ensemble_estimator_with_spectral_aggregation_in_a_study():
    proxies = ["params", "synflow", "l2_norm"]
    study = frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                                   estimator="rank-ensemble", dataset=None,
                                   estimator_options={"proxies": proxies,
                                                      "aggregation": "spectral",
                                                      "data": "gaussian",
                                                      "input_shape": [3, 8, 8], "batch_size": 4},
                                   disable_plugins=["mlflow", "progress"], seed=0)
    study.optimize(6)
    trials = study.trials
    assert trials[0].value == 0.5  # alone: the middle rank
    rows = np.array([[t.user_attrs["metrics"][f"proxy_{n}"] for n in proxies] for t in trials])
    # each trial is ranked among itself and the trials before it, with weights from them
    for i in (1, 5):
        expected = rank_average(rows[: i + 1], spectral_weights(rows[: i + 1]))[-1]
        assert trials[i].value == pytest.approx(expected)
    assert trials[1].value == pytest.approx(rank_average(rows[:2])[-1])  # 2 < 3: equal weights


def test_fit_weights_loo_recovers_a_member_that_is_the_target():
    rng = np.random.default_rng(0)
    target = rng.standard_normal(50)
    m = np.column_stack([rng.standard_normal(50), target, rng.standard_normal(50)])
    for penalty in ("none", "loo"):
        assert fit_weights(m, target, penalty) == pytest.approx([0.0, 1.0, 0.0], abs=1e-9)


def test_fit_weights_loo_shrinks_towards_equal_weights_on_noisy_labels():
    # two members that are equally good noisy views of the target (the best split is 1/2
    # each): with 12 labels plain NNLS splits them unevenly by chance; the leave-one-out
    # ridge, on average over 20 draws, splits them more evenly
    rng = np.random.default_rng(3)
    gaps_plain, gaps_ridge = [], []
    for _ in range(20):
        truth = rng.standard_normal(12)
        m = truth[:, None] + rng.standard_normal((12, 2))
        target = truth + 0.3 * rng.standard_normal(12)
        gaps_plain.append(abs(fit_weights(m, target)[0] - 0.5))
        gaps_ridge.append(abs(fit_weights(m, target, "loo")[0] - 0.5))
    assert np.mean(gaps_ridge) < np.mean(gaps_plain) - 0.01


def test_learned_ensemble_with_the_loo_penalty_in_a_study():
    proxies = ["synflow", "params", "l2_norm"]
    study = frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                                   estimator="learned-ensemble", dataset=None,
                                   disable_plugins=["mlflow", "progress"], seed=5,
                                   estimator_options={"proxies": proxies, "penalty": "loo",
                                                      "teacher": "nb201-table",
                                                      "teacher_options": {"any_network": True},
                                                      "teacher_every": 2, "min_labelled": 3,
                                                      "data": "gaussian",
                                                      "input_shape": [3, 8, 8],
                                                      "batch_size": 4})
    study.optimize(6)
    metrics = [t.user_attrs["metrics"] for t in study.trials]
    labelled = [m for m in metrics[:-1] if "teacher_value" in m]
    rows = np.array([[m[f"proxy_{n}"] for n in proxies] for m in labelled])
    expected = fit_weights(rows, [m["teacher_value"] for m in labelled], "loo")
    assert [metrics[-1][f"weight_{n}"] for n in proxies] == pytest.approx(expected)
