"""Rank ensembles of zero-cost proxies.

A proxy's raw values live on unrelated scales (synflow spans tens of orders of magnitude,
naswot is a log-determinant), so the ensemble combines *ranks*: each proxy's values are
turned into percentile ranks within a population, and the score is their (weighted) mean.

Within a study the population is the candidate plus every completed trial of the study
whose stored metrics hold a value for each member proxy (``proxy_<name>``, written by these
estimators and by :class:`~frugalnas.strategies.prescreen.PrescreenSampler`). A trial's score is
therefore its standing among the trials seen so far: early scores rest on few neighbours,
which is fine for selection (it is what a rank-based evolution or pre-screen uses) but means
the scores of two trials are not comparable across very different population sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import nnls
from scipy.stats import rankdata, spearmanr

from frugalnas.core.architecture import Architecture
from frugalnas.core.cost import Cost
from frugalnas.core.errors import ConfigError, check_choice, check_range
from frugalnas.core.estimator import EstimateResult, EvaluationContext, Estimator
from frugalnas.core.latency import LATENCY_METRICS, check_latency_options
from frugalnas.proxies.base import DATA_SOURCES, Proxy, score_network

DEFAULT_MEMBERS = ("synflow", "naswot", "jacob_cov", "params")
TEACHER_METRIC = "teacher_value"
#: How member ranks combine: the weighted mean of percentile ranks, or AZ-NAS's non-linear
#: aggregation, the weighted mean of log(rank / n) (Lee & Ham, CVPR 2024), which rewards
#: networks that rank high on every member and punishes a low rank on any one.
AGGREGATIONS = ("mean-rank", "log-rank")


def percentile_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks scaled to [0, 1] (ties share their mean rank; a single value ranks 0.5)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 1:
        return np.array([0.5])
    return (rankdata(v) - 1.0) / (len(v) - 1.0)


def rank_average(matrix: np.ndarray, weights: Sequence[float] | None = None) -> np.ndarray:
    """The weighted mean percentile rank of each row of ``matrix`` (rows: networks, columns:
    proxies); equal weights by default."""
    m = np.asarray(matrix, dtype=float)
    ranks = np.column_stack([percentile_ranks(m[:, j]) for j in range(m.shape[1])])
    w = np.ones(m.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    if w.sum() <= 0:
        w = np.ones(m.shape[1])
    return ranks @ (w / w.sum())


def log_rank_average(matrix: np.ndarray, weights: Sequence[float] | None = None) -> np.ndarray:
    """AZ-NAS's aggregation: the weighted mean over columns of log(rank / n), ranks 1 (worst)
    to n (best), ties sharing their mean rank (equal weights: the paper's sum of log-ranks
    divided by the number of proxies, the same order)."""
    m = np.asarray(matrix, dtype=float)
    logs = np.column_stack([np.log(rankdata(m[:, j]) / len(m)) for j in range(m.shape[1])])
    w = np.ones(m.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    if w.sum() <= 0:
        w = np.ones(m.shape[1])
    return logs @ (w / w.sum())


def aggregate(matrix: np.ndarray, weights: Sequence[float] | None = None,
              aggregation: str = "mean-rank") -> np.ndarray:
    """Each row's combined score under ``aggregation`` (``AGGREGATIONS``)."""
    check_choice("ensemble aggregation", aggregation, AGGREGATIONS)
    if aggregation == "log-rank":
        return log_rank_average(matrix, weights)
    return rank_average(matrix, weights)


def fit_weights(matrix: np.ndarray, target: Sequence[float]) -> np.ndarray:
    """Non-negative weights (summing to 1) for :func:`rank_average`, fitted by non-negative
    least squares of the target's ranks on the proxies' ranks; equal weights when the fit
    finds no proxy that helps."""
    m = np.asarray(matrix, dtype=float)
    ranks = np.column_stack([percentile_ranks(m[:, j]) for j in range(m.shape[1])])
    t = percentile_ranks(target)
    w, _ = nnls(ranks - ranks.mean(0), t - t.mean())
    return w / w.sum() if w.sum() > 0 else np.full(m.shape[1], 1.0 / m.shape[1])


def stored_population(study: Any, names: Sequence[str],
                      extra: Sequence[str] = ()) -> list[dict[str, float]]:
    """Per-trial metrics of the study's completed trials that hold ``proxy_<name>`` for every
    name (from the estimator's stored metrics or the pre-screen's record), plus ``extra``
    metrics when present."""
    if study is None:
        return []
    from optuna.trial import TrialState

    from frugalnas.core.keys import METRICS_ATTR, PRESCREEN_ATTR

    keys = [f"proxy_{n}" for n in names]
    out = []
    for t in study.optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        found = {**t.system_attrs.get(PRESCREEN_ATTR, {}), **t.user_attrs.get(METRICS_ATTR, {})}
        if all(k in found for k in keys):
            out.append({k: float(found[k]) for k in (*keys, *extra) if k in found})
    return out


class RankEnsembleEstimator(Estimator):
    """Mean percentile rank of several zero-cost proxies among the trials seen so far.

    ``aggregation="log-rank"`` combines the ranks as AZ-NAS does (mean of log(rank / n)).

    ``latency=True`` also measures the network's inference latency on the backend's device
    (batches of ``latency_batch_size``) and adds ``latency_ms`` and ``latency_ms_iqr``."""

    name = "rank-ensemble"
    needs_dataset = False

    def __init__(self, proxies: Sequence[str] = DEFAULT_MEMBERS,
                 weights: Sequence[float] | None = None, batch_size: int = 64,
                 data: str = "dataset", resize: int | None = None, seed: int | None = None,
                 input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                 host: Any = None, latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2, aggregation: str = "mean-rank"):
        check_choice("ensemble aggregation", aggregation, AGGREGATIONS)
        self.aggregation = aggregation
        if isinstance(proxies, str) or not proxies:
            raise ConfigError(f"invalid ensemble proxies {proxies!r}; give a list of proxy names")
        if weights is not None and len(weights) != len(proxies):
            raise ConfigError(f"invalid ensemble weights {list(weights)!r}; need one per proxy "
                              f"({len(proxies)})")
        check_range("batch_size", batch_size, 1)
        check_latency_options(latency, latency_batch_size, latency_min_run_time)
        if data not in DATA_SOURCES:
            raise ConfigError(f"invalid proxy data {data!r}; valid: {', '.join(DATA_SOURCES)}")
        if host is None:
            raise ConfigError(f"{self.name} needs the plugin host that registers its proxies "
                              "(host=); a study passes its own")
        self.proxies = list(proxies)
        self.members: list[Proxy] = [host.create("proxies", n) for n in self.proxies]
        self.weights = None if weights is None else [float(w) for w in weights]
        self.batch_size, self.data, self.resize, self.seed = batch_size, data, resize, seed
        self.input_shape, self.num_classes = tuple(input_shape), num_classes
        self.needs_dataset = data == "dataset" and any(p.needs_data for p in self.members)
        self.latency_batch_size = int(latency_batch_size) if latency else None
        self.latency_min_run_time = float(latency_min_run_time)
        self.provides = (*(f"proxy_{n}" for n in self.proxies), "population",
                         *(LATENCY_METRICS if latency else ()))

    measures = ("seconds", "flops", "params")

    def measure(self, arch: Architecture, context: EvaluationContext) -> tuple[dict[str, float], Cost]:
        """Every member proxy's value on ``arch`` (one network, one batch) and the cost."""
        return score_network(self.members, arch, context, batch_size=self.batch_size,
                             data=self.data, resize=self.resize, seed=self.seed,
                             input_shape=self.input_shape, num_classes=self.num_classes,
                             need_dataset=self.needs_dataset,
                             latency_batch_size=self.latency_batch_size,
                             latency_min_run_time=self.latency_min_run_time)

    def population_scores(self, values: dict[str, float], population: list[dict[str, float]],
                          weights: Sequence[float] | None) -> np.ndarray:
        """The combined score of every member of ``population`` + the candidate (last), each
        within that whole population."""
        keys = [f"proxy_{n}" for n in self.proxies]
        rows = [[row[k] for k in keys] for row in population] + [[values[k] for k in keys]]
        return aggregate(np.array(rows), weights, self.aggregation)

    def combine(self, values: dict[str, float], population: list[dict[str, float]],
                weights: Sequence[float] | None) -> float:
        """The candidate's weighted mean percentile rank (or mean log-rank) within
        ``population`` + itself."""
        return float(self.population_scores(values, population, weights)[-1])

    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        values, cost = self.measure(arch, context)
        population = stored_population(context.study, self.proxies)
        value = self.combine(values, population, self.weights)
        return EstimateResult(value=value, metrics={**values, "population": len(population) + 1},
                              cost=cost)


class LearnedEnsembleEstimator(RankEnsembleEstimator):
    """Rank ensemble whose proxy weights are fitted on trials also scored by a teacher.

    Any registered proxy can be a member (a feature of the fit). The metrics
    ``teacher_value`` (on the trials the teacher scores) and ``weight_<proxy>`` (once
    ``min_labelled`` trials have teacher scores) are in the results but not in ``provides``,
    which lists only the metrics every result holds."""

    name = "learned-ensemble"

    def __init__(self, proxies: Sequence[str] = DEFAULT_MEMBERS, teacher: str = "low-fidelity",
                 teacher_options: dict[str, Any] | None = None, teacher_every: int = 5,
                 min_labelled: int = 5, batch_size: int = 64, data: str = "dataset",
                 resize: int | None = None, seed: int | None = None,
                 input_shape: tuple[int, int, int] = (3, 32, 32), num_classes: int = 10,
                 host: Any = None, latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2, aggregation: str = "mean-rank"):
        super().__init__(proxies, None, batch_size, data, resize, seed, input_shape, num_classes,
                         host, latency=latency, latency_batch_size=latency_batch_size,
                         latency_min_run_time=latency_min_run_time, aggregation=aggregation)
        check_range("teacher_every", teacher_every, 1)
        check_range("min_labelled", min_labelled, 2)
        self.teacher = teacher
        self.teacher_options = dict(teacher_options or {})
        self.teacher_every, self.min_labelled = int(teacher_every), int(min_labelled)
        self.teacher_estimator = host.create_estimator(teacher, self.teacher_options)
        self.needs_dataset = self.needs_dataset or self.teacher_estimator.needs_dataset
        # teacher_value and weight_<proxy> are emitted on some trials only, so they are not
        # declared: provides lists what every result holds (an objective must be there)

    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        values, cost = self.measure(arch, context)
        population = stored_population(context.study, self.proxies, extra=(TEACHER_METRIC,))
        labelled = [row for row in population if TEACHER_METRIC in row]
        number = context.trial.number if context.trial is not None else len(population)
        metrics: dict[str, float] = dict(values)
        if len(labelled) < self.min_labelled or number % self.teacher_every == 0:
            taught = self.teacher_estimator.evaluate(arch, context)
            metrics[TEACHER_METRIC] = float(taught.value)
            cost = cost + taught.cost
        weights = None
        if len(labelled) >= self.min_labelled:
            keys = [f"proxy_{n}" for n in self.proxies]
            weights = fit_weights(np.array([[r[k] for k in keys] for r in labelled]),
                                  [r[TEACHER_METRIC] for r in labelled])
            metrics.update({f"weight_{n}": float(w) for n, w in zip(self.proxies, weights)})
        metrics["population"] = len(population) + 1
        return EstimateResult(value=self.combine(values, population, weights), metrics=metrics,
                              cost=cost)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (0 when either side is constant)."""
    r = spearmanr(a, b).statistic
    return 0.0 if not np.isfinite(r) else float(r)
