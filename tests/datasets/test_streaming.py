"""Streamed sources: image folders and CIFAR files read on demand, through the same
contract (batches, fixed batch, head, evaluation batches) every consumer reads."""

import os
import pickle
import subprocess
import sys

import numpy as np
import psutil
import pytest
import torch
from PIL import Image

import frugalnas
from frugalnas import ConfigError, create_component
from frugalnas.datasets.streaming import StreamingSource


def make_folder(root, classes=3, per_class=20, size=8, seed=0):
    """``classes`` class folders of distinct random PNG images."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i:04d}.png")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("images"))


def source(folder, **options):
    options.setdefault("size", 8)
    ds = create_component("datasets", "image-folder", path=str(folder), **options)
    assert isinstance(ds, StreamingSource)
    return ds


def store(ds):
    return ds.parts["train"].store


def test_a_folder_source_reads_only_what_is_asked(folder):
    ds = source(folder, normalize=False, cache=False)
    assert store(ds).decodes == 0  # listing the files reads no image
    assert ds.num_examples("train") + ds.num_examples("valid") + ds.num_examples("test") == 60
    assert ds.input_shape == (3, 8, 8) and ds.num_classes == 3
    x, y = next(ds.batches("train", 8, seed=0))
    assert x.shape == (8, 3, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert store(ds).decodes == 8
    ds.fixed_batch(4, seed=1)
    ds.head("valid", 3)
    assert store(ds).decodes == 15
    assert len(ds.labels("train")) == ds.num_examples("train") and store(ds).decodes == 15
    # normalize=False: pixels / 255, the exact decoded values
    file = store(ds).files[int(ds.parts["valid"].indices[0])]
    raw = np.asarray(Image.open(file).convert("RGB").resize((8, 8)), dtype=np.float32)
    assert torch.allclose(ds.head("valid", 1)[0][0], torch.from_numpy(raw.transpose(2, 0, 1)) / 255)


def test_statistics_come_from_a_sample_of_the_training_split(folder):
    ds = source(folder, cache=False)
    x, _ = ds.split("train")
    decodes = store(ds).decodes
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05
    assert len(ds.mean) == 3 and all(s > 1 for s in ds.std)
    assert store(ds).decodes == decodes  # computed once


def test_seeded_split_and_shuffle_are_reproducible_and_disjoint(folder):
    a, b, other = (source(folder, seed=s, normalize=False) for s in (3, 3, 4))
    parts = [set(a.parts[w].indices.tolist()) for w in ("train", "valid", "test")]
    assert sum(map(len, parts)) == 60 and len(set().union(*parts)) == 60
    for which in ("train", "valid", "test"):
        assert a.parts[which].indices.tolist() == b.parts[which].indices.tolist()
    assert a.parts["valid"].indices.tolist() != other.parts["valid"].indices.tolist()
    run = [y.tolist() for _, y in a.batches("train", 8, seed=1, epoch=0)]
    assert run == [y.tolist() for _, y in b.batches("train", 8, seed=1, epoch=0)]
    assert run != [y.tolist() for _, y in a.batches("train", 8, seed=1, epoch=1)]
    assert sum(map(len, run)) == a.num_examples("train")
    assert [len(y) for _, y in a.batches("train", 8, drop_last=True)] == [8] * (a.num_examples("train") // 8)


def test_augmentation_applies_to_the_training_split_only(folder):
    plain = source(folder, seed=0, normalize=False)
    aug = source(folder, seed=0, normalize=False, crop_padding=2, flip=True)
    px = torch.cat([x for x, _ in plain.batches("train", 16, seed=5)])
    ax = torch.cat([x for x, _ in aug.batches("train", 16, seed=5)])
    assert ax.shape == px.shape and not torch.equal(ax, px)
    assert torch.equal(ax, torch.cat([x for x, _ in aug.batches("train", 16, seed=5)]))
    assert not torch.equal(ax, torch.cat([x for x, _ in aug.batches("train", 16, seed=5, epoch=1)]))
    for which in ("valid", "test"):
        assert torch.equal(torch.cat([x for x, _ in aug.batches(which, 16, seed=5)]),
                           torch.cat([x for x, _ in plain.batches(which, 16, seed=5)]))
    assert torch.equal(aug.fixed_batch(8)[0], plain.fixed_batch(8)[0])  # proxies: no augmentation


def test_decoded_images_are_cached_as_uint8(folder):
    ds = source(folder, cache=True, normalize=False)
    n = ds.num_examples("train")
    first = [x for x, _ in ds.batches("train", 8)]
    assert store(ds).decodes == n
    again = [x for x, _ in ds.batches("train", 8)]
    assert store(ds).decodes == n and all(torch.equal(a, b) for a, b in zip(first, again))
    cache = ds.cache_for(store(ds))
    assert cache.filled() == n and cache.nbytes == 60 * 3 * 8 * 8  # one byte per pixel
    assert cache.get(int(ds.parts["train"].indices[0])).dtype == np.uint8
    assert source(folder, cache=False).cache_for(store(ds)) is None


def test_limit_subset_and_resolution_do_not_load_the_rest(folder):
    ds = source(folder, limit=20, normalize=False, cache=False)
    total = sum(ds.num_examples(w) for w in ("train", "valid", "test"))
    assert total == 20
    for which in ("train", "valid", "test"):
        for _ in ds.batches(which, 8):
            pass
    assert store(ds).decodes == 20
    small = ds.resized(4)
    assert small.input_shape == (3, 4, 4) and next(small.batches("train", 4))[0].shape == (4, 3, 4, 4)
    assert store(ds).decodes == 24
    half = ds.subset(0.5, seed=0)
    assert half.num_examples("train") == round(ds.num_examples("train") * 0.5)
    assert set(half.parts["train"].indices) < set(ds.parts["train"].indices)
    assert half.num_examples("valid") == ds.num_examples("valid")
    for _ in half.batches("train", 4):
        pass
    assert store(ds).decodes == 24 + half.num_examples("train")
    both = ds.train_and_valid()
    assert both.num_examples("train") == ds.num_examples("train") + ds.num_examples("valid")


def test_worker_processes_give_the_same_batches(folder):
    inline = source(folder, crop_padding=1, flip=True, seed=2)
    workers = source(folder, crop_padding=1, flip=True, seed=2, num_workers=2)
    batches = workers.batches("train", 8, seed=3)
    x, y = next(batches)
    workers_now = [c for c in psutil.Process().children() if c.ppid() == os.getpid()]
    assert len(workers_now) >= 2  # real worker processes, running while the batches come
    got = [(x, y), *batches]
    want = list(inline.batches("train", 8, seed=3))
    assert len(got) == len(want)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want))
    # the workers filled the shared uint8 cache: this process sees their images
    assert workers.cache_for(store(workers)).filled() >= workers.num_examples("train")
    assert torch.equal(torch.cat([x for x, _ in workers.eval_batches("valid")]), inline.split("valid")[0])


def test_imagenet_style_layout_uses_val_as_the_test_split(tmp_path):
    make_folder(tmp_path / "train", classes=2, per_class=10)
    make_folder(tmp_path / "val", classes=2, per_class=3, seed=1)
    ds = source(tmp_path, valid_fraction=0.2)
    assert ds.num_classes == 2 and ds.num_examples("test") == 6
    assert ds.num_examples("train") + ds.num_examples("valid") == 20
    assert ds.labels("test").tolist() == [0, 0, 0, 1, 1, 1]
    held = source(tmp_path, test_fraction=0.25)
    assert held.num_examples("test") == 5
    few = source(tmp_path, limit=4)  # a seeded choice in val/ too, not its first class only
    assert few.num_examples("test") == 4 and set(few.labels("test").tolist()) == {0, 1}
    assert few.num_examples("train") + few.num_examples("valid") == 4


def test_cifar_files_stream_with_limit_and_resize(tmp_path):
    rng = np.random.default_rng(0)
    for k in (1, 2, 3):
        with open(tmp_path / f"data_batch_{k}", "wb") as fh:
            pickle.dump({"data": rng.integers(0, 255, (20, 3072), dtype=np.uint8),
                         "labels": list(rng.integers(0, 10, 20))}, fh)
    ds = create_component("datasets", "cifar", path=str(tmp_path), limit=25, resize=16,
                          crop_padding=2, flip=True)
    assert ds.num_examples("train") + ds.num_examples("valid") == 25
    assert len(ds.parts["train"].store.images) == 25 and ds.input_shape == (3, 16, 16)
    x, y = next(ds.batches("train", 5))
    assert x.shape == (5, 3, 16, 16)


@pytest.mark.slow
def test_a_study_with_the_train_estimator_over_a_streamed_folder(tmp_path):
    make_folder(tmp_path, classes=4, per_class=60, size=8)
    study = frugalnas.create_study(
        space="nb201", space_options={"N": 1, "C": 4}, estimator="train",
        estimator_options={"epochs": 1, "batch_size": 32}, dataset="image-folder",
        dataset_options={"path": str(tmp_path), "size": 8, "flip": True, "crop_padding": 1},
        seed=0)
    study.optimize(n_trials=2)
    trials = study.optuna_study.trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert all(0 <= t.value <= 100 for t in trials)
    # the estimator counted the streamed splits' examples, not tensors
    assert trials[0].user_attrs["cost"]["epochs"] == pytest.approx(1.0)


def test_in_memory_datasets_serve_the_contract_in_one_batch():
    ds = create_component("datasets", "synthetic", seed=0, n=200, size=8)
    (x, y), = ds.eval_batches("valid")
    assert x is ds.valid_x and y is ds.valid_y
    hx, hy = ds.head("train", 5)
    assert torch.equal(hx, ds.train_x[:5]) and ds.num_examples("test") == len(ds.test_x)
    assert torch.equal(ds.labels("train"), ds.train_y)


BAD_OPTIONS = [
    ({"num_workers": -1}, "invalid num_workers -1 for dataset 'image-folder'; expected an integer >= 0"),
    ({"crop_padding": 1.5}, "invalid crop_padding 1.5 for dataset 'image-folder'"),
    ({"flip": "yes"}, "invalid flip 'yes' for dataset 'image-folder'; valid: true or false"),
    ({"cache": "maybe"}, "invalid cache 'maybe' for dataset 'image-folder'; valid: true, false or none"),
    ({"limit": 1}, "invalid limit 1 for dataset 'image-folder'; expected an integer >= 2"),
    ({"grayscale": "no"}, "invalid grayscale 'no' for dataset 'image-folder'; valid: true or false"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_bad_option_values_are_one_line_errors(folder, options, message):
    from frugalnas.datasets.images import image_folder

    with pytest.raises(ConfigError) as info:
        image_folder.check_options(path=str(folder), **options)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_bad_folders_are_one_line_errors(tmp_path):
    from frugalnas.datasets.images import image_folder

    def error(path, **options):
        with pytest.raises(ConfigError) as info:
            image_folder.check_options(path=str(path), **options)
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "does not exist" in error(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    assert "needs at least 2 class sub-folders, found []" in error(tmp_path / "empty")
    for c in ("a", "b"):
        (tmp_path / "noimages" / c).mkdir(parents=True)
        (tmp_path / "noimages" / c / "notes.txt").write_text("x")
    assert "holds no images" in error(tmp_path / "noimages")
    make_folder(tmp_path / "broken", classes=2, per_class=3)
    bad = tmp_path / "broken" / "class1" / "0000.png"
    bad.write_bytes(b"not a png")
    message = error(tmp_path / "broken")
    assert message.startswith(f"dataset 'image-folder': cannot read image {str(bad)!r}")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_image_met_while_training_names_the_file(tmp_path, workers):
    make_folder(tmp_path, classes=2, per_class=6)
    bad = tmp_path / "class1" / "0005.png"  # not the first of its class: found when read
    bad.write_bytes(b"\x89PNG broken")
    ds = source(tmp_path, normalize=False, num_workers=workers, valid_fraction=0.1, test_fraction=0)
    with pytest.raises(ConfigError) as info:
        for which in ("train", "valid"):
            for _ in ds.batches(which, 4):
                pass
    assert str(info.value).startswith(f"dataset 'image-folder': cannot read image {str(bad)!r}")
    assert "\n" not in str(info.value) and "Traceback" not in str(info.value)


@pytest.mark.slow
def test_the_command_line_refuses_a_missing_folder_in_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "run", "--space", "nb201", "--estimator", "train",
         "--dataset", "image-folder", "-o", f"dataset.path={tmp_path / 'nope'}",
         "-o", "dataset.num_workers=2", "--n-trials", "1",
         "--storage", f"sqlite:///{tmp_path / 's.db'}"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.startswith("frugalnas: error:") and "does not exist" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.db").exists()
