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
from itertools import combinations
from typing import Any

import numpy as np
from scipy.optimize import nnls
from scipy.stats import kendalltau, rankdata, spearmanr

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.latency import LATENCY_METRICS, LatencyProbe
from frugalnas.proxies.base import Proxy, ProxyBatch, check_families, score_network

DEFAULT_MEMBERS = ("synflow", "naswot", "jacob_cov", "params")
#: The members :func:`select_members` picks (log-rank, CIFAR-10 test accuracy) on the
#: development half of the 1,000-cell NB201 measurement (docs/benchmarks.md):
#: meco and swap rank well alone; synflow and the NTK condition number, weaker alone, add
#: what the first two miss. On the other 500 cells: Spearman 0.947, Kendall tau 0.807
#: (CIFAR-10 test accuracy; 0.934 / 0.781 on CIFAR-100, 0.903 / 0.753 on ImageNet16-120).
SELECTED_MEMBERS = ("meco", "swap", "synflow", "ntk_cond")
#: Named member sets a ``rank-ensemble`` / ``learned-ensemble`` accepts as ``proxies=``:
#: the project default, the selected set above, and AZ-NAS's four signals (Lee & Ham, CVPR
#: 2024; FLOPs as its complexity term).
MEMBER_PRESETS: dict[str, tuple[str, ...]] = {
    "default": DEFAULT_MEMBERS,
    "selected": SELECTED_MEMBERS,
    "az-nas": ("az_expressivity", "az_progressivity", "az_trainability", "flops"),
}
TEACHER_METRIC = "teacher_value"
#: How member ranks combine: the weighted mean of percentile ranks; AZ-NAS's non-linear
#: aggregation, the weighted mean of log(rank / n) (Lee & Ham, CVPR 2024), which rewards
#: networks that rank high on every member and punishes a low rank on any one; or the mean
#: percentile rank weighted by each member's agreement with the others (:func:`spectral_weights`).
AGGREGATIONS = ("mean-rank", "log-rank", "spectral")
#: below this many candidates ``spectral_weights`` returns equal weights (no correlations)
SPECTRAL_MIN_POPULATION = 3
#: how :func:`fit_weights` regularises: not at all (plain non-negative least squares), or a
#: ridge penalty chosen by leave-one-out error among ``RIDGE_PENALTIES`` (0 included)
PENALTIES = ("none", "loo")
RIDGE_PENALTIES = (0.0, *np.logspace(-3, 1, 9).tolist())


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


def spectral_weights(matrix: np.ndarray) -> np.ndarray:
    """Label-free member weights (summing to 1) from how much each member agrees with the rest.

    After the spectral meta-learner of Parisi, Strino, Nadler and Kluger ("Ranking and
    combining multiple predictors without labeled data", PNAS 2014): if the members are
    independent noisy views of one hidden ranking, the off-diagonal part of the covariance of
    their rank vectors is rank one, and its leading eigenvector holds each member's
    agreement with the hidden ranking. Here that eigenvector is taken from the Spearman
    correlation matrix of the columns of ``matrix`` (rows: candidates, columns: members),
    oriented to a positive sum; members against the consensus get weight 0 (every member is
    meant to score higher for better networks). Equal weights with fewer than
    ``SPECTRAL_MIN_POPULATION`` candidates or when no member agrees with another. Members
    that are near copies of each other (params and flops) break the independence assumption
    and together weigh more than one view."""
    m = np.asarray(matrix, dtype=float)
    k = m.shape[1]
    equal = np.full(k, 1.0 / k)
    if len(m) < SPECTRAL_MIN_POPULATION or k < 2:
        return equal
    ranks = np.column_stack([rankdata(m[:, j]) for j in range(k)])
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.nan_to_num(np.corrcoef(ranks, rowvar=False))  # a constant member: 0
    np.fill_diagonal(corr, 1.0)
    vector = np.linalg.eigh(corr)[1][:, -1]
    w = np.clip(vector * np.sign(vector.sum()), 0.0, None)
    return w / w.sum() if w.sum() > 0 else equal


def aggregate(matrix: np.ndarray, weights: Sequence[float] | None = None,
              aggregation: str = "mean-rank") -> np.ndarray:
    """Each row's combined score under ``aggregation`` (``AGGREGATIONS``); ``"spectral"``
    computes its own weights from ``matrix`` and takes none."""
    check_choice("ensemble aggregation", aggregation, AGGREGATIONS)
    if aggregation == "log-rank":
        return log_rank_average(matrix, weights)
    if aggregation == "spectral":
        if weights is not None:
            raise ConfigError("the 'spectral' aggregation computes its own weights; give "
                              "weights=None or aggregation 'mean-rank' or 'log-rank'")
        return rank_average(matrix, spectral_weights(matrix))
    return rank_average(matrix, weights)


def _ridge_nnls(ranks: np.ndarray, target: np.ndarray, penalty: float) -> np.ndarray:
    """Non-negative least squares of centred ``target`` on centred ``ranks`` plus
    ``penalty`` * |w|^2."""
    x, y, k = ranks - ranks.mean(0), target - target.mean(), ranks.shape[1]
    w, _ = nnls(np.vstack([x, np.sqrt(penalty) * np.eye(k)]), np.concatenate([y, np.zeros(k)]))
    return w


def _loo_penalty(ranks: np.ndarray, target: np.ndarray) -> float:
    """The ``RIDGE_PENALTIES`` entry with the least leave-one-out squared error (the
    smallest on ties)."""
    errors = []
    for penalty in RIDGE_PENALTIES:
        error = 0.0
        for i in range(len(target)):
            keep = np.arange(len(target)) != i
            w = _ridge_nnls(ranks[keep], target[keep], penalty)
            fitted = target[keep].mean() + (ranks[i] - ranks[keep].mean(0)) @ w
            error += float((target[i] - fitted) ** 2)
        errors.append(error)
    return RIDGE_PENALTIES[int(np.argmin(errors))]


def fit_weights(matrix: np.ndarray, target: Sequence[float], penalty: str = "none") -> np.ndarray:
    """Non-negative weights (summing to 1) for :func:`rank_average`, fitted by non-negative
    least squares of the target's ranks on the proxies' ranks; equal weights when the fit
    finds no proxy that helps. ``penalty="loo"`` adds a ridge penalty on the weights, its
    strength chosen by leave-one-out error over the labelled rows (``RIDGE_PENALTIES``, 0
    among them), which shrinks the weights of proxies the few labels cannot tell apart."""
    check_choice("fit_weights penalty", penalty, PENALTIES)
    m = np.asarray(matrix, dtype=float)
    ranks = np.column_stack([percentile_ranks(m[:, j]) for j in range(m.shape[1])])
    t = percentile_ranks(target)
    strength = _loo_penalty(ranks, t) if penalty == "loo" and len(t) >= 3 else 0.0
    w = _ridge_nnls(ranks, t, strength)
    return w / w.sum() if w.sum() > 0 else np.full(m.shape[1], 1.0 / m.shape[1])


def select_members(matrix: np.ndarray, target: Sequence[float],
                   aggregation: str = "log-rank", lookahead: int = 2,
                   min_gain: float = 1e-3) -> list[int]:
    """Columns of ``matrix`` (rows: labelled networks, columns: candidate members) whose
    equal-weight ensemble under ``aggregation`` best ranks ``target``, by forward selection
    on Kendall tau.

    Each step adds the one member, or with ``lookahead=2`` the pair, that raises tau most,
    and stops when no option gains ``min_gain``. The pairs matter: a member that only
    corrects another's mistakes (the NTK condition number, weak alone) can lower tau when
    added by itself and raise it with a partner. Returns the chosen column indices in the
    order chosen. With few labelled rows the choice overfits; the project ships one set
    chosen on 500 NB201 cells (``SELECTED_MEMBERS``)."""
    check_choice("ensemble aggregation", aggregation, AGGREGATIONS)
    check_range("lookahead", lookahead, 1, 2)
    m = np.asarray(matrix, dtype=float)
    t = np.asarray(target, dtype=float)
    if m.ndim != 2 or len(m) != len(t) or len(t) < 3:
        raise ConfigError(f"select_members needs a (networks x members) matrix and one target "
                          f"per network, at least 3; got {m.shape} and {len(t)}")

    def score(columns: list[int]) -> float:
        tau = kendalltau(aggregate(m[:, columns], None, aggregation), t).statistic
        return float(tau) if np.isfinite(tau) else -1.0

    chosen: list[int] = []
    best = -np.inf
    while len(chosen) < m.shape[1]:
        rest = [j for j in range(m.shape[1]) if j not in chosen]
        options = [(j,) for j in rest]
        if lookahead == 2:
            options += list(combinations(rest, 2))
        gain, option = max(((score(chosen + list(o)), o) for o in options),
                           key=lambda pair: pair[0])
        if gain <= best + min_gain:
            break
        best = gain
        chosen += list(option)
    return chosen


def member_names(proxies: Sequence[str] | str) -> list[str]:
    """``proxies`` as a list of proxy names: a preset name of ``MEMBER_PRESETS`` or a list."""
    if isinstance(proxies, str) and proxies in MEMBER_PRESETS:
        return list(MEMBER_PRESETS[proxies])
    if isinstance(proxies, str) or not proxies:
        raise ConfigError(f"invalid ensemble proxies {proxies!r}; give a list of proxy names "
                          f"or a preset: {', '.join(MEMBER_PRESETS)}")
    return list(proxies)


def proxy_list(proxies: Sequence[str] | str) -> list[str]:
    """A proxy's name, a list of names or a preset name of ``MEMBER_PRESETS``, as a list of
    names (a single name is a list of one, where :func:`member_names` wants a list)."""
    if isinstance(proxies, str) and proxies not in MEMBER_PRESETS:
        return [proxies]
    return member_names(proxies)


def stored_population(context: TrialContext, names: Sequence[str],
                      extra: Sequence[str] = ()) -> list[dict[str, float]]:
    """Per-trial metrics of the study's completed trials (``context.history()``) that hold
    ``proxy_<name>`` for every name (from the estimator's stored metrics or the pre-screen's
    record), plus ``extra`` metrics when present; empty outside a study."""
    keys = [f"proxy_{n}" for n in names]
    out = []
    for t in context.history():
        found = {**t.prescreen, **t.metrics}
        if all(k in found for k in keys):
            out.append({k: float(found[k]) for k in (*keys, *extra) if k in found})
    return out


class RankEnsembleEstimator(Estimator):
    """Mean percentile rank of several zero-cost proxies among the trials seen so far.

    ``proxies`` is a list of registered proxy names or a preset of ``MEMBER_PRESETS``
    (``"default"``, ``"selected"``, ``"az-nas"``).

    ``aggregation`` is one of ``AGGREGATIONS``: ``"mean-rank"`` (default), ``"log-rank"``
    (AZ-NAS, mean of log(rank / n)) or ``"spectral"``: the mean rank weighted by
    :func:`spectral_weights` of the members over the population (the stored trials and the
    candidate), label-free, re-estimated at every trial; equal weights below
    ``SPECTRAL_MIN_POPULATION`` candidates. ``weights`` cannot be combined with
    ``"spectral"``.

    ``latency=True`` also measures the network's inference latency on the backend's device
    (batches of ``latency_batch_size``) and adds ``latency_ms`` and ``latency_ms_iqr``."""

    name = "rank-ensemble"
    needs_dataset = False

    def __init__(self, proxies: Sequence[str] | str = DEFAULT_MEMBERS,
                 weights: Sequence[float] | None = None, batch_size: int = 64,
                 data: str = "dataset", resize: int | None = None, seed: int | None = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 host: Any = None, latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2, aggregation: str = "mean-rank"):
        check_choice("ensemble aggregation", aggregation, AGGREGATIONS)
        if aggregation == "spectral" and weights is not None:
            raise ConfigError(f"invalid ensemble weights {list(weights)!r} with aggregation "
                              "'spectral', which computes its own; drop weights or use "
                              "aggregation 'mean-rank' or 'log-rank'")
        self.aggregation = aggregation
        proxies = member_names(proxies)
        if weights is not None and len(weights) != len(proxies):
            raise ConfigError(f"invalid ensemble weights {list(weights)!r}; need one per proxy "
                              f"({len(proxies)})")
        self.batch = ProxyBatch(batch_size, data, resize, seed, input_shape, num_classes)
        self.latency = LatencyProbe.of(latency, latency_batch_size, latency_min_run_time)
        if host is None:
            raise ConfigError(f"{self.name} needs the plugin host that registers its proxies "
                              "(host=); a study passes its own")
        self.proxies = list(proxies)
        self.members: list[Proxy] = [host.create("proxies", n) for n in self.proxies]
        self.weights = None if weights is None else [float(w) for w in weights]
        self.needs_dataset = self.batch.uses_dataset(self.members)
        self.provides = (*(f"proxy_{n}" for n in self.proxies), "population",
                         *(LATENCY_METRICS if latency else ()))

    measures = ("seconds", "flops", "params")

    def check_space(self, space: SearchSpace) -> None:
        """A member that reads a structure the space's networks lack is refused before the
        first trial."""
        check_families(self.members, space)

    def measure(self, arch: Architecture, context: TrialContext) -> tuple[dict[str, float], Cost]:
        """Every member proxy's value on ``arch`` (one network, one batch) and the cost."""
        return score_network(self.members, arch, context, self.batch,
                             need_dataset=self.needs_dataset, latency=self.latency)

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

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        values, cost = self.measure(arch, context)
        population = stored_population(context, self.proxies)
        value = self.combine(values, population, self.weights)
        return EstimateResult(value=value, metrics={**values, "population": len(population) + 1},
                              cost=cost)


class LearnedEnsembleEstimator(RankEnsembleEstimator):
    """Rank ensemble whose proxy weights are fitted on trials also scored by a teacher.

    Any registered proxy can be a member (a feature of the fit). The metrics
    ``teacher_value`` (on the trials the teacher scores) and ``weight_<proxy>`` (once
    ``min_labelled`` trials have teacher scores) are in the results but not in ``provides``,
    which lists only the metrics every result holds.

    ``penalty`` is :func:`fit_weights`'s (``"none"``: plain non-negative least squares,
    ``"loo"``: ridge chosen by leave-one-out). The fitted weights combine under
    ``aggregation`` ``"mean-rank"`` or ``"log-rank"``; ``"spectral"``, whose weights come from
    the population instead, is refused."""

    name = "learned-ensemble"

    def __init__(self, proxies: Sequence[str] | str = DEFAULT_MEMBERS, teacher: str = "low-fidelity",
                 teacher_options: dict[str, Any] | None = None, teacher_every: int = 5,
                 min_labelled: int = 5, batch_size: int = 64, data: str = "dataset",
                 resize: int | None = None, seed: int | None = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 host: Any = None, latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2, aggregation: str = "mean-rank",
                 penalty: str = "none"):
        if aggregation == "spectral":
            raise ConfigError("invalid learned-ensemble aggregation 'spectral' (its weights "
                              "would replace the learned ones); valid: 'mean-rank', 'log-rank'")
        check_choice("learned-ensemble penalty", penalty, PENALTIES)
        self.penalty = penalty
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

    def check_space(self, space: SearchSpace) -> None:
        """The teacher scores architectures of the space too: it must accept the space."""
        super().check_space(space)
        self.teacher_estimator.check_space(space)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        values, cost = self.measure(arch, context)
        population = stored_population(context, self.proxies, extra=(TEACHER_METRIC,))
        labelled = [row for row in population if TEACHER_METRIC in row]
        number = context.trial_number if context.trial_number is not None else len(population)
        metrics: dict[str, float] = dict(values)
        if len(labelled) < self.min_labelled or number % self.teacher_every == 0:
            taught = self.teacher_estimator.evaluate(arch, context)
            metrics[TEACHER_METRIC] = float(taught.value)
            cost = cost + taught.cost
        weights = None
        if len(labelled) >= self.min_labelled:
            keys = [f"proxy_{n}" for n in self.proxies]
            weights = fit_weights(np.array([[r[k] for k in keys] for r in labelled]),
                                  [r[TEACHER_METRIC] for r in labelled], self.penalty)
            metrics.update({f"weight_{n}": float(w) for n, w in zip(self.proxies, weights)})
        metrics["population"] = len(population) + 1
        return EstimateResult(value=self.combine(values, population, weights), metrics=metrics,
                              cost=cost)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (0 when either side is constant)."""
    r = spearmanr(a, b).statistic
    return 0.0 if not np.isfinite(r) else float(r)
