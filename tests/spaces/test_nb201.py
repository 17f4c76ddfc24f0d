import random

import numpy as np
import pandas as pd
import pytest
import torch

from frugalnas.spaces.nb201.table import nb201_table
from frugalnas.ports.errors import ArchitectureParseError
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.nb201.space import OPS, NB201Space

SHARED_CSV = __import__("pathlib").Path(__file__).resolve().parents[3] / "shared" / "data" / "nats_bench.csv"


def test_enumerates_all_cells_in_index_order():
    space = NB201Space()
    cells = list(space.enumerate())
    assert len(cells) == len(space) == 15625
    assert len(set(cells)) == 15625
    for i in random.Random(0).sample(range(15625), 200):
        assert space.index(cells[i]) == i
        assert space.from_index(i) == cells[i]


def test_every_decision_is_an_optuna_parameter():
    dists = NB201Space().distributions()
    assert list(dists) == ["edge_1_0", "edge_2_0", "edge_2_1", "edge_3_0", "edge_3_1", "edge_3_2"]
    assert all(tuple(d.choices) == OPS for d in dists.values())


def test_builds_the_benchmark_network():
    space = NB201Space()  # N=5, C=16 as in the benchmark
    arch = space.parse("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|")
    net = space.build(arch, 10, (3, 32, 32))
    assert len(net.blocks) == 1 + 3 * 5 + 2
    out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    # all-3x3 cell: NB201's largest network, about 1.5M parameters in the benchmark
    n_params = sum(p.numel() for p in net.parameters())
    assert 1.4e6 < n_params < 1.6e6


def test_small_networks_on_odd_resolutions():
    space = NB201Space(N=1, C=4)
    arch = space.sample(random.Random(1))
    assert space.build(arch, 10, (1, 28, 28))(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert space.build(arch, 10, (1, 8, 8))(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_table_best_cell():
    table = nb201_table()
    assert table.shape == (15625, 3)
    best = NB201Space().from_index(int(np.argmax(table[:, 0])))
    assert table[:, 0].max() == pytest.approx(94.3733, abs=1e-3)
    assert NB201Space().parse(str(best)) == best


@pytest.mark.skipif(not SHARED_CSV.exists(), reason="shared NAS-Bench-201 CSV not present")
def test_table_matches_the_source_csv():
    df = pd.read_csv(SHARED_CSV).sample(300, random_state=0)
    space, table = NB201Space(), nb201_table()
    for row in df.itertuples(index=False):
        got = table[space.index(space.parse(row.ArchitectureString))]
        assert got[0] == pytest.approx(row.CIFAR10TestAccuracy200Epochs, abs=1e-3)
        assert got[1] == pytest.approx(row.CIFAR100TestAccuracy200Epochs, abs=1e-3)
        assert got[2] == pytest.approx(row.ImageNetTestAccuracy200Epochs, abs=1e-3)


def test_from_params_gives_one_cell_object_per_choice_and_refuses_bad_values():
    space = NB201Space()
    params = dict(zip(space.distributions(), ["nor_conv_3x3", "skip_connect", "none",
                                               "avg_pool_3x3", "nor_conv_1x1", "none"]))
    cell = space.from_params(params)
    again = space.from_params(dict(params))
    assert again is cell  # text and key computed once for every holder
    assert str(cell) == ("nb201:|nor_conv_3x3~0|+|skip_connect~0|none~1|+|avg_pool_3x3~0|"
                         "nor_conv_1x1~1|none~2|")
    assert space.parse(str(cell)) == cell
    for bad in ("conv_5x5", ["none"], 3):
        with pytest.raises(ArchitectureParseError, match="edge_2_1.*valid: none, skip_connect"):
            space.from_params({**params, "edge_2_1": bad})
    with pytest.raises(ArchitectureParseError, match=r"miss decision\(s\) \['edge_3_2'\]"):
        space.from_params({k: v for k, v in params.items() if k != "edge_3_2"})


def test_sample_draws_what_the_generic_sampler_draws():
    # The NB201 figures reprint only if the space's own sampler keeps the generic stream.
    space = NB201Space()
    fast, generic = random.Random(7), random.Random(7)
    for _ in range(200):
        assert space.sample(fast) == SearchSpace.sample(space, generic)
