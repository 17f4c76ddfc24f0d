"""Sources streamed from disk: an :class:`ExampleStore` (images on disk) read on demand by a
:class:`StreamingSource`, in DataLoader worker processes, with an optional uint8 cache
(:class:`ImageCache`) and training-only augmentation (:class:`Augment`)."""

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

from frugalnas.ports.data import (DataSource, epoch_order, fixed_indices, no_test_split,
                                  split_name, subset_indices)
from frugalnas.ports.errors import ConfigError


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
        which = split_name(which)
        return len(self.parts[which].indices) if which in self.parts else 0

    def labels(self, which: str) -> torch.Tensor:
        part = self._part(which)
        return torch.from_numpy(part.store.labels[part.indices].astype(np.int64))

    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        which = split_name(which)
        part = self._part(which)
        n = len(part.indices)
        order = epoch_order(n, shuffle, seed, epoch).numpy()
        stop = n - (n % batch_size) if drop_last else n
        augment = which == "train" and bool(self.augment)
        tasks: list[_Task] = [(part.indices[order[start:start + batch_size]],
                  (seed, epoch, start) if augment else None)
                 for start in range(0, stop, batch_size)]
        return self._read(part, tasks, self.num_workers)

    def fixed_batch(self, size: int, seed: int = 0,
                    which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        part = self._part(which)
        idx = part.indices[fixed_indices(len(part.indices), size, seed).numpy()]
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
        idx = subset_indices(len(train.indices), fraction, seed).numpy()
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
        which = split_name(which)
        if which == "test" and not self.has_test:
            raise no_test_split(self.name)
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
                idx = train.indices[fixed_indices(len(train.indices), min(STATS_SAMPLE, len(train.indices)),
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
