import pickle

import numpy as np
import pytest
import torch
from PIL import Image

import frugalnas
from frugalnas import ConfigError, create_component
from frugalnas.ports.data import split_arrays


def _rows(x):
    return {row.tobytes() for row in x.reshape(len(x), -1).numpy()}


@pytest.mark.parametrize("name, shape, n", [("digits", (1, 8, 8), 1797), ("mnist5k", (1, 28, 28), 5000)])
def test_offline_datasets(name, shape, n):
    ds = create_component("datasets", name, seed=0)
    assert ds.input_shape == shape and ds.num_classes == 10
    # train / validation / test: 60 / 20 / 20 by default (test_fraction=0.2 was added with
    # the test split; the sizes used to be train + valid == n)
    assert len(ds.train_x) + len(ds.valid_x) + len(ds.test_x) == n
    assert len(ds.test_x) == round(0.2 * n) and ds.test_x.shape[1:] == shape
    assert abs(float(ds.train_x.mean())) < 0.05  # standardised with training statistics
    again = create_component("datasets", name, seed=0)
    assert torch.equal(ds.valid_y, again.valid_y) and torch.equal(ds.test_x, again.test_x)
    other = create_component("datasets", name, seed=1)
    assert not torch.equal(ds.valid_y, other.valid_y)
    assert not torch.equal(ds.test_y, other.test_y)


@pytest.mark.parametrize("name, options", [("digits", {}), ("synthetic", {"n": 300})])
def test_test_split_is_disjoint_and_keeps_the_validation_split(name, options):
    ds = create_component("datasets", name, seed=3, **options)
    test = _rows(ds.test_x)
    assert not test & _rows(ds.train_x) and not test & _rows(ds.valid_x)
    # Without a test split: exactly the train/valid split of the earlier two-way datasets.
    legacy = create_component("datasets", name, seed=3, test_fraction=0, **options)
    assert legacy.test_x is None and not legacy.has_test
    assert torch.equal(ds.valid_y, legacy.valid_y)
    # The same validation images (standardised with the smaller training split's statistics)
    # and the training split gives up exactly the test images.
    assert torch.allclose(ds.valid_x * torch.tensor(ds.std).view(1, -1, 1, 1),
                          legacy.valid_x * torch.tensor(legacy.std).view(1, -1, 1, 1)
                          + (torch.tensor(legacy.mean) - torch.tensor(ds.mean)).view(1, -1, 1, 1),
                          atol=1e-4)
    assert len(ds.train_x) + len(ds.test_x) == len(legacy.train_x)
    with pytest.raises(ConfigError, match="no test split"):
        legacy.split("test")


def test_split_arrays_before_the_test_split_is_unchanged():
    """split_arrays without test_fraction is the two-way split it always was."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 2, 4, 4, generator=g), torch.randint(0, 3, (50,), generator=g)
    ds = split_arrays("toy", x, y, 3, 0.2, seed=5)
    order = torch.randperm(50, generator=torch.Generator().manual_seed(5))
    assert torch.equal(ds.valid_y, y[order[:10]]) and torch.equal(ds.train_y, y[order[10:]])
    assert ds.test_x is None
    mean, std = torch.tensor(ds.mean).view(1, -1, 1, 1), torch.tensor(ds.std).view(1, -1, 1, 1)
    assert torch.allclose(ds.train_x * std + mean, x[order[10:]], atol=1e-5)


def test_dataset_helpers_keep_the_test_split():
    ds = create_component("datasets", "synthetic", seed=0, n=200, size=8)
    assert ds.subset(0.5).test_x is ds.test_x
    assert ds.resized(12).test_x.shape[1:] == (3, 12, 12)
    both = ds.train_and_valid()
    assert len(both.train_x) == len(ds.train_x) + len(ds.valid_x)
    assert torch.equal(both.test_y, ds.test_y)
    x, y = ds.split("test")
    assert x is ds.test_x and y is ds.test_y
    # a Dataset built the old way (six positional fields) has no test split
    old = frugalnas.Dataset("toy", ds.train_x, ds.train_y, ds.valid_x, ds.valid_y, 10)
    assert not old.has_test and old.resized(4).test_x is None


@pytest.mark.parametrize("options, fragment", [
    ({"test_fraction": 1.0}, "invalid test_fraction 1.0 for dataset 'digits'; valid range: [0, 1)"),
    ({"test_fraction": -0.1}, "invalid test_fraction -0.1"),
    ({"test_fraction": "0.2"}, "invalid test_fraction '0.2'"),
    ({"valid_fraction": 0.5, "test_fraction": 0.5}, "leave no training examples"),
])
def test_bad_fractions_are_one_line_config_errors(options, fragment):
    from frugalnas.datasets.images import digits

    with pytest.raises(ConfigError, match="^" + "[^\n]*" + fragment.replace("[", r"\[").replace(
            "(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        digits.check_options(**options)
    with pytest.raises(ConfigError):
        create_component("datasets", "digits", **options)


def test_synthetic_resize_subset_and_batches():
    ds = create_component("datasets", "synthetic", seed=0, n=200, size=8, resize=16)
    assert ds.input_shape == (3, 16, 16) and ds.test_x.shape[1:] == (3, 16, 16)
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
    assert len(ds.train_x) + len(ds.valid_x) + len(ds.test_x) == 10 and len(ds.test_x) == 2
    none = create_component("datasets", "image-folder", path=str(tmp_path), size=16,
                            test_fraction=0)
    assert len(none.train_x) + len(none.valid_x) == 10 and none.test_x is None
    with pytest.raises(ConfigError, match="does not exist"):
        create_component("datasets", "image-folder", path=str(tmp_path / "missing"))


def _cifar_batch(rng, n):
    return {"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8),
            "labels": list(rng.integers(0, 10, n))}


def test_cifar_batches_on_disk(tmp_path):
    rng = np.random.default_rng(0)
    for k in (1, 2):
        with open(tmp_path / f"data_batch_{k}", "wb") as fh:
            pickle.dump(_cifar_batch(rng, 20), fh)
    ds = create_component("datasets", "cifar", path=str(tmp_path))
    assert ds.input_shape == (3, 32, 32)
    assert len(ds.train_x) + len(ds.valid_x) == 40 and not ds.has_test  # no test_batch file
    with pytest.raises(ConfigError, match="no CIFAR batch files"):
        create_component("datasets", "cifar", path=str(tmp_path / "empty"))
    # The official test batch is the test split, standardised with the training statistics.
    test = _cifar_batch(rng, 12)
    with open(tmp_path / "test_batch", "wb") as fh:
        pickle.dump(test, fh)
    ds = create_component("datasets", "cifar", path=str(tmp_path))
    assert len(ds.train_x) + len(ds.valid_x) == 40 and len(ds.test_x) == 12
    assert ds.test_y.tolist() == [int(v) for v in test["labels"]]
    raw = torch.as_tensor(test["data"], dtype=torch.float32).view(-1, 3, 32, 32)
    mean, std = torch.tensor(ds.mean).view(1, 3, 1, 1), torch.tensor(ds.std).view(1, 3, 1, 1)
    assert torch.allclose(ds.test_x, (raw - mean) / std, atol=1e-4)
    assert len(create_component("datasets", "cifar", path=str(tmp_path), limit=5).test_x) == 5
    # A fraction holds out training images instead of the official test batch.
    held = create_component("datasets", "cifar", path=str(tmp_path), test_fraction=0.25)
    assert len(held.test_x) == 10 and len(held.train_x) + len(held.valid_x) == 30


def test_cluttered_mnist_places_each_digit_among_fragments():
    from frugalnas.datasets.images import _cluttered_arrays, _mnist5k_arrays

    ds = create_component("datasets", "cluttered-mnist", seed=0, size=36, clutter=3)
    assert ds.input_shape == (1, 36, 36) and ds.num_classes == 10
    assert len(ds.train_x) + len(ds.valid_x) + len(ds.test_x) == 5000
    # The same images for every split seed; the seed only moves them between the splits.
    # (compared in raw pixels: each split seed standardises with its own training statistics)
    other = create_component("datasets", "cluttered-mnist", seed=1, size=36, clutter=3)

    def raw(d, x):
        return _rows(torch.round(x * torch.tensor(d.std).view(1, -1, 1, 1)
                                 + torch.tensor(d.mean).view(1, -1, 1, 1)))

    assert raw(ds, ds.test_x) != raw(other, other.test_x)
    assert raw(ds, ds.train_x) | raw(ds, ds.valid_x) | raw(ds, ds.test_x) == \
        raw(other, other.train_x) | raw(other, other.valid_x) | raw(other, other.test_x)
    # Without clutter a canvas holds its digit and nothing else, somewhere on the canvas.
    digits = _mnist5k_arrays()[0].reshape(-1, 28, 28).astype(np.float32)
    plain = _cluttered_arrays(36, 0, 8)[:20, 0]
    for canvas, digit in zip(plain, digits[:20]):
        rows, cols = np.nonzero(canvas)
        top, left = rows.min() - np.nonzero(digit)[0].min(), cols.min() - np.nonzero(digit)[1].min()
        assert np.array_equal(canvas[top:top + 28, left:left + 28], digit)
        assert canvas.sum() == digit.sum()
    # Clutter adds ink outside the digit on most canvases.
    cluttered = _cluttered_arrays(36, 3, 8)[:20, 0]
    assert sum(c.sum() > d.sum() for c, d in zip(cluttered, digits[:20])) >= 15


@pytest.mark.parametrize("options, fragment", [
    ({"size": 20}, "size"), ({"clutter": -1}, "clutter"), ({"piece": 0}, "piece"),
    ({"piece": 40}, "piece"), ({"size": "40"}, "size"),
])
def test_cluttered_mnist_refuses_bad_options_by_name(options, fragment):
    from frugalnas.datasets.images import cluttered_mnist

    with pytest.raises(ConfigError, match=f"^[^\n]*{fragment} {options[fragment]!r}"):
        cluttered_mnist.check_options(**options)
