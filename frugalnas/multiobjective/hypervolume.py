"""Hypervolume of a set of objective vectors: the measure of the objective space that the set
dominates, bounded by a reference point (Zitzler & Thiele, 1998). It grows when a front moves
towards the optimum or spreads out, which makes it the usual single number for comparing
multi-objective searches.

Directions are optuna's (``"minimize"`` / ``"maximize"``); the reference point is given in the
objectives' own units and must be worse than every point that is to count (a point that does not
dominate it adds nothing). Exact computation: a sweep in two dimensions, slicing along the first
objective above that (fine for the few hundred points a study holds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
