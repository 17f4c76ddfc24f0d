"""Hypervolume against hand-computed areas and a Monte-Carlo estimate in three dimensions."""

import random

import pytest

from frugalnas.multiobjective.hypervolume import hypervolume


def test_two_points_by_hand():
    # Union of [1,4]x[3,4] (area 3) and [2,4]x[1,4] (area 6) overlapping in [2,4]x[3,4] (area 2).
    assert hypervolume([(1, 3), (2, 1)], (4, 4), ["minimize", "minimize"]) == pytest.approx(7.0)


def test_maximised_objective_and_points_beyond_the_reference():
    # accuracy 90 (maximise, reference 0) with latency 5 ms (minimise, reference 10): 90 x 5.
    assert hypervolume([(90, 5), (95, 12)], (0, 10), ["maximize", "minimize"]) == pytest.approx(450)


def test_dominated_and_repeated_points_add_nothing():
    base = hypervolume([(1, 1)], (3, 3), ["minimize"] * 2)
    assert hypervolume([(1, 1), (2, 2), (1, 1)], (3, 3), ["minimize"] * 2) == base == 4


def test_three_objectives_match_monte_carlo():
    rng = random.Random(3)
    points = [tuple(rng.random() for _ in range(3)) for _ in range(15)]
    exact = hypervolume(points, (1, 1, 1), ["minimize"] * 3)
    samples = [tuple(rng.random() for _ in range(3)) for _ in range(40000)]
    inside = sum(any(all(p[i] <= x[i] for i in range(3)) for p in points) for x in samples)
    assert exact == pytest.approx(inside / len(samples), abs=0.01)


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="'up'"):
        hypervolume([(1, 1)], (2, 2), ["minimize", "up"])
    with pytest.raises(ValueError, match=r"reference point \[2\]"):
        hypervolume([(1, 1)], (2,), ["minimize", "minimize"])
