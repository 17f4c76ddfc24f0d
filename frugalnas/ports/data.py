"""The dataset contract: a source of batches with a seeded train / validation / test split.

:class:`DataSource` is what every consumer reads (estimators, proxies, supernets, export):
batches of a split, a fixed batch, the first examples, evaluation batches, the number of
examples, and the derived sources (a training subset, a lower resolution, training +
validation). :class:`Dataset` holds small data as in-memory tensors; the datasets feature's
:class:`~frugalnas.datasets.streaming.StreamingSource` reads examples from disk on demand.

Search selects on the validation split; the test split is held out for the final report of
an exported model (``frugalnas export``) and no estimator reads it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from frugalnas.ports.errors import ConfigError
from frugalnas.ports.task import IMAGE_CLASSIFICATION, Task

SPLITS = ("train", "valid", "test")


def split_name(which: str) -> str:
    if which == "validation":
        return "valid"
    if which not in SPLITS:
        raise ValueError(f"unknown split {which!r}; valid: 'train', 'valid', 'test'")
    return which


def no_test_split(name: str) -> ConfigError:
    return ConfigError(f"dataset {name!r} has no test split; create it with "
                       "test_fraction > 0 (-o dataset.test_fraction=0.2)")


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The order of an epoch's examples: depends only on ``(seed, epoch)``."""
    if shuffle:
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return torch.arange(n)


def fixed_indices(n: int, size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (size,), generator=g) if size > n else torch.randperm(n, generator=g)[:size]


def subset_indices(n: int, fraction: float, seed: int) -> torch.Tensor:
    if not 0 < fraction <= 1:
        raise ConfigError(f"invalid subset fraction {fraction!r}; valid range: (0, 1]")
    keep = max(1, int(round(n * fraction)))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:keep]


class DataSource(ABC):
    """A source of batches: what an estimator, a proxy, a supernet or export reads.

    ``name`` and ``num_classes`` are attributes; ``mean``/``std`` are the per-channel
    statistics (raw pixel units) the images are standardised with, ``(raw - mean) / std``,
    where known (a deployed model needs the same preprocessing). ``which`` is ``"train"``,
    ``"valid"`` (or ``"validation"``) or ``"test"``. ``task`` holds the loss and the
    validation metric; for a language-modelling source ``num_classes`` is the vocabulary
    size, ``input_shape`` is ``(context,)`` and a batch is ``(tokens, next tokens)``, both
    ``(N, context)`` int64."""

    name: str
    num_classes: int

    @property
    def task(self) -> Task:
        """What the batches are for: the loss and the validation metric (image classes
        unless a source says otherwise)."""
        return IMAGE_CLASSIFICATION

    @property
    def mean(self) -> tuple[float, ...] | None:
        return None

    @property
    def std(self) -> tuple[float, ...] | None:
        return None

    @property
    @abstractmethod
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example: ``(C, H, W)`` for images, ``(context,)`` for text."""

    @property
    @abstractmethod
    def has_test(self) -> bool:
        """Whether the source holds a (non-empty) test split."""

    @abstractmethod
    def num_examples(self, which: str) -> int:
        """The number of examples in a split (0 for a missing test split)."""

    @abstractmethod
    def labels(self, which: str) -> torch.Tensor:
        """The labels of a split, in the split's order (no image is read)."""

    @abstractmethod
    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches ``(float images, int64 labels)`` of a split; the order depends only on
        ``(seed, epoch)``. A streamed source augments the training split only."""

    @abstractmethod
    def fixed_batch(self, size: int, seed: int = 0,
                    which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A deterministic batch of ``size`` examples (repeated if the split is smaller),
        never augmented."""

    @abstractmethod
    def head(self, which: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` examples of a split (all if fewer), never augmented."""

    @abstractmethod
    def eval_batches(self, which: str,
                     limit: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The first ``limit`` (default: all) examples of a split in order, in batches for
        evaluation (an in-memory source yields the whole split as one batch)."""

    @abstractmethod
    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A whole split as tensors: for small data; a streamed source reads every image."""

    @abstractmethod
    def subset(self, fraction: float = 1.0, seed: int = 0) -> "DataSource":
        """Keep a seeded ``fraction`` of the training examples (validation and test whole)."""

    @abstractmethod
    def train_and_valid(self) -> "DataSource":
        """The source whose training split is training + validation (validation and test
        unchanged): what a final model is trained on."""

    @abstractmethod
    def resized(self, size: int) -> "DataSource":
        """Images at ``size x size`` pixels."""


@dataclass(frozen=True)
class Dataset(DataSource):
    """Images as float tensors ``(N, C, H, W)`` and integer labels, split in three.

    ``test_x``/``test_y`` are ``None`` for a dataset without a test split (a factory called
    with ``test_fraction=0``, a CIFAR folder without its test batch). ``mean``/``std`` are
    the per-channel statistics (of the raw training images) the images were standardised
    with, ``(raw - mean) / std``, when the dataset knows them; a deployed model needs the same
    preprocessing."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    valid_x: torch.Tensor
    valid_y: torch.Tensor
    num_classes: int
    test_x: torch.Tensor | None = None
    test_y: torch.Tensor | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    @property
    def has_test(self) -> bool:
        """Whether the dataset holds a (non-empty) test split."""
        return self.test_x is not None and self.test_y is not None and len(self.test_x) > 0

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        which = split_name(which)
        if which == "train":
            return self.train_x, self.train_y
        if which == "valid":
            return self.valid_x, self.valid_y
        if not self.has_test:
            raise no_test_split(self.name)
        return self.test_x, self.test_y  # type: ignore[return-value]

    def num_examples(self, which: str) -> int:
        if split_name(which) == "test" and not self.has_test:
            return 0
        return len(self.split(which)[1])

    def labels(self, which: str) -> torch.Tensor:
        return self.split(which)[1]

    def head(self, which: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.split(which)
        return x[:n], y[:n]

    def eval_batches(self, which: str,
                     limit: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield self.split(which) if limit is None else self.head(which, limit)

    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches of a split; the order depends only on ``(seed, epoch)``."""
        x, y = self.split(which)
        n = len(x)
        order = epoch_order(n, shuffle, seed, epoch)
        stop = n - (n % batch_size) if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]

    def fixed_batch(self, size: int, seed: int = 0, which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A deterministic batch of ``size`` examples (repeated if the split is smaller)."""
        x, y = self.split(which)
        idx = fixed_indices(len(x), size, seed)
        return x[idx], y[idx]

    def subset(self, fraction: float = 1.0, seed: int = 0) -> "Dataset":
        """Keep a seeded ``fraction`` of the training examples (validation and test are kept
        whole)."""
        idx = subset_indices(len(self.train_x), fraction, seed)
        return replace(self, train_x=self.train_x[idx], train_y=self.train_y[idx])

    def train_and_valid(self) -> "Dataset":
        """The dataset whose training split is training + validation (the validation split
        and the test split are unchanged): what a final model is trained on once the search
        has selected its architecture."""
        return replace(self, train_x=torch.cat([self.train_x, self.valid_x]),
                       train_y=torch.cat([self.train_y, self.valid_y]))

    def resized(self, size: int) -> "Dataset":
        """Images bilinearly resized to ``size x size``."""
        if self.input_shape[1:] == (size, size):
            return self
        def rs(t: torch.Tensor) -> torch.Tensor:
            return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
        return replace(self, train_x=rs(self.train_x), valid_x=rs(self.valid_x),
                       test_x=None if self.test_x is None else rs(self.test_x))


def check_fractions(valid_fraction: object, test_fraction: object = 0.0, what: str = "") -> None:
    """ConfigError unless ``0 < valid_fraction < 1``, ``0 <= test_fraction < 1`` and the two
    leave training examples (their sum is below 1)."""
    suffix = f" for dataset {what!r}" if what else ""
    for name, value, low_open in (("valid_fraction", valid_fraction, True),
                                  ("test_fraction", test_fraction, False)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not ((0 < value) if low_open else (0 <= value)) or not value < 1:
            raise ConfigError(f"invalid {name} {value!r}{suffix}; valid range: "
                              f"{'(0, 1)' if low_open else '[0, 1)'}")
    if valid_fraction + test_fraction >= 1:  # type: ignore[operator]
        raise ConfigError(f"valid_fraction {valid_fraction!r} + test_fraction {test_fraction!r}"
                          f"{suffix} leave no training examples; their sum must be below 1")


def split_counts(n: int, valid_fraction: float, test_fraction: float) -> tuple[int, int]:
    """How many of ``n`` examples validate and test: at least one each of the splits asked
    for (no test split for ``test_fraction == 0``)."""
    n_valid = max(1, int(round(n * valid_fraction)))
    n_test = max(1, int(round(n * test_fraction))) if test_fraction else 0
    return n_valid, n_test


def split_arrays(name: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 valid_fraction: float, seed: int, test_fraction: float = 0.0,
                 test: tuple[torch.Tensor, torch.Tensor] | None = None) -> Dataset:
    """Standardise ``x`` with training statistics and split it with a seeded permutation.

    The permutation's first ``round(n * valid_fraction)`` examples are the validation split
    and its last ``round(n * test_fraction)`` the test split, so for one seed the validation
    split does not depend on ``test_fraction`` (the training split gives up the test
    examples). ``test`` gives a fixed test split instead (an official test set, such as
    CIFAR's test batch), standardised with the same statistics; then ``test_fraction`` must
    be 0."""
    check_fractions(valid_fraction, test_fraction)
    if test is not None and test_fraction:
        raise ConfigError(f"dataset {name!r}: give a test_fraction ({test_fraction!r}) or a "
                          "fixed test split, not both")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    n_valid, n_test = split_counts(len(x), valid_fraction, test_fraction)
    if len(x) - n_valid - n_test < 1:
        raise ConfigError(f"dataset {name!r} has {len(x)} examples: {n_valid} for validation "
                          f"and {n_test} for test leave none for training; lower "
                          "valid_fraction/test_fraction")
    valid_idx, train_idx = order[:n_valid], order[n_valid:len(x) - n_test]
    test_idx = order[len(x) - n_test:]
    x = x.float()
    mean = x[train_idx].mean(dim=(0, 2, 3), keepdim=True)
    std = x[train_idx].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    stats = {"mean": tuple(float(v) for v in mean.flatten()),
             "std": tuple(float(v) for v in std.flatten())}
    x = (x - mean) / std
    y = y.long()
    if test is not None:
        test_x = ((test[0].float() - mean) / std).contiguous()
        test_y = test[1].long().contiguous()
    elif n_test:
        test_x, test_y = x[test_idx].contiguous(), y[test_idx].contiguous()
    else:
        test_x, test_y = None, None
    return Dataset(name, x[train_idx].contiguous(), y[train_idx].contiguous(),
                   x[valid_idx].contiguous(), y[valid_idx].contiguous(), num_classes,
                   test_x, test_y, **stats)


def split_indices(name: str, n: int, valid_fraction: float, seed: int,
                  test_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, valid, test)`` positions of ``n`` examples: the rule of :func:`split_arrays`
    (a seeded permutation's first examples validate, its last ones test)."""
    check_fractions(valid_fraction, test_fraction)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    n_valid, n_test = split_counts(n, valid_fraction, test_fraction)
    if n - n_valid - n_test < 1:
        raise ConfigError(f"dataset {name!r} has {n} examples: {n_valid} for validation "
                          f"and {n_test} for test leave none for training; lower "
                          "valid_fraction/test_fraction")
    return order[n_valid:n - n_test], order[:n_valid], order[n - n_test:]
