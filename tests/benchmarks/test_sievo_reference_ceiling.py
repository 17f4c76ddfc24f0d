"""The tau ceiling that benchmarks/sievo.py prints for a noisy stand-alone reference."""

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sievo.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("sievo_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_seed(spread: float, noise: float, seeds: int = 4, n: int = 30) -> list[list[float]]:
    rng = np.random.default_rng(1)
    true = 95 + rng.normal(0, spread, n)
    return [list(true + rng.normal(0, noise, n)) for _ in range(seeds)]


def test_noiseless_reference_lets_a_perfect_estimator_reach_one():
    noise, spread, perfect, single = _benchmark().reference_ceiling(_per_seed(1.5, 0.0), draws=200)
    assert noise == 0 and spread > 1.0
    assert perfect == 1.0 and single == 1.0


def test_noise_lowers_the_ceiling_and_one_training_sits_below_it():
    bench = _benchmark()
    _, _, clean, _ = bench.reference_ceiling(_per_seed(1.5, 0.3), draws=300)
    noise, spread, perfect, single = bench.reference_ceiling(_per_seed(1.5, 1.5), draws=300)
    assert 1.0 < noise < 2.0 and 0.8 < spread < 2.2
    assert single < perfect < clean < 1.0
    assert 0.5 < perfect < 0.85 and 0.25 < single < 0.6


def test_reference_of_pure_noise_shows_little_spread_and_a_low_ceiling():
    bench = _benchmark()
    noise, spread, perfect, _ = bench.reference_ceiling(_per_seed(0.0, 1.0), draws=200)
    _, _, signal, _ = bench.reference_ceiling(_per_seed(1.5, 1.0), draws=200)
    assert spread < noise / 2
    assert np.isnan(perfect) or perfect < signal - 0.2


def test_identical_seeds_of_identical_candidates_leave_nothing_to_rank():
    noise, spread, perfect, single = _benchmark().reference_ceiling([[90.0] * 5] * 3, draws=10)
    assert noise == 0 and spread == 0 and np.isnan(perfect) and np.isnan(single)
