"""The dataset contract: a source of batches with a seeded train / validation / test split.

:class:`DataSource` is what every consumer reads (estimators, proxies, supernets, export):
batches of a split, a fixed batch, the first examples, evaluation batches, the number of
examples, and the derived sources (a training subset, a lower resolution, training +
validation). :class:`Dataset` holds small data as in-memory tensors; :class:`StreamingSource`
reads examples from an :class:`ExampleStore` (images on disk) on demand, in DataLoader worker
processes, with an optional uint8 cache and training-only augmentation.

Search selects on the validation split; the test split is held out for the final report of
an exported model (``frugalnas export``) and no estimator reads it."""

from __future__ import annotations

import mmap
import multiprocessing
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from frugalnas.core.errors import ConfigError

SPLITS = ("train", "valid", "test")


def _which(which: str) -> str:
    if which == "validation":
        return "valid"
    if which not in SPLITS:
        raise ValueError(f"unknown split {which!r}; valid: 'train', 'valid', 'test'")
    return which


def _no_test(name: str) -> ConfigError:
    return ConfigError(f"dataset {name!r} has no test split; create it with "
                       "test_fraction > 0 (-o dataset.test_fraction=0.2)")


def _order(n: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The order of an epoch's examples: depends only on ``(seed, epoch)``."""
    if shuffle:
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return torch.arange(n)


def _fixed_indices(n: int, size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (size,), generator=g) if size > n else torch.randperm(n, generator=g)[:size]


def _subset_indices(n: int, fraction: float, seed: int) -> torch.Tensor:
    if not 0 < fraction <= 1:
        raise ConfigError(f"invalid subset fraction {fraction!r}; valid range: (0, 1]")
    keep = max(1, int(round(n * fraction)))
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:keep]


class DataSource(ABC):
    """A source of batches: what an estimator, a proxy, a supernet or export reads.

    ``name`` and ``num_classes`` are attributes; ``mean``/``std`` are the per-channel
    statistics (raw pixel units) the images are standardised with, ``(raw - mean) / std``,
    where known (a deployed model needs the same preprocessing). ``which`` is ``"train"``,
    ``"valid"`` (or ``"validation"``) or ``"test"``."""

    name: str
    num_classes: int

    @property
    def mean(self) -> tuple[float, ...] | None:
        return None

    @property
    def std(self) -> tuple[float, ...] | None:
        return None

    @property
    @abstractmethod
    def input_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of one example."""

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
        which = _which(which)
        if which == "train":
            return self.train_x, self.train_y
        if which == "valid":
            return self.valid_x, self.valid_y
        if not self.has_test:
            raise _no_test(self.name)
        return self.test_x, self.test_y  # type: ignore[return-value]

    def num_examples(self, which: str) -> int:
        if _which(which) == "test" and not self.has_test:
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
        order = _order(n, shuffle, seed, epoch)
        stop = n - (n % batch_size) if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]

    def fixed_batch(self, size: int, seed: int = 0, which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A deterministic batch of ``size`` examples (repeated if the split is smaller)."""
        x, y = self.split(which)
        idx = _fixed_indices(len(x), size, seed)
        return x[idx], y[idx]

    def subset(self, fraction: float = 1.0, seed: int = 0) -> "Dataset":
        """Keep a seeded ``fraction`` of the training examples (validation and test are kept
        whole)."""
        idx = _subset_indices(len(self.train_x), fraction, seed)
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
    n_valid = max(1, int(round(len(x) * valid_fraction)))
    n_test = max(1, int(round(len(x) * test_fraction))) if test_fraction else 0
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


# -- streamed sources ------------------------------------------------------------------------

#: Training images sampled (seeded) for a streamed source's standardisation statistics.
STATS_SAMPLE = 1024
#: A streamed source's uint8 cache is on by default up to this many bytes.
DEFAULT_CACHE_LIMIT = 1 << 30
#: Examples per evaluation batch of a streamed source.
EVAL_BATCH = 256
#: A batch to read: example indices of a store and the augmentation seed (None: none).
_Task = tuple[np.ndarray, "tuple[int, ...] | None"]


class ExampleStore(ABC):
    """Examples on disk read one at a time: every label known up front (listing is cheap), an
    image decoded only when a batch asks for it. Subclass it for a custom layout and hand it
    to :class:`StreamingSource` (see docs/datasets.md)."""

    #: Channels of a decoded image.
    channels: int = 3

    @property
    @abstractmethod
    def labels(self) -> np.ndarray:
        """One int64 label per example."""

    @abstractmethod
    def read(self, index: int, size: int) -> np.ndarray:
        """Example ``index`` as uint8 ``(channels, size, size)``. Raise :class:`ConfigError`
        naming the file for an image that cannot be read."""

    def __len__(self) -> int:
        return len(self.labels)


class ImageCache:
    """Decoded uint8 images of one store at one size, in anonymous shared memory: DataLoader
    workers (forked) fill it and every process reads it; untouched pages take no memory."""

    def __init__(self, n: int, shape: tuple[int, int, int]):
        self.n, self.shape = n, shape
        self._lock = threading.Lock()
        self._buffers: tuple[mmap.mmap, mmap.mmap] | None = None

    @property
    def nbytes(self) -> int:
        return self.n * int(np.prod(self.shape))

    def allocate(self) -> None:
        """Map the memory (before workers fork, so that they share it)."""
        with self._lock:
            if self._buffers is None:
                self._buffers = (mmap.mmap(-1, max(1, self.nbytes)), mmap.mmap(-1, max(1, self.n)))

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._buffers is None:
            self.allocate()
        images, filled = self._buffers  # type: ignore[misc]
        return (np.frombuffer(images, np.uint8, self.nbytes).reshape(self.n, *self.shape),
                np.frombuffer(filled, np.uint8, self.n))

    def get(self, index: int) -> np.ndarray | None:
        images, filled = self._arrays()
        return images[index] if filled[index] else None

    def put(self, index: int, image: np.ndarray) -> None:
        images, filled = self._arrays()
        images[index] = image
        filled[index] = 1

    def filled(self) -> int:
        """How many images the cache holds."""
        return int(self._arrays()[1].sum()) if self._buffers is not None else 0


@dataclass(frozen=True)
class Augment:
    """Training-split augmentation: a random crop of the image padded by ``crop_padding``
    zero pixels per side, and a horizontal flip with probability 0.5."""

    crop_padding: int = 0
    flip: bool = False

    def __bool__(self) -> bool:
        return bool(self.crop_padding or self.flip)

    def apply(self, x: torch.Tensor, seed: Sequence[int]) -> torch.Tensor:
        """Augment the uint8 batch ``x`` (B, C, H, W); the draws depend only on ``seed``."""
        rng = np.random.default_rng(list(seed))
        b, _, h, w = x.shape
        if self.crop_padding:
            p = self.crop_padding
            padded = F.pad(x, (p, p, p, p))
            dy, dx = rng.integers(0, 2 * p + 1, b), rng.integers(0, 2 * p + 1, b)
            x = torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(b)])
        if self.flip:
            flip = torch.from_numpy(rng.random(b) < 0.5)
            if bool(flip.any()):
                x = x.clone()
                x[flip] = x[flip].flip(-1)
        return x


@dataclass(frozen=True)
class Part:
    """One split: examples ``indices`` of ``store``."""

    store: ExampleStore
    indices: np.ndarray


class _Shared:
    """What the copies of one source share: the uint8 caches (per store and size) and the
    standardisation statistics, each made once."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.caches: dict[tuple[int, int], ImageCache] = {}
        self.stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None


class _BatchReader(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Reads one batch per item (a task: example indices and an augmentation seed), in a
    DataLoader worker or in the calling process: decode (or take from the cache), augment,
    standardise. A failure comes back as its one-line message, never as a worker traceback."""

    def __init__(self, part: Part, size: int, cache: ImageCache | None, augment: Augment,
                 mean: torch.Tensor, std: torch.Tensor):
        self.part, self.size, self.cache, self.augment = part, size, cache, augment
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.part.indices)

    def raw(self, index: int) -> np.ndarray:
        image = self.cache.get(index) if self.cache is not None else None
        if image is None:
            image = self.part.store.read(index, self.size)
            if self.cache is not None:
                self.cache.put(index, image)
        return image

    def __getitem__(self, task: tuple[np.ndarray, tuple[int, ...] | None]) -> Any:
        indices, seed = task
        try:
            x = torch.from_numpy(np.stack([self.raw(int(i)) for i in indices]))
        except ConfigError as e:
            return None, None, str(e)
        if seed is not None and self.augment:
            x = self.augment.apply(x, seed)
        x = (x.float() - self.mean) / self.std
        y = torch.from_numpy(self.part.store.labels[indices].astype(np.int64))
        return x, y, None


@dataclass(frozen=True, eq=False)
class StreamingSource(DataSource):
    """Examples of :class:`ExampleStore` s read on demand: the splits are index arrays, a
    batch is decoded when it is drawn (in ``num_workers`` DataLoader worker processes, into
    pinned memory for CUDA), kept as uint8 in a shared cache, augmented on the training split
    only and standardised with statistics from a seeded sample of training images."""

    name: str
    parts: dict[str, Part]
    num_classes: int
    size: int
    seed: int = 0
    num_workers: int = 0
    cache: bool | None = None
    pin_memory: bool | None = None
    augment: Augment = Augment()
    normalize: bool = True
    shared: _Shared = field(default_factory=_Shared, compare=False, repr=False)

    # -- the contract ------------------------------------------------------------------------
    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.parts["train"].store.channels, self.size, self.size)

    @property
    def has_test(self) -> bool:
        return "test" in self.parts and len(self.parts["test"].indices) > 0

    @property
    def mean(self) -> tuple[float, ...]:
        return self._stats()[0]

    @property
    def std(self) -> tuple[float, ...]:
        return self._stats()[1]

    def num_examples(self, which: str) -> int:
        which = _which(which)
        return len(self.parts[which].indices) if which in self.parts else 0

    def labels(self, which: str) -> torch.Tensor:
        part = self._part(which)
        return torch.from_numpy(part.store.labels[part.indices].astype(np.int64))

    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        which = _which(which)
        part = self._part(which)
        n = len(part.indices)
        order = _order(n, shuffle, seed, epoch).numpy()
        stop = n - (n % batch_size) if drop_last else n
        augment = which == "train" and bool(self.augment)
        tasks: list[_Task] = [(part.indices[order[start:start + batch_size]],
                  (seed, epoch, start) if augment else None)
                 for start in range(0, stop, batch_size)]
        return self._read(part, tasks, self.num_workers)

    def fixed_batch(self, size: int, seed: int = 0,
                    which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        part = self._part(which)
        idx = part.indices[_fixed_indices(len(part.indices), size, seed).numpy()]
        return next(self._read(part, [(idx, None)], 0))  # one task: one batch

    def head(self, which: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = self._part(which)
        got = list(self._read(part, self._in_order(part, n), 0))
        return torch.cat([x for x, _ in got]), torch.cat([y for _, y in got])

    def eval_batches(self, which: str,
                     limit: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        part = self._part(which)
        return self._read(part, self._in_order(part, limit), self.num_workers)

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(which, self.num_examples(which))

    def subset(self, fraction: float = 1.0, seed: int = 0) -> "StreamingSource":
        train = self.parts["train"]
        idx = _subset_indices(len(train.indices), fraction, seed).numpy()
        return self._with("train", Part(train.store, train.indices[idx]))

    def train_and_valid(self) -> "StreamingSource":
        train, valid = self.parts["train"], self.parts["valid"]
        return self._with("train", Part(train.store, np.concatenate([train.indices, valid.indices])))

    def resized(self, size: int) -> "StreamingSource":
        return self if size == self.size else replace(self, size=int(size))

    # -- whole-split conveniences (small data, tests) ------------------------------------------
    @property
    def train_x(self) -> torch.Tensor:
        return self.split("train")[0]

    @property
    def train_y(self) -> torch.Tensor:
        return self.labels("train")

    @property
    def valid_x(self) -> torch.Tensor:
        return self.split("valid")[0]

    @property
    def valid_y(self) -> torch.Tensor:
        return self.labels("valid")

    @property
    def test_x(self) -> torch.Tensor | None:
        return self.split("test")[0] if self.has_test else None

    @property
    def test_y(self) -> torch.Tensor | None:
        return self.labels("test") if self.has_test else None

    # -- reading -------------------------------------------------------------------------------
    def cache_for(self, store: ExampleStore) -> ImageCache | None:
        """The uint8 cache of ``store`` at this source's size (``None``: caching is off)."""
        shape = (store.channels, self.size, self.size)
        nbytes = len(store) * int(np.prod(shape))
        if self.cache is False or (self.cache is None and nbytes > DEFAULT_CACHE_LIMIT):
            return None
        with self.shared.lock:
            return self.shared.caches.setdefault((id(store), self.size), ImageCache(len(store), shape))

    def _with(self, which: str, part: Part) -> "StreamingSource":
        return replace(self, parts={**self.parts, which: part})

    def _part(self, which: str) -> Part:
        which = _which(which)
        if which == "test" and not self.has_test:
            raise _no_test(self.name)
        return self.parts[which]

    @staticmethod
    def _in_order(part: Part, limit: int | None) -> list[_Task]:
        n = len(part.indices) if limit is None else min(int(limit), len(part.indices))
        return [(part.indices[start:min(start + EVAL_BATCH, n)], None)
                for start in range(0, n, EVAL_BATCH)]

    def _stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and standard deviation (raw pixel units) of a seeded sample of at
        most :data:`STATS_SAMPLE` training images; 0 and 255 with ``normalize=False``."""
        channels = self.input_shape[0]
        if not self.normalize:
            return (0.0,) * channels, (255.0,) * channels
        with self.shared.lock:
            if self.shared.stats is None:
                train = self.parts["train"]
                idx = train.indices[_fixed_indices(len(train.indices), min(STATS_SAMPLE, len(train.indices)),
                                                   self.seed).numpy()]
                zero, one = torch.zeros(1, channels, 1, 1), torch.ones(1, channels, 1, 1)
                cache = self.cache_for(train.store)
                if cache is not None:
                    cache.allocate()
                reader = _BatchReader(train, self.size, cache, Augment(), zero, one)
                x, _, error = reader[(idx, None)]
                if error is not None:
                    raise ConfigError(error)
                x = x.double()
                self.shared.stats = (tuple(float(v) for v in x.mean(dim=(0, 2, 3))),
                                     tuple(max(float(v), 1e-6) for v in x.std(dim=(0, 2, 3))))
            return self.shared.stats

    def _read(self, part: Part, tasks: Sequence[_Task],
              workers: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        mean, std = self._stats()
        cache = self.cache_for(part.store)
        fork = "fork" in multiprocessing.get_all_start_methods()
        if workers and not fork:
            cache = None  # the anonymous shared memory is inherited by forked workers only
        if cache is not None:
            cache.allocate()
        reader = _BatchReader(part, self.size, cache, self.augment,
                              torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1))
        return self._batches(reader, tasks, workers, fork)

    def _batches(self, reader: _BatchReader, tasks: Sequence[_Task],
                 workers: int, fork: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not tasks:
            return
        if workers == 0:
            results: Iterator[Any] = (reader[task] for task in tasks)
        else:
            pin = torch.cuda.is_available() if self.pin_memory is None else self.pin_memory
            results = iter(torch.utils.data.DataLoader(
                reader, batch_size=None, sampler=tasks, num_workers=min(workers, len(tasks)),
                pin_memory=pin, multiprocessing_context="fork" if fork else None))
        for x, y, error in results:
            if error is not None:
                raise ConfigError(error)
            yield x, y


def split_indices(name: str, n: int, valid_fraction: float, seed: int,
                  test_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, valid, test)`` positions of ``n`` examples: the rule of :func:`split_arrays`
    (a seeded permutation's first examples validate, its last ones test)."""
    check_fractions(valid_fraction, test_fraction)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    n_valid = max(1, int(round(n * valid_fraction)))
    n_test = max(1, int(round(n * test_fraction))) if test_fraction else 0
    if n - n_valid - n_test < 1:
        raise ConfigError(f"dataset {name!r} has {n} examples: {n_valid} for validation "
                          f"and {n_test} for test leave none for training; lower "
                          "valid_fraction/test_fraction")
    return order[n_valid:n - n_test], order[:n_valid], order[n - n_test:]
