"""Pareto helpers shared by the strategies, the ``pareto`` pruner and the leaderboard:
non-dominated sorting (Deb et al., "A fast and elitist multiobjective genetic algorithm:
NSGA-II", IEEE TEVC 2002) and NSGA-II's crowding distance."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import numpy as np

VALID_DIRECTIONS = ("maximize", "minimize")


def nondominated_ranks(obj: np.ndarray) -> np.ndarray:
    """Pareto rank of each row of ``obj`` (all objectives maximised), 0 = non-dominated."""
    obj = np.asarray(obj, dtype=float)
    n = len(obj)
    ranks = np.full(n, -1)
    remaining = np.arange(n)
    rank = 0
    while len(remaining):
        sub = obj[remaining]
        ge = (sub[:, None, :] >= sub[None, :, :]).all(-1)
        gt = (sub[:, None, :] > sub[None, :, :]).any(-1)
        dominated = (ge & gt).any(0)
        ranks[remaining[~dominated]] = rank
        remaining = remaining[dominated]
        rank += 1
    return ranks


def crowding(obj: np.ndarray) -> np.ndarray:
    """NSGA-II crowding distance of each row within ``obj``."""
    n, m = obj.shape
    dist = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for k in range(m):
        order = np.argsort(obj[:, k], kind="stable")
        span = obj[order[-1], k] - obj[order[0], k]
        dist[order[0]] = dist[order[-1]] = np.inf
        if span > 0:
            dist[order[1:-1]] += (obj[order[2:], k] - obj[order[:-2], k]) / span
    return dist


def direction_signs(directions: Sequence[str | Enum]) -> np.ndarray:
    """+1 for each ``maximize``, -1 for each ``minimize`` (so that every objective is maximised
    after multiplying); names or optuna's ``StudyDirection`` (``study.directions``), an enum
    read by its member name so that this module does not import optuna."""
    names = [d.name.lower() if isinstance(d, Enum) else d for d in directions]
    for d in names:
        if d not in VALID_DIRECTIONS:
            raise ValueError(f"invalid direction {d!r}; valid: {', '.join(VALID_DIRECTIONS)}")
    return np.array([1.0 if d == "maximize" else -1.0 for d in names])


def pareto_fronts(values: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """The front of each point, counted from 1 (1: dominated by no point; 2: only by points of
    front 1; ...), for objectives to ``maximize``/``minimize``."""
    signs = direction_signs(directions)
    if not len(values):
        return []
    obj = np.asarray(values, dtype=float).reshape(len(values), len(signs)) * signs
    return [int(r) + 1 for r in nondominated_ranks(obj)]
