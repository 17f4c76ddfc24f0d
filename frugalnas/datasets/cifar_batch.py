"""A reader for CIFAR-10/100 python-version batch files that runs no code from the file.

The batches are Python pickles: a dict of ``data`` (a uint8 numpy array, one row of
3 x 32 x 32 pixels per image), ``labels`` (CIFAR-10) or ``fine_labels``/``coarse_labels``
(CIFAR-100), ``filenames`` and ``batch_label``. ``pickle.load`` would call whatever a
file names; :class:`CifarUnpickler` resolves only the few numpy functions an array's pickle
names (Python 2's, as in the official files, and Python 3's, as ``pickle.dump`` writes them)
and refuses any other, before anything is called.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from frugalnas.ports.errors import ConfigError, one_line

#: Pixels per CIFAR image (3 channels of 32 x 32).
IMAGE_SIZE = 3 * 32 * 32
_NUMPY_CORE = ("numpy.core", "numpy._core")


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3's protocol-2 pickles use it for bytes, latin-1 only."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"it encodes bytes with {encoding!r}; a CIFAR batch "
                                     "uses latin-1")
    return text.encode("latin1")


def _allowed(module: str, name: str) -> Any | None:
    """The object an allowed global names, or None."""
    if (module, name) in (("numpy", "ndarray"), ("numpy", "dtype")):
        return getattr(np, name)
    if (module, name) == ("_codecs", "encode"):
        return _latin1_encode
    base, _, sub = module.rpartition(".")
    if base in _NUMPY_CORE and (sub, name) in (("multiarray", "_reconstruct"),
                                               ("multiarray", "scalar"),
                                               ("numeric", "_frombuffer")):
        try:
            from numpy._core import multiarray, numeric
        except ImportError:  # numpy 1.x
            from numpy.core import multiarray, numeric  # type: ignore[no-redef]
        return getattr(multiarray if sub == "multiarray" else numeric, name)
    return None


class CifarUnpickler(pickle.Unpickler):
    """An unpickler whose globals are an explicit allow-list: numpy's array and dtype
    reconstruction (``ndarray``, ``dtype``, ``_reconstruct``, ``scalar``, ``_frombuffer``)
    and latin-1 ``_codecs.encode``. Dicts, lists, tuples, strings, bytes and numbers need no
    global. Any other global, and persistent ids, raise ``pickle.UnpicklingError``."""

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(
                f"it refers to {module}.{name}, which a CIFAR batch does not contain (only "
                "dicts, lists, strings, numbers and numpy arrays are read)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id, which a CIFAR batch does not")


def read_cifar_batch(file: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 3, 32, 32)`` (uint8) and labels ``(N,)`` (int64; CIFAR-100's fine
    labels) of one batch file. Anything but a CIFAR python batch, including a pickle that
    names any other global, is a :class:`ConfigError` naming the file; nothing of it runs."""
    file = Path(file)

    def refused(why: str) -> ConfigError:
        return ConfigError(f"dataset 'cifar': file {str(file)!r} is not a CIFAR python batch: "
                           f"{why}")

    try:
        with open(file, "rb") as fh:
            batch = CifarUnpickler(fh, encoding="latin1").load()
    except OSError as exc:
        raise ConfigError(f"dataset 'cifar': cannot read {str(file)!r}: {one_line(exc)}") \
            from None
    except Exception as exc:  # any malformed pickle: the unpickler's own message
        raise refused(one_line(exc)) from None
    if not isinstance(batch, dict):
        raise refused(f"it holds a {type(batch).__name__}, not a dict")
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype.kind not in "ui" \
            or data.size % IMAGE_SIZE:
        raise refused(f"its 'data' is not an integer array of rows of {IMAGE_SIZE} pixels")
    labels_key = "labels" if "labels" in batch else "fine_labels"
    raw = batch.get(labels_key)
    if not isinstance(raw, (list, tuple, np.ndarray)) or \
            not all(isinstance(v, (int, np.integer)) for v in raw):
        raise refused("it has no integer 'labels' (CIFAR-10) or 'fine_labels' (CIFAR-100)")
    images = data.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32)
    labels = np.asarray(raw, dtype=np.int64)
    if len(labels) != len(images) or (len(labels) and labels.min() < 0):
        raise refused(f"it has {len(images)} images and {len(labels)} labels (or a negative "
                      "label)")
    return images, labels
