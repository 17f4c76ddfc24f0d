"""Conformance checks for datasets (:class:`frugalnas.Dataset`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frugalnas.ports.data import DataSource
from frugalnas.ports.task import LANGUAGE_MODELLING
from frugalnas.testing._suite import SkipCheck, Suite, describe


class DatasetChecks(Suite):
    """The dataset contract: float images ``(N, C, H, W)`` of one shape in both splits,
    int64 labels in ``[0, num_classes)`` (at least two classes present), finite values,
    training and validation splits without common examples, and the same data for the same
    seed from the factory (a different split for another seed).

    ``dataset`` is a :class:`frugalnas.Dataset` or a factory ``f(seed=...)`` returning one;
    only a factory can be checked for reproducibility."""

    kind = "datasets"
    checks = ("check_shapes", "check_labels", "check_splits_disjoint", "check_seeded")

    #: Share of validation examples that may also appear in the training split (datasets with
    #: genuine duplicates); anything above is a leak.
    max_overlap = 0.01

    def __init__(self, dataset: Any, *, name: str | None = None, seed: int = 0):
        self.seed = seed
        self.factory: Callable[..., Any] | None = None
        if isinstance(dataset, DataSource) or not callable(dataset):
            self._data = dataset
        else:
            self.factory, self._data = dataset, None
        label = name or (getattr(dataset, "name", None) if self._data is not None else
                         getattr(dataset, "__name__", None))
        self.subject = f"dataset {label!r}" if label else describe("dataset", dataset)

    @property
    def data(self) -> Any:
        if self._data is None:
            self._data = self.factory(seed=self.seed)
        return self._data

    # -- checks --------------------------------------------------------------------------
    def check_shapes(self) -> None:
        import torch

        ds = self.data
        if not isinstance(ds, DataSource):
            self.fail(f"the factory returned {type(ds).__name__}, not a frugalnas.Dataset "
                      "(or another frugalnas.ports.data.DataSource)")
        if ds.task.name == LANGUAGE_MODELLING.name:
            self._check_token_shapes(ds)
            return
        for split in ("train", "valid"):
            x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
                self.fail(f"{split}_x must be a float tensor (N, C, H, W); got "
                          f"{getattr(x, 'dtype', type(x).__name__)} of shape "
                          f"{tuple(getattr(x, 'shape', ()))}")
            if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.dtype != torch.int64:
                self.fail(f"{split}_y must be an int64 tensor (N,); got "
                          f"{getattr(y, 'dtype', type(y).__name__)} of shape "
                          f"{tuple(getattr(y, 'shape', ()))}")
            if len(x) != len(y) or len(x) == 0:
                self.fail(f"{split} split has {len(x)} images and {len(y)} labels; expected as "
                          "many of each, at least one")
            if not torch.isfinite(x).all():
                self.fail(f"{split}_x has non-finite values")
        if tuple(ds.valid_x.shape[1:]) != tuple(ds.train_x.shape[1:]):
            self.fail(f"the splits have images of shapes {tuple(ds.train_x.shape[1:])} (train) "
                      f"and {tuple(ds.valid_x.shape[1:])} (valid)")
        if tuple(ds.input_shape) != tuple(ds.train_x.shape[1:]):
            self.fail(f"input_shape {ds.input_shape} is not the images' shape")

    def _check_token_shapes(self, ds: DataSource) -> None:
        import torch

        (context,) = tuple(ds.input_shape)
        for split in ("train", "valid"):
            x, y = ds.head(split, 4)
            for name, t in (("tokens", x), ("next tokens", y)):
                if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or \
                        tuple(t.shape[1:]) != (context,) or len(t) == 0:
                    self.fail(f"{split} {name} must be an int64 tensor (N, {context}); got "
                              f"{getattr(t, 'dtype', type(t).__name__)} of shape "
                              f"{tuple(getattr(t, 'shape', ()))}")
            if not torch.equal(x[:, 1:], y[:, :-1]):
                self.fail(f"{split} next tokens are not the tokens shifted by one")

    def check_labels(self) -> None:
        ds = self.data
        n = ds.num_classes
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            self.fail(f"num_classes is {n!r}; expected an int >= 2")
        for split in ("train", "valid"):
            y = ds.labels(split)
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= n:
                self.fail(f"{split}_y has labels in [{low}, {high}], outside [0, num_classes={n})")
        if ds.labels("train").unique().numel() < 2:
            self.fail("the training split holds a single class")

    def check_splits_disjoint(self) -> None:
        ds = self.data
        train = {row.tobytes() for row in ds.train_x.reshape(len(ds.train_x), -1).numpy()}
        common = sum(row.tobytes() in train
                     for row in ds.valid_x.reshape(len(ds.valid_x), -1).numpy())
        if common > self.max_overlap * len(ds.valid_x):
            self.fail(f"{common} of {len(ds.valid_x)} validation images are also in the "
                      "training split; the splits must not share examples")

    def check_seeded(self) -> None:
        import torch

        if self.factory is None:
            raise SkipCheck("a Dataset object: give its factory to check seeding")
        a, b = self.data, self.factory(seed=self.seed)
        for attr in ("train_x", "train_y", "valid_x", "valid_y"):
            if not torch.equal(getattr(a, attr), getattr(b, attr)):
                self.fail(f"two datasets created with seed={self.seed} differ in {attr}")
        if a.num_classes != b.num_classes:
            self.fail(f"two datasets created with seed={self.seed} have {a.num_classes} and "
                      f"{b.num_classes} classes")
        c = self.factory(seed=self.seed + 1)
        if (c.train_y.shape == a.train_y.shape and torch.equal(c.train_y, a.train_y)
                and torch.equal(c.valid_y, a.valid_y) and torch.equal(c.train_x, a.train_x)):
            self.fail(f"seeds {self.seed} and {self.seed + 1} give the same split; the seed must "
                      "choose the split")


def check_dataset(dataset: Any, *, seed: int = 0, checks: list[str] | None = None) -> list[str]:
    """Run the dataset checks on ``dataset``, a :class:`frugalnas.Dataset` or a factory
    ``f(seed=...)`` (a factory is also checked for seeded reproducibility); returns the names
    of the checks run, raises :class:`~frugalnas.testing.ConformanceError` at the first broken
    rule."""
    return DatasetChecks(dataset, seed=seed).run(checks)
