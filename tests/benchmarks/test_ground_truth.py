"""The lab's stand-alone references (``benchmarks/frugalnas_lab/ground_truth.py``): the file
form, Kendall tau against the mean over seeds, the ceiling of the reference's own noise, and
the packed references kept with the benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.datasets.images import digits
from frugalnas.engine.training import TrainConfig
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.nb201.space import NB201Space

SPACE = NB201Space(N=1, C=4)
A = SPACE.parse("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|"
                "skip_connect~2|")
B = SPACE.parse("|nor_conv_3x3~0|+|nor_conv_1x1~0|nor_conv_3x3~1|+|none~0|nor_conv_1x1~1|"
                "nor_conv_3x3~2|")


def test_ground_truth_file_round_trip_tau_and_ceiling(tmp_path):
    import json

    from frugalnas_lab.ground_truth import GroundTruth, load_ground_truth

    valid = np.array([[90.0, 91.0], [80.0, 79.0], [85.0, 86.0], [70.0, 72.0]])
    gt = GroundTruth("t", "nb201", {"N": 1, "C": 8}, "digits", 2.0, [0, 1],
                     [str(A), str(B), "a", "b"], valid, valid - 1)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(gt.to_json()))
    back = load_ground_truth(path)
    assert back.architectures == gt.architectures and np.array_equal(back.valid, valid)
    assert back.kendall_tau([4, 2, 3, 1]) == pytest.approx(1.0)
    assert back.kendall_tau([1, 3, 2, 4]) == pytest.approx(-1.0)
    assert back.tau_ceiling() == pytest.approx(1.0)  # both seeds order the cells alike
    with pytest.raises(ConfigError, match="expected 4 scores"):
        back.kendall_tau([1, 2])
    with pytest.raises(ConfigError, match="unknown ground truth 'nope'"):
        load_ground_truth("nope")


def test_ground_truth_records_its_data_as_fields_and_reads_the_one_line_form(tmp_path):
    from frugalnas_lab.ground_truth import GroundTruth

    valid = np.array([[90.0, 91.0], [80.0, 79.0], [85.0, 86.0]])
    gt = GroundTruth("t", "mobilenet", {"width_mult": 0.35}, "cluttered-mnist", 3.0, [0, 1],
                     ["a", "b", "c"], valid, valid, dataset_options={"size": 28, "clutter": 6},
                     resize=20)
    back = GroundTruth.from_json(gt.to_json())
    assert (back.dataset, back.dataset_options, back.resize) == \
        ("cluttered-mnist", {"size": 28, "clutter": 6}, 20)
    # A file that describes its data in one line of text, as files did before the fields.
    for text, expected in [("mnist5k (resized to 16x16)", ("mnist5k", {}, 16)),
                           ("mnist5k", ("mnist5k", {}, 0)),
                           ('cluttered-mnist {"size": 28, "clutter": 6}',
                            ("cluttered-mnist", {"size": 28, "clutter": 6}, 0))]:
        old = {k: v for k, v in gt.to_json().items() if k not in ("dataset_options", "resize")}
        read = GroundTruth.from_json({**old, "dataset": text})
        assert (read.dataset, read.dataset_options, read.resize) == expected, text


def test_ground_truth_ranks_within_groups_that_one_decision_separates():
    from frugalnas_lab.ground_truth import GroundTruth

    # Two input sides: side 12 far below side 28. Within side 12 both seeds order the three
    # networks alike, within side 28 the seeds disagree completely; one network of side 20.
    valid = np.array([[30.0, 31.0], [35.0, 36.0], [40.0, 41.0],
                      [80.0, 82.0], [81.0, 81.0], [82.0, 80.0], [60.0, 60.0]])
    sides = [12, 12, 12, 28, 28, 28, 20]
    gt = GroundTruth("t", "mobilenet", {}, "digits", 1.0, [0, 1], list("abcdefg"), valid, valid)
    assert gt.kendall_tau(sides) > 0.6  # the side alone orders most pairs
    assert gt.tau_ceiling_within(sides) == pytest.approx((1.0 + -1.0) / 2)
    # A scorer that knows the side but orders each side's networks backwards.
    backwards = [3.0, 2.0, 1.0, 9.0, 8.0, 7.0, 5.0]
    assert gt.kendall_tau(backwards) > 0.3
    assert gt.kendall_tau_within(backwards, sides) == pytest.approx(-1.0)  # side 28 ties: NaN
    assert np.isnan(gt.kendall_tau_within(backwards, list("abcdefg")))  # no group of 3


def test_the_shipped_references_name_their_registered_dataset():
    from frugalnas.host.plugins import PluginHost
    from frugalnas_lab.ground_truth import load_ground_truth, shipped_names

    registered = set(PluginHost().registry("datasets").names())
    for name in shipped_names():
        gt = load_ground_truth(name)
        assert gt.dataset in registered, (name, gt.dataset)
        assert f"--dataset {gt.dataset}" in gt.command or gt.dataset == "mnist5k", name
        assert (gt.resize == 16) == ("--resize 16" in gt.command), name


def test_stand_alone_training_reports_valid_and_test_accuracy():
    from frugalnas_lab.ground_truth import train_stand_alone

    data = digits(seed=0, test_fraction=0.2)
    out = train_stand_alone(SPACE, A, data, SingleDeviceBackend(),
                            TrainConfig(epochs=1, batch_size=64), seed=0)
    assert set(out) == {"valid", "test", "seconds"} and out["valid"] > 20


@pytest.mark.parametrize("name,seeds", [("nb201-mnist5k", [0, 1]),
                                        ("nb201-mnist5k-8ep", [0, 1, 2, 3])])
def test_the_shipped_ground_truth_loads_with_its_command_and_ceiling(name, seeds):
    from frugalnas_lab.ground_truth import load_ground_truth, shipped_names

    assert name in shipped_names()
    gt = load_ground_truth(name)
    assert gt.seeds == seeds and f"--seeds {','.join(map(str, seeds))}" in gt.command
    assert len(gt.architectures) == 100 and gt.valid.shape == (100, len(seeds))
    assert gt.command.startswith("python benchmarks/ground_truth.py")
    assert all(SPACE.parse(a) for a in gt.architectures[:3])
    # Both references rank the same sample of cells (the same --sample-seed).
    assert gt.architectures == load_ground_truth("nb201-mnist5k").architectures
    assert 0.2 < gt.tau_ceiling() < 0.8
    # Against the 2-seed mean a perfect estimator can do better than one more training, which
    # the noise model puts near the measured seed-to-seed agreement.
    perfect, single = gt.expected_taus()
    assert single < perfect < 1.0 and abs(single - gt.tau_ceiling()) < 0.1
