"""Stand-alone ground truth: a fixed sample of cells, each trained from scratch with several
seeds, to measure how well cheap estimates (weight sharing, proxies, surrogates) rank them.

``benchmarks/ground_truth.py`` produces it (resumable, in worker processes) and packs it into
``benchmarks/frugalnas_lab/references/<name>.json``, kept with the benchmarks:
:func:`load_ground_truth` reads it, :meth:`GroundTruth.kendall_tau` scores a ranking against
the mean over seeds, and :meth:`GroundTruth.tau_ceiling` says how far the reference's own
noise lets any ranking go (the Kendall tau between its seeds); :func:`reference_ceiling` models
that noise to give the tau a perfect estimator could expect against the mean over seeds.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.training import TrainConfig, seed_everything, split_metric, train

#: The packed references, kept beside this module.
REFERENCES = Path(__file__).resolve().parent / "references"


@dataclass
class GroundTruth:
    """Accuracies (%) of ``architectures`` trained stand-alone, one column per seed, on the
    registered dataset ``dataset`` with ``dataset_options``, its images resized to ``resize``
    pixels a side (0: as stored)."""

    name: str
    space: str
    space_options: dict[str, Any]
    dataset: str
    epochs: float
    seeds: list[int]
    architectures: list[str]
    valid: np.ndarray  # (cells, seeds)
    test: np.ndarray   # (cells, seeds)
    command: str = ""
    dataset_options: dict[str, Any] = field(default_factory=dict)
    resize: int = 0

    @property
    def mean_valid(self) -> np.ndarray:
        return self.valid.mean(axis=1)

    @property
    def mean_test(self) -> np.ndarray:
        return self.test.mean(axis=1)

    def kendall_tau(self, scores: Any, target: str = "valid") -> float:
        """Kendall tau between ``scores`` (one per architecture, in this file's order) and the
        mean stand-alone accuracy over seeds."""
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (len(self.architectures),):
            raise ConfigError(f"expected {len(self.architectures)} scores (one per "
                              f"architecture), got shape {scores.shape}")
        reference = self.mean_valid if target == "valid" else self.mean_test
        return float(kendalltau(scores, reference).statistic)

    def kendall_tau_within(self, scores: Any, groups: Any) -> float:
        """Mean Kendall tau of ``scores`` against the mean over seeds, taken within each group
        of architectures that share a label in ``groups`` (one per architecture; groups of
        fewer than 3 are left out): how well ``scores`` rank architectures that one decision,
        e.g. the input side, does not already separate."""
        scores, labels = np.asarray(scores, dtype=float), np.asarray(groups)
        taus = [kendalltau(scores[labels == g], self.mean_valid[labels == g]).statistic
                for g in _groups_of_three(labels)]
        return float(np.nanmean(taus)) if taus else float("nan")

    def tau_ceiling_within(self, groups: Any) -> float:
        """:meth:`tau_ceiling` within each group of ``groups``, averaged over groups and pairs
        of seeds."""
        labels = np.asarray(groups)
        taus = [t for g in _groups_of_three(labels) for t in self._seed_pair_taus(labels == g)]
        return float(np.nanmean(taus)) if taus else float("nan")

    def tau_ceiling(self) -> float:
        """Mean Kendall tau between pairs of seeds: the agreement the reference has with
        itself, which bounds what any estimate can show against one seed."""
        taus = self._seed_pair_taus(slice(None))
        return float(np.mean(taus)) if taus else float("nan")

    def _seed_pair_taus(self, rows: Any) -> list[float]:
        """Kendall tau between every pair of seeds over the architectures ``rows`` selects."""
        valid = self.valid[rows]
        return [kendalltau(valid[:, a], valid[:, b]).statistic
                for a, b in itertools.combinations(range(len(self.seeds)), 2)]

    def expected_taus(self, floor: float = 50.0) -> tuple[float, float]:
        """(perfect, one more training): the Kendall tau a perfect estimator, and one more
        stand-alone training, can expect against the mean over seeds, from
        :func:`reference_ceiling` on the cells whose mean validation accuracy is above
        ``floor`` % (cells at chance level, e.g. with no path from input to output, would
        distort the normal noise model; every estimator ranks them last anyway)."""
        keep = self.mean_valid > floor
        _, _, perfect, single = reference_ceiling(list(self.valid[keep].T))
        return perfect, single

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "space": self.space, "space_options": self.space_options,
                "dataset": self.dataset, "dataset_options": self.dataset_options,
                "resize": self.resize, "epochs": self.epochs, "seeds": self.seeds,
                "command": self.command, "architectures": self.architectures,
                "valid": np.round(self.valid, 3).tolist(), "test": np.round(self.test, 3).tolist()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "GroundTruth":
        if "dataset_options" in data:
            dataset, options, resize = data["dataset"], dict(data["dataset_options"]), \
                int(data.get("resize", 0))
        else:
            dataset, options, resize = _described_dataset(data["dataset"])
        return cls(data["name"], data["space"], dict(data["space_options"]), dataset,
                   float(data["epochs"]), list(data["seeds"]), list(data["architectures"]),
                   np.asarray(data["valid"], dtype=float), np.asarray(data["test"], dtype=float),
                   data.get("command", ""), options, resize)


def _groups_of_three(labels: np.ndarray) -> list[Any]:
    values, counts = np.unique(labels, return_counts=True)
    return [v for v, c in zip(values, counts) if c >= 3]


def _described_dataset(text: str) -> tuple[str, dict[str, Any], int]:
    """(name, options, resize) of a file that describes its data in one line of text, as
    ``cluttered-mnist {"size": 28} (resized to 16x16)`` (before the fields were separate)."""
    resized = re.search(r" \(resized to (\d+)x\d+\)$", text)
    if resized is not None:
        text = text[:resized.start()]
    name, _, options = text.partition(" ")
    return name, (json.loads(options) if options.strip() else {}), \
        int(resized.group(1)) if resized else 0


def shipped_names() -> list[str]:
    folder = REFERENCES
    if not folder.is_dir():
        return []
    return sorted(p.name[:-len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_ground_truth(name: str | Path) -> GroundTruth:
    """A packed reference by name, or a JSON file written by
    ``benchmarks/ground_truth.py``."""
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        return GroundTruth.from_json(json.loads(path.read_text()))
    folder = REFERENCES
    item = folder / f"{name}.json"
    if not item.is_file():
        raise ConfigError(f"unknown ground truth {str(name)!r}; shipped: "
                          f"{', '.join(shipped_names()) or '(none yet)'}; or give a .json path")
    return GroundTruth.from_json(json.loads(item.read_text()))


def train_stand_alone(space: SearchSpace, arch: Architecture, dataset: Dataset, backend: Backend,
                      cfg: TrainConfig, seed: int) -> dict[str, float]:
    """Train ``arch`` from scratch with ``seed``; validation and test accuracy (%), seconds."""
    seed_everything(seed)
    start = time.perf_counter()
    model = backend.prepare(space.build(arch, dataset.num_classes, dataset.input_shape))
    train(model, dataset, backend, cfg, seed=seed)
    out = {"valid": split_metric(model, backend, dataset)}
    if dataset.has_test:
        out["test"] = split_metric(model, backend, dataset, "test")
    out["seconds"] = time.perf_counter() - start
    return out


def reference_ceiling(per_seed: list[list[float]], draws: int = 2000,
                      seed: int = 0) -> tuple[float, float, float, float]:
    """How high any estimator's tau against the mean of ``k`` noisy trainings can go. Takes
    the seed-to-seed noise (within-candidate sd) and the candidates' true spread (the variance
    of their means less the noise left in a k-seed mean), and simulates normal candidates:
    the expected tau of the true values (a perfect estimator) and of one more noisy training
    against such a reference. Returns (noise sd, true sd, perfect tau, one-training tau)."""
    a = np.asarray(per_seed, dtype=float)
    k, n = a.shape
    noise = float(np.sqrt(a.var(axis=0, ddof=1).mean()))
    spread = float(np.sqrt(max(a.mean(axis=0).var(ddof=1) - noise ** 2 / k, 0.0)))
    if spread == 0.0:  # no true differences left after the noise: nothing to rank
        return noise, spread, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    perfect, single = [], []
    for _ in range(draws):
        true = rng.normal(0.0, spread, n)
        ref = true + rng.normal(0.0, noise / np.sqrt(k), n)
        perfect.append(kendalltau(true, ref).statistic)
        single.append(kendalltau(true + rng.normal(0.0, noise, n), ref).statistic)
    return noise, spread, float(np.nanmean(perfect)), float(np.nanmean(single))
