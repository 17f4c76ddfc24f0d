"""How the conformance suite creates a registered component, and the small, fast settings it
uses for the built-in ones.

A component is checked with the options of its :class:`CheckSetup` (default: its factory's
defaults) and in a small environment: estimators score architectures of a tiny NB201 space on a
small synthetic dataset, strategies drive an in-memory study of that space with the tabular
``nb201-table`` estimator, told ``any_network=True`` (:data:`TABLE_ON_SMALL_NB201`: the tiny
space is not the table's network, so the table scores each cell as in the benchmark network;
only the strategy under check builds tiny networks). A plugin whose component needs something
else (another space, an option without default, a cheaper setting) passes its own setups to
:func:`~frugalnas.testing.check_component` or :func:`~frugalnas.testing.parametrize_with_checks`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frugalnas.compression.checkpoint import save_checkpoint
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.ports.task import LANGUAGE_MODELLING
from frugalnas.spaces.gpt.network import gpt_init

SMALL_NB201 = {"N": 1, "C": 4}
#: The options of ``nb201-table`` on :data:`SMALL_NB201`: the table holds the values of the
#: benchmark network (N=5, C=16) and refuses another one unless told ``any_network``.
TABLE_ON_SMALL_NB201 = {"any_network": True}
SMALL_DAG = {"nodes": 2, "channels": 4, "normal_cells": 1, "reductions": 1}
#: A tiny ``gpt`` space: widths 16/32, one or two layers of one or two 8-wide heads.
SMALL_GPT: dict[str, Any] = {"widths": [16, 32], "min_depth": 1, "max_depth": 2,
                             "heads": [1, 2], "mlp_ratios": [2, 4], "head_dim": 8,
                             "context": 16}
#: A tiny ``vit`` space for 8 x 8 images: patches of 2 or 4, widths 16/32, one or two layers.
SMALL_VIT: dict[str, Any] = {"patch_sizes": [2, 4], "widths": [16, 32], "max_depth": 2,
                             "heads": [1, 2], "mlp_ratios": [2, 4], "head_dim": 8}
SMALL_MOBILENET: dict[str, Any] = {"width_mult": 0.25, "stages": [[16, 2, 2], [24, 2, 1]],
                                    "head_channels": 32}
SMALL_DATA = {"n": 96, "num_classes": 4, "channels": 3, "size": 8}


@dataclass(frozen=True)
class CheckSetup:
    """The settings the suite checks one registered component with.

    ``options`` are the component's own options (a mapping, or a function returning one,
    called when the component is created: for options that need files, such as a dataset's
    ``path``). Estimators are checked on architectures of ``space`` with data from
    ``dataset``; with a ``strategy``, inside a study that uses it (for an estimator that needs
    the state a strategy shares). Strategies are checked in an in-memory study of ``space``
    scored by ``estimator`` for ``n_trials`` trials, created with ``estimator_options``
    (``None``, the default: :data:`TABLE_ON_SMALL_NB201` for ``nb201-table``, none for
    another estimator; see :func:`study_estimator_options`). ``slow`` marks the component's cases
    ``pytest.mark.slow``; ``skip`` names checks that do not apply (with the reason in
    ``skip_reason``). ``check_options`` go to the kind's check suite itself (a search space
    that models text: ``{"task": LANGUAGE_MODELLING, "input_shapes": ((16,),)}``)."""

    options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = field(default_factory=dict)
    space: str = "nb201"
    space_options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = field(
        default_factory=lambda: dict(SMALL_NB201))
    estimator: str = "nb201-table"
    estimator_options: Mapping[str, Any] | None = None
    strategy: str | None = None
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    dataset: str = "synthetic"
    dataset_options: Mapping[str, Any] = field(default_factory=lambda: dict(SMALL_DATA))
    n_trials: int = 6
    slow: bool = False
    skip: tuple[str, ...] = ()
    skip_reason: str = ""
    check_options: Mapping[str, Any] = field(default_factory=dict)

    def resolved_options(self) -> dict[str, Any]:
        options = self.options() if callable(self.options) else self.options
        return dict(options)

    def resolved_space_options(self) -> dict[str, Any]:
        options = self.space_options() if callable(self.space_options) else self.space_options
        return dict(options)


def study_estimator_options(estimator: str, options: Any = None) -> Any:
    """The options of the estimator of a strategy's check study: ``options`` when given, else
    :data:`TABLE_ON_SMALL_NB201` for ``nb201-table`` (whose default space is the tiny
    :data:`SMALL_NB201`), else none."""
    if options is not None:
        return options
    return dict(TABLE_ON_SMALL_NB201) if estimator == "nb201-table" else {}


# -- files for the datasets that read from disk ------------------------------------------
@functools.cache
def _scratch() -> Path:
    path = Path(tempfile.mkdtemp(prefix="frugalnas-checks-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def scratch_dir(name: str) -> str:
    """A folder for the checks' files (removed when the process exits)."""
    path = _scratch() / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


@functools.cache
def image_folder_options() -> dict[str, Any]:
    """A folder of 3 classes x 8 distinct tiny PNG images, for the ``image-folder`` dataset."""
    import numpy as np
    from PIL import Image

    root = Path(scratch_dir("image-folder"))
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"class{c}").mkdir(exist_ok=True)
        for i in range(8):
            pixels = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return {"path": str(root), "size": 8}


@functools.cache
def cifar_options() -> dict[str, Any]:
    """Two CIFAR python-format batch files of 40 random images each, for ``cifar``."""
    import numpy as np

    root = Path(scratch_dir("cifar"))
    rng = np.random.default_rng(0)
    for b in (1, 2):
        batch = {"data": rng.integers(0, 256, size=(40, 3 * 32 * 32), dtype=np.uint8),
                 "labels": [int(v) for v in rng.permutation(np.arange(40) % 10)]}
        with open(root / f"data_batch_{b}", "wb") as fh:
            pickle.dump(batch, fh)
    return {"path": str(root)}


@functools.cache
def tiny_gpt_parent() -> dict[str, Any]:
    """A tiny byte-level GPT saved as a frugalnas checkpoint (fresh weights), for the
    ``gpt-subnet`` space: its options."""
    model = ElasticGPT(256, 32, 2, 2, 8, 64, 16)
    with torch_seed(0):
        gpt_init(model)
    folder = save_checkpoint(model, scratch_dir("gpt-parent"), {"text": {"tokenizer": "bytes"}})
    return {"parent": str(folder), "steps": 2}


@contextlib.contextmanager
def torch_seed(seed: int) -> Iterator[None]:
    """Torch's random numbers from ``seed`` inside, restored after."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _sievo_options() -> dict[str, Any]:
    return {"population_size": 2, "offspring": 2, "batches_per_generation": 1, "batch_size": 8,
            "checkpoint_dir": scratch_dir("sievo")}


_STRATEGY_STUDY = dict(space="dag", space_options=SMALL_DAG, estimator="inherited",
                       estimator_options={"bn_recalibration_batches": 0})

#: Settings for the built-in components, keyed ``(kind, name)``; anything else gets
#: ``CheckSetup()``.
BUILTIN_SETUPS: dict[tuple[str, str], CheckSetup] = {
    ("search_spaces", "nb201"): CheckSetup(options=SMALL_NB201),
    ("search_spaces", "dag"): CheckSetup(options=SMALL_DAG),
    ("search_spaces", "mobilenet"): CheckSetup(options=SMALL_MOBILENET),
    ("search_spaces", "gpt"): CheckSetup(
        options=SMALL_GPT, check_options={"task": LANGUAGE_MODELLING, "input_shapes": ((8,),),
                                          "num_classes": 11}),
    ("search_spaces", "vit"): CheckSetup(options=SMALL_VIT),
    ("search_spaces", "gpt-subnet"): CheckSetup(
        options=tiny_gpt_parent,   # networks predict the parent's 256 byte tokens
        check_options={"task": LANGUAGE_MODELLING, "input_shapes": ((8,),), "num_classes": 256}),
    ("estimators", "inherited-loss"): CheckSetup(
        options={"valid_examples": 4}, space="gpt-subnet", space_options=tiny_gpt_parent,
        dataset="text", dataset_options={"context": 16}),
    ("estimators", "train"): CheckSetup(options={"max_steps": 3, "batch_size": 16}),
    ("estimators", "low-fidelity"): CheckSetup(options={"max_steps": 3, "batch_size": 16,
                                                        "subset": 0.5}),
    ("estimators", "rank-ensemble"): CheckSetup(options={"batch_size": 16}),
    ("estimators", "learned-ensemble"): CheckSetup(
        options={"batch_size": 16, "teacher_options": {"max_steps": 2, "batch_size": 16}}),
    ("estimators", "inherited"): CheckSetup(
        options={"bn_recalibration_batches": 1, "bn_recalibration_batch_size": 8},
        space="dag", space_options=SMALL_DAG, strategy="si-evolution",
        strategy_options=_sievo_options),
    ("strategies", "regularized-evolution"): CheckSetup(
        options={"population_size": 4, "sample_size": 2, "n_init": 3}),
    ("strategies", "local-search"): CheckSetup(options={"n_init": 3}),
    ("strategies", "surrogate-evolution"): CheckSetup(
        options={"n_init": 3, "population_size": 4, "sample_size": 2, "n_candidates": 5,
                 "surrogate_options": {"n_models": 2, "n_estimators": 10}}),
    ("strategies", "bananas"): CheckSetup(
        options={"n_init": 3, "n_candidates": 8, "top_k": 3,
                 "surrogate_options": {"n_models": 2, "epochs": 10}}),
    ("strategies", "prescreen"): CheckSetup(options={"k": 3, "batch_size": 8}),
    # a language-model proxy scores the networks of the gpt space on text
    ("estimators", "decoder_params"): CheckSetup(
        options={"batch_size": 4}, space="gpt", space_options=SMALL_GPT, dataset="text",
        dataset_options={"context": 16}),
    ("estimators", "combined"): CheckSetup(
        options={"members": {"params": {}, "flops": {}}}),
    # Measured latencies repeat through the cache (a measurement itself varies).
    ("estimators", "measured-latency"): CheckSetup(options=lambda: {
        "input_shape": [3, 8, 8], "cache": f"{scratch_dir('latency')}/measured.sqlite",
        "warmup": 1, "repeats": 3}),
    ("estimators", "latency-predictor"): CheckSetup(options=lambda: {
        "input_shape": [3, 8, 8], "cache": f"{scratch_dir('latency')}/predicted.sqlite",
        "warmup": 1, "repeats": 3, "calibration": 2}),
    ("strategies", "mo-evolution"): CheckSetup(
        options={"n_init": 3, "population_size": 4, "sample_size": 2, "n_candidates": 3}),
    ("strategies", "si-evolution"): CheckSetup(options=_sievo_options, n_trials=4,
                                               **_STRATEGY_STUDY),
    ("surrogates", "gp"): CheckSetup(options={"n_restarts": 0}),
    ("backends", "single-device"): CheckSetup(options={"device": "cpu"}),
    ("backends", "out-of-core"): CheckSetup(options={"device": "cpu"}),
    ("backends", "virtual-node"): CheckSetup(options={"virtual_nodes": 2, "device": "cpu"}),
    ("datasets", "synthetic"): CheckSetup(options=SMALL_DATA),
    ("datasets", "mnist5k"): CheckSetup(slow=True),
    ("datasets", "image-folder"): CheckSetup(options=image_folder_options),
    ("datasets", "cifar"): CheckSetup(options=cifar_options),
    # The launcher checks never connect: any well-formed scheduler address will do.
    ("launchers", "dask"): CheckSetup(options={"address": "tcp://127.0.0.1:8786"}),
}


def setup_for(kind: str, name: str,
              setups: Mapping[tuple[str, str], CheckSetup] | None = None) -> CheckSetup:
    """The setup of ``(kind, name)``: from ``setups``, else the built-in one, else defaults."""
    if setups and (kind, name) in setups:
        return setups[(kind, name)]
    return BUILTIN_SETUPS.get((kind, name), CheckSetup())
