"""Capabilities a search space declares (SearchSpace's optional methods and core's network
protocols) instead of being probed: scaling, encodings, weight sharing, DARTS relaxation and
the block structure of its networks."""

import random

import pytest
import torch
from optuna.distributions import CategoricalDistribution

from frugalnas.ports.capabilities import (CAPABILITIES, Scaling, WeightSharing, capability,
                                          require_capability, supports)
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.network import BlockNetwork
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.dag.space import DagSpace
from frugalnas.spaces.gpt.space import GPTSpace
from frugalnas.spaces.mobilenet.space import MobileNetSpace
from frugalnas.spaces.nb201.space import NB201Space


class Plain(SearchSpace):
    name = "plain"

    def distributions(self):
        return {"act": CategoricalDistribution(("relu", "tanh"))}

    def build(self, arch, num_classes, input_shape):
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))


def test_a_space_declares_no_capability_by_default():
    space = Plain()
    assert all(capability(space, kind) is None and not supports(space, kind)
               for kind in CAPABILITIES)
    with pytest.raises(ConfigError, match="this test needs a search space with scaling in "
                                          "width or depth; search space 'plain' has none .*"
                                          "built-in spaces that have it: nb201, dag"):
        require_capability(space, Scaling, "this test")


def test_builtin_spaces_declare_what_the_messages_say_they_have():
    spaces = {"nb201": NB201Space(), "dag": DagSpace(), "mobilenet": MobileNetSpace(),
              "gpt": GPTSpace()}
    for kind, (_, names) in CAPABILITIES.items():
        having = {n for n, s in spaces.items() if supports(s, kind)}
        assert having == set(names.split(", ")), kind.__name__
        assert all(capability(spaces[n], kind) is not None for n in having)


def test_builtin_spaces_scale():
    nb = capability(NB201Space(N=5, C=16), Scaling).scaled(width=8, depth=1)
    assert (nb.C, nb.N) == (8, 1) and type(nb) is NB201Space
    assert capability(NB201Space(N=2, C=4), Scaling).scaled(depth=3).C == 4
    dag = capability(DagSpace(channels=8, normal_cells=1), Scaling).scaled(
        width=4, depth=2)
    assert (dag.channels, dag.normal_cells) == (4, 2)
    assert dag.distributions().keys() == DagSpace().distributions().keys()


def test_low_fidelity_refuses_a_space_without_scaling_in_one_line():
    from frugalnas.estimators.low_fidelity import LowFidelityEstimator

    class Context:
        space = Plain()

    class Data:
        num_classes, input_shape = 2, (1, 4, 4)

    with pytest.raises(ConfigError) as info:
        LowFidelityEstimator(width=4).build(Plain().sample(random.Random(0)), Context(), Data())
    message = str(info.value)
    assert "\n" not in message and "search space 'plain' has none" in message
    assert "leave width/depth unset" in message
    # without width/depth the space builds as it is
    LowFidelityEstimator().build(Plain().sample(random.Random(0)), Context(), Data())


def test_low_fidelity_scales_nb201_as_before():
    from frugalnas.estimators.low_fidelity import LowFidelityEstimator

    class Context:
        space = NB201Space()

    class Data:
        num_classes, input_shape = 10, (3, 8, 8)

    arch = NB201Space().sample(random.Random(0))
    net = LowFidelityEstimator(width=4, depth=1).build(arch, Context(), Data())
    ref = NB201Space(N=1, C=4).build(arch, 10, (3, 8, 8))
    assert repr(net) == repr(ref)


def test_networks_of_the_builtin_spaces_declare_their_blocks():
    from frugalnas.backends.out_of_core.backend import find_blocks
    from frugalnas.proxies.aznas import primary_blocks

    nb = NB201Space(N=1, C=4)
    net = nb.build(nb.sample(random.Random(0)))
    assert isinstance(net, BlockNetwork) and net.forward_blocks() == net.blocks
    dag = DagSpace()
    dnet = dag.build(dag.sample(random.Random(0)), 10, (1, 8, 8))
    assert isinstance(dnet, BlockNetwork)
    assert primary_blocks(dnet) == [dnet.stem, *dnet.cells]
    assert [n for n, _ in find_blocks(dnet)] == ["stem"] + [f"cells.{i}" for i in range(len(dnet.cells))]
    shared = capability(nb, WeightSharing).shared_builder(10, (3, 8, 8))
    from frugalnas.nn.weight_store import WeightStore

    subnet = shared.subnet(nb.sample(random.Random(1)), WeightStore(shared.factory).get)
    assert isinstance(subnet, BlockNetwork) and len(find_blocks(subnet)) == 1 + 3 + 2


def test_a_network_without_declared_blocks_keeps_the_fallbacks():
    from frugalnas.backends.out_of_core.backend import find_blocks
    from frugalnas.proxies.aznas import primary_blocks

    class Undeclared(torch.nn.Module):  # has the attribute, but declares nothing
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Conv2d(1, 1, 1)])

    model = Undeclared()
    assert not isinstance(model, BlockNetwork)
    assert find_blocks(model) == [] and primary_blocks(model) == [model.blocks]
    seq = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
    assert len(find_blocks(seq)) == 2


def test_darts_uses_the_declared_relaxation():
    from frugalnas.spaces.dag.relaxation import DagRelaxation
    from frugalnas.weight_sharing.darts import DecisionRelaxation, relaxation_of

    assert isinstance(relaxation_of(DagSpace()), DagRelaxation)
    assert isinstance(relaxation_of(NB201Space()), DecisionRelaxation)
