import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from frugalnas import ConfigError, create_component


@pytest.mark.parametrize("name, shape, n", [("digits", (1, 8, 8), 1797), ("mnist5k", (1, 28, 28), 5000)])
def test_offline_datasets(name, shape, n):
    ds = create_component("datasets", name, seed=0)
    assert ds.input_shape == shape and ds.num_classes == 10
    assert len(ds.train_x) + len(ds.valid_x) == n
    assert abs(float(ds.train_x.mean())) < 0.05  # standardised with training statistics
    again = create_component("datasets", name, seed=0)
    assert torch.equal(ds.valid_y, again.valid_y)
    other = create_component("datasets", name, seed=1)
    assert not torch.equal(ds.valid_y, other.valid_y)


def test_synthetic_resize_subset_and_batches():
    ds = create_component("datasets", "synthetic", seed=0, n=200, size=8, resize=16)
    assert ds.input_shape == (3, 16, 16)
    sub = ds.subset(0.5, seed=0)
    assert len(sub.train_x) == round(len(ds.train_x) * 0.5)
    a = [y.tolist() for _, y in ds.batches("train", 32, seed=1, epoch=0)]
    b = [y.tolist() for _, y in ds.batches("train", 32, seed=1, epoch=0)]
    c = [y.tolist() for _, y in ds.batches("train", 32, seed=1, epoch=1)]
    assert a == b and a != c
    assert sum(len(y) for y in a) == len(ds.train_x)


def test_image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("cats", "dogs"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    ds = create_component("datasets", "image-folder", path=str(tmp_path), size=16, valid_fraction=0.2)
    assert ds.input_shape == (3, 16, 16) and ds.num_classes == 2
    assert len(ds.train_x) + len(ds.valid_x) == 10
    with pytest.raises(ConfigError, match="does not exist"):
        create_component("datasets", "image-folder", path=str(tmp_path / "missing"))


def test_cifar_batches_on_disk(tmp_path):
    rng = np.random.default_rng(0)
    for k in (1, 2):
        batch = {"data": rng.integers(0, 255, (20, 3072), dtype=np.uint8),
                 "labels": list(rng.integers(0, 10, 20))}
        with open(tmp_path / f"data_batch_{k}", "wb") as fh:
            pickle.dump(batch, fh)
    ds = create_component("datasets", "cifar", path=str(tmp_path))
    assert ds.input_shape == (3, 32, 32)
    assert len(ds.train_x) + len(ds.valid_x) == 40
    with pytest.raises(ConfigError, match="no CIFAR batch files"):
        create_component("datasets", "cifar", path=str(tmp_path / "empty"))
