"""CIFAR batch files are read without running anything they name: the official format (a
Python 2 pickle of a dict with a numpy array) and Python 3 pickles of it load; a pickle that
names any other callable is refused, naming the file, before it is called."""

import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from frugalnas import ConfigError, create_component
from frugalnas.datasets.cifar_batch import read_cifar_batch


def _py2_str(text: bytes) -> bytes:
    """A Python 2 ``str`` as cPickle writes it (SHORT_BINSTRING / BINSTRING)."""
    if len(text) < 256:
        return b"U" + bytes([len(text)]) + text
    return b"T" + struct.pack("<i", len(text)) + text


def _py2_int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    return b"J" + struct.pack("<i", value)


def _py2_uint8_array(array: np.ndarray) -> bytes:
    """A 2-d uint8 array as Python 2's numpy pickles it: ``_reconstruct`` from
    ``numpy.core.multiarray``, then ``__setstate__`` with the raw bytes as a ``str``."""
    rows, cols = array.shape
    dtype = (b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R"
             + b"(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + struct.pack("<ci", b"J", -1)
             + struct.pack("<ci", b"J", -1) + _py2_int(0) + b"tb")
    return (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n"
            + _py2_int(0) + b"\x85" + _py2_str(b"b") + b"\x87R"
            + b"(" + _py2_int(1) + _py2_int(rows) + _py2_int(cols) + b"\x86" + dtype
            + b"\x89" + _py2_str(array.tobytes()) + b"tb")


def official_batch(data: np.ndarray, labels: list[int], key: bytes = b"labels") -> bytes:
    """A batch file in the format of the official ``cifar-10-python`` files (cPickle,
    protocol 2, written by Python 2): ``batch_label``, ``labels``, ``data``, ``filenames``."""
    items = [(b"batch_label", _py2_str(b"training batch 1 of 5")),
             (key, b"](" + b"".join(_py2_int(v) for v in labels) + b"e"),
             (b"data", _py2_uint8_array(data)),
             (b"filenames", b"](" + b"".join(_py2_str(b"img_%d.png" % i)
                                             for i in range(len(labels))) + b"e")]
    return (b"\x80\x02}(" + b"".join(_py2_str(k) + v for k, v in items) + b"u.")


def test_the_official_python2_format_loads(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(30, 3 * 32 * 32), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=30)]
    (tmp_path / "data_batch_1").write_bytes(official_batch(data, labels))
    (tmp_path / "test_batch").write_bytes(official_batch(data[:10], labels[:10]))

    images, read_labels = read_cifar_batch(tmp_path / "data_batch_1")
    assert images.dtype == np.uint8 and images.shape == (30, 3, 32, 32)
    assert np.array_equal(images.reshape(30, -1), data) and read_labels.tolist() == labels
    # The file is what a plain pickle.load of the official files sees (the format is right).
    with open(tmp_path / "data_batch_1", "rb") as fh:
        plain = pickle.load(fh, encoding="latin1")
    assert sorted(plain) == ["batch_label", "data", "filenames", "labels"]
    assert np.array_equal(plain["data"], data)

    ds = create_component("datasets", "cifar", path=str(tmp_path), valid_fraction=0.2)
    assert ds.input_shape == (3, 32, 32) and len(ds.train_x) + len(ds.valid_x) == 30
    assert len(ds.test_x) == 10


def test_cifar100_fine_labels(tmp_path):
    data = np.zeros((4, 3 * 32 * 32), dtype=np.uint8)
    (tmp_path / "train").write_bytes(official_batch(data, [0, 57, 99, 3], key=b"fine_labels"))
    assert read_cifar_batch(tmp_path / "train")[1].tolist() == [0, 57, 99, 3]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python3_pickles_of_the_format_load(tmp_path, protocol):
    data = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3072) % 256
    batch = {"data": data.astype(np.uint8), "labels": np.array([3, 1])}
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=protocol))
    images, labels = read_cifar_batch(tmp_path / "data_batch_1")
    assert np.array_equal(images.reshape(2, -1), batch["data"]) and labels.tolist() == [3, 1]


class _Payload:
    """Creates a file when unpickled (what a planted batch file could do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("planted", ["global", "in-data", "labels"])
def test_a_malicious_pickle_is_refused_without_running_it(tmp_path, planted):
    marker = tmp_path / "pwned"
    data = np.zeros((2, 3072), dtype=np.uint8)
    batch = {"global": _Payload(marker),
             "in-data": {"data": [data, _Payload(marker)], "labels": [0, 1]},
             "labels": {"data": data, "labels": [0, _Payload(marker)]}}[planted]
    folder = tmp_path / "cifar"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(pickle.dumps(batch))
    with pytest.raises(ConfigError) as info:
        create_component("datasets", "cifar", path=str(folder))
    message = str(info.value)
    assert str(folder / "data_batch_1") in message and "io.open" in message
    assert "\n" not in message
    assert not marker.exists()
    pickle.loads((folder / "data_batch_1").read_bytes())  # what pickle.load would have done
    assert marker.exists()


@pytest.mark.slow
def test_a_malicious_batch_in_a_real_run_never_runs(tmp_path):
    """A real ``frugalnas run`` on a planted batch: the trial that loads it fails with one
    line naming the file, the study ends with an error, and the payload never runs."""
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(pickle.dumps({"data": _Payload(marker), "labels": []}))
    proc = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "run", "--space", "nb201",
         "--estimator", "naswot", "--dataset", "cifar", "-o", f"dataset.path={folder}",
         "--n-trials", "1", "-q", "-p", "no:mlflow"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FRUGALNAS_PROGRESS": "0"})
    assert not marker.exists()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("frugalnas: error: ") and str(folder / "data_batch_1") in last \
        and "io.open" in last, proc.stderr


def test_a_file_that_is_no_batch_names_the_file(tmp_path):
    (tmp_path / "data_batch_1").write_bytes(b"not a pickle at all")
    with pytest.raises(ConfigError, match="data_batch_1.*not a CIFAR python batch"):
        read_cifar_batch(tmp_path / "data_batch_1")
    (tmp_path / "data_batch_2").write_bytes(pickle.dumps({"data": np.zeros((2, 5)),
                                                          "labels": [0, 1]}))
    with pytest.raises(ConfigError, match="data_batch_2.*rows of 3072 pixels"):
        read_cifar_batch(tmp_path / "data_batch_2")
