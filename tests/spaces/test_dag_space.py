"""The evolvable DAG cell space: decisions, text form, variation operators, networks."""

import random

import pytest
import torch

import frugalnas
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError, ConfigError
from frugalnas.spaces.dag.space import DagGenotype, DagSpace, check_dag


def test_decisions_are_static_categoricals_named_per_node():
    space = DagSpace(nodes=3)
    dists = space.distributions()
    assert len(dists) == 2 * 3 * 5
    assert dists["normal_node2_in0"].choices == (0, 1)
    assert dists["reduce_node4_in1"].choices == (0, 1, 2, 3)
    assert dists["normal_node3_se"].choices == (False, True)
    assert "sep_conv_3x3" in dists["normal_node2_op0"].choices
    assert DagSpace(attention=False).distributions()["normal_node2_se"].choices == (False,)


def test_text_form_round_trips():
    space = DagSpace()
    rng = random.Random(1)
    for _ in range(20):
        arch = space.sample(rng)
        assert isinstance(arch, DagGenotype)
        text = str(arch)
        assert text.startswith("dag:normal:") and ";reduce:" in text
        assert space.parse(text) == arch == DagGenotype.parse(text)
        assert space.parse(text.removeprefix("dag:")) == arch
        assert Architecture.from_json(arch.to_json()) == arch


def test_bad_genotypes_and_options_are_refused():
    space = DagSpace(nodes=2)
    with pytest.raises(ArchitectureParseError, match="normal:"):
        space.parse("dag:reduce:skip_connect~0+skip_connect~1")
    with pytest.raises(ArchitectureParseError):
        space.parse("dag:normal:skip_connect~0+skip_connect~5|skip_connect~0+skip_connect~1;"
                    "reduce:skip_connect~0+skip_connect~1|skip_connect~0+skip_connect~1")
    with pytest.raises(ConfigError, match="conv_9x9"):
        DagSpace(ops=["sep_conv_3x3", "conv_9x9"])
    with pytest.raises(ConfigError, match="nodes"):
        DagSpace(nodes=0)


def test_dag_stays_valid_under_1000_mutations_and_crossovers():
    space = DagSpace(nodes=4)
    rng = random.Random(0)
    population = [space.sample(rng) for _ in range(8)]
    changed = 0
    for i in range(1000):
        a = rng.choice(population)
        if i % 2:
            child = space.mutate(a, rng)
            assert child != a
            diff = [k for k in a.decisions if a[k] != child[k]]
            assert len(diff) == 1  # one decision of one node
        else:
            b = rng.choice(population)
            child = space.crossover(a, b, rng)
            for cell in ("normal", "reduce"):  # every node whole from one parent
                for n in range(2, 6):
                    keys = [f"{cell}_node{n}_{f}" for f in ("in0", "op0", "in1", "op1", "se")]
                    assert (all(child[k] == a[k] for k in keys)
                            or all(child[k] == b[k] for k in keys))
        space.validate(child)
        check_dag(child, space.nodes)
        assert space.parse(str(child)) == child
        changed += child not in population
        population[rng.randrange(len(population))] = child
    assert changed > 500  # crossover of a parent with itself changes nothing


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_networks_build_for_small_and_cifar_inputs(shape):
    space = DagSpace(channels=4, nodes=3)
    arch = space.sample(random.Random(3))
    net = space.build(arch, 10, shape)
    out = net(torch.randn(2, *shape))
    assert out.shape == (2, 10)
    out.sum().backward()


def test_registered_in_the_plugin_host():
    host = frugalnas.get_host()
    assert "dag" in host.registry("search_spaces")
    assert "si-evolution" in host.registry("strategies")
    assert "inherited" in host.registry("estimators")
    space = host.create("search_spaces", "dag", nodes=2, channels=4)
    assert isinstance(space, DagSpace) and space.nodes == 2


def test_cell_graph_draws_both_cells_with_attention_labels():
    space = DagSpace(nodes=2)
    arch = space.parse("dag:normal:sep_conv_3x3~0+skip_connect~1+se|avg_pool_3x3~2+sep_conv_5x5~0;"
                       "reduce:max_pool_3x3~0+dil_conv_3x3~1|skip_connect~2+sep_conv_3x3~1+se")
    assert space.cell_graph(arch) == [
        ("n:in0", "n:2", "sep_conv_3x3+se"), ("n:in1", "n:2", "skip_connect+se"),
        ("n:2", "n:3", "avg_pool_3x3"), ("n:in0", "n:3", "sep_conv_5x5"),
        ("r:in0", "r:2", "max_pool_3x3"), ("r:in1", "r:2", "dil_conv_3x3"),
        ("r:2", "r:3", "skip_connect+se"), ("r:in1", "r:3", "sep_conv_3x3+se")]
    big = DagSpace(nodes=4)
    a = big.sample(random.Random(0))
    edges = big.cell_graph(a)
    assert len(edges) == 2 * 4 * 2
    assert all(src.split(":")[0] == dst.split(":")[0] for src, dst, _ in edges)
