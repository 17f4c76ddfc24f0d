"""Hypervolume of a set of objective vectors: the measure of the objective space that the set
dominates, bounded by a reference point (Zitzler & Thiele, 1998). It grows when a front moves
towards the optimum or spreads out, which makes it the usual single number for comparing
multi-objective searches.

Directions are optuna's (``"minimize"`` / ``"maximize"``); the reference point is given in the
objectives' own units and must be worse than every point that is to count (a point that does not
dominate it adds nothing). Exact computation: a sweep in two dimensions, slicing along the first
objective above that (fine for the few hundred points a study holds).

The strategies' helpers work on maximised objective rows: the non-dominated rows, the
hypervolume a point would add to a front (exact and vectorised for two objectives), each front
point's exclusive contribution, and the check of a user's reference point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from frugalnas.ports.errors import ConfigError
from frugalnas.multiobjective.pareto import nondominated_ranks

VALID_DIRECTIONS = ("minimize", "maximize")


def to_minimization(points: Sequence[Sequence[float]], reference: Sequence[float],
                    directions: Sequence[str]) -> tuple[list[tuple[float, ...]], tuple[float, ...]]:
    """Flip maximised objectives so that every objective is minimised; keep only the points that
    strictly dominate the reference point."""
    for d in directions:
        if d not in VALID_DIRECTIONS:
            raise ValueError(f"direction {d!r} is not one of {', '.join(VALID_DIRECTIONS)}")
    if len(reference) != len(directions):
        raise ValueError(f"reference point {list(reference)} has {len(reference)} value(s), "
                         f"the study has {len(directions)} objective(s)")
    signs = [1.0 if d == "minimize" else -1.0 for d in directions]
    ref = tuple(s * float(r) for s, r in zip(signs, reference))
    flipped = []
    for p in points:
        if len(p) != len(signs):
            raise ValueError(f"point {list(p)} has {len(p)} value(s), expected {len(signs)}")
        q = tuple(s * float(v) for s, v in zip(signs, p))
        if all(a < b for a, b in zip(q, ref)):
            flipped.append(q)
    return flipped, ref


def _nondominated(points: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    unique = sorted(set(points))
    if not unique:
        return []
    ranks = nondominated_ranks(-np.asarray(unique))  # minimised here, maximised there
    return [p for p, r in zip(unique, ranks) if r == 0]


def _volume(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if not points:
        return 0.0
    if len(ref) == 1:
        return ref[0] - min(p[0] for p in points)
    if len(ref) == 2:
        total, best_y = 0.0, ref[1]
        for x, y in sorted(points):
            if y < best_y:
                total += (ref[0] - x) * (best_y - y)
                best_y = y
        return total
    # Slice along the first objective: between consecutive x values, the dominated region is
    # the (d-1)-dimensional volume of the points at or left of the slice.
    ordered = sorted(points)
    total = 0.0
    for i, p in enumerate(ordered):
        upper = ordered[i + 1][0] if i + 1 < len(ordered) else ref[0]
        width = upper - p[0]
        if width > 0:
            total += width * _volume(_nondominated([q[1:] for q in ordered[:i + 1]]), ref[1:])
    return total


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float],
                directions: Sequence[str]) -> float:
    """Hypervolume dominated by ``points`` with respect to ``reference``.

    >>> hypervolume([(1.0, 3.0), (2.0, 1.0)], (4.0, 4.0), ["minimize", "minimize"])
    7.0
    >>> hypervolume([(90.0, 5.0)], (0.0, 10.0), ["maximize", "minimize"])
    450.0
    """
    flipped, ref = to_minimization(points, reference, directions)
    return _volume(_nondominated(flipped), ref)


def nondominated_rows(obj: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated rows of ``obj`` (every objective maximised)."""
    if not len(obj):
        return np.zeros(0, int)
    ge = (obj[:, None, :] >= obj[None, :, :]).all(-1)
    gt = (obj[:, None, :] > obj[None, :, :]).any(-1)
    return np.flatnonzero(~(ge & gt).any(0))


def _staircase(front: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For two maximised objectives: the intervals of the first objective, read downwards from
    the front's best value to the reference, and the height of the front's attainment surface
    over each (the second objective a new point must beat there)."""
    order = np.argsort(-front[:, 0], kind="stable")
    xs, ys = front[order, 0], front[order, 1]
    best_y = np.maximum.accumulate(ys)
    upper = np.concatenate([[np.inf], xs])
    lower = np.concatenate([xs, [ref[0]]])
    height = np.concatenate([[ref[1]], best_y])
    return lower, upper, height


def hypervolume_improvement(points: np.ndarray, front: np.ndarray,
                            ref: np.ndarray) -> np.ndarray:
    """How much each row of ``points`` would add to the hypervolume of ``front`` (all
    objectives maximised, reference ``ref``); exact, vectorised for two objectives."""
    points = np.asarray(points, dtype=float)
    if not len(front):
        return np.prod(np.maximum(points - ref, 0.0), axis=1)
    if points.shape[1] == 2:
        lower, upper, height = _staircase(front, ref)
        width = np.maximum(np.minimum(points[:, :1], upper) - np.maximum(lower, ref[0]), 0.0)
        gain = np.maximum(points[:, 1:] - np.maximum(height, ref[1]), 0.0)
        return (width * gain).sum(1)
    directions = ["maximize"] * front.shape[1]
    base = hypervolume(front.tolist(), ref.tolist(), directions)
    return np.array([hypervolume(front.tolist() + [p.tolist()], ref.tolist(), directions) - base
                     for p in points])


def contributions(front: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Each front point's exclusive hypervolume contribution (all objectives maximised)."""
    out = np.zeros(len(front))
    for i in range(len(front)):
        rest = np.delete(front, i, axis=0)
        out[i] = hypervolume_improvement(front[i:i + 1], rest, ref)[0]
    return out


def check_reference_point(reference_point: Any,
                          n_objectives: int | None = None) -> list[float] | None:
    """``reference_point`` as a list of floats (``None`` stays ``None``); a ConfigError when it
    is not a list of finite numbers, or not one per objective when ``n_objectives`` is given."""
    if reference_point is None:
        return None
    try:
        ref = [float(v) for v in reference_point]
    except (TypeError, ValueError):
        ref = []
    if not ref or not np.all(np.isfinite(ref)):
        raise ConfigError(f"invalid reference_point {reference_point!r}; valid: a list of "
                          "finite numbers, one per objective")
    if n_objectives is not None and len(ref) != n_objectives:
        raise ConfigError(f"invalid reference_point {ref}: {len(ref)} value(s), the study has "
                          f"{n_objectives} objective(s); valid: one number per objective")
    return ref
