"""The shared weight store: one module per key, the same tensors for every candidate."""

import random

import torch

from frugalnas.search_spaces.dag import DagNetwork, DagSpace
from frugalnas.search_spaces.weight_store import WeightStore, decode_key, encode_key


def _space_and_store(seed=0):
    space = DagSpace(channels=4, nodes=3, reductions=1)
    macro = space.macro(10, (1, 8, 8), shared=True)
    return space, WeightStore(macro.make, seed=seed)


def _edge_modules(net):
    return {id(m) for cell in net.cells for m in cell.edges}


def test_candidates_with_the_same_node_share_its_tensors():
    space, store = _space_and_store()
    rng = random.Random(0)
    a = space.sample(rng)
    b = space.mutate(a, rng)
    while b["normal_node2_op0"] != a["normal_node2_op0"] or b["normal_node2_in0"] != a["normal_node2_in0"]:
        b = space.mutate(a, rng)
    net_a, net_b = DagNetwork(space, a, store.get), DagNetwork(space, b, store.get)
    key = ("edge", 0, "normal", 2, a["normal_node2_in0"], a["normal_node2_op0"])
    shared = store.get(key)
    assert net_a.cells[0].edges[0] is shared and net_b.cells[0].edges[0] is shared
    for pa, pb in zip(net_a.cells[0].edges[0].parameters(), net_b.cells[0].edges[0].parameters()):
        assert pa is pb and pa.data_ptr() == pb.data_ptr()
    assert net_a.stem is net_b.stem and net_a.head is net_b.head
    assert net_a.head.weight.data_ptr() == net_b.head.weight.data_ptr()
    # a gradient step through one candidate changes what the other computes
    x = torch.randn(4, 1, 8, 8)
    before = net_b(x).detach().clone()
    net_a(x).sum().backward()
    with torch.no_grad():
        for p in store.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert not torch.allclose(before, net_b(x))


def test_different_operations_get_different_tensors():
    space, store = _space_and_store()
    one = store.get(("edge", 0, "normal", 2, 0, "sep_conv_3x3"))
    other = store.get(("edge", 0, "normal", 2, 0, "sep_conv_5x5"))
    later_cell = store.get(("edge", 2, "normal", 2, 0, "sep_conv_3x3"))
    assert one is not other and one is not later_cell
    assert len(store) == 3 and store.num_parameters() == sum(
        p.numel() for m in (one, other, later_cell) for p in m.parameters())


def test_initial_weights_do_not_depend_on_creation_order():
    space, s1 = _space_and_store(seed=5)
    _, s2 = _space_and_store(seed=5)
    keys = [("stem",), ("edge", 0, "normal", 3, 1, "dil_conv_3x3"), ("se", 1, "reduce", 2)]
    for k in keys:
        s1.get(k)
    for k in reversed(keys):
        s2.get(k)
    for k in keys:
        for p, q in zip(s1.get(k).parameters(), s2.get(k).parameters()):
            assert torch.equal(p, q)
    assert decode_key(encode_key(keys[1])) == keys[1]


def test_checkpoint_round_trip_is_weights_only(tmp_path):
    space, store = _space_and_store()
    net = DagNetwork(space, space.sample(random.Random(2)), store.get)
    with torch.no_grad():
        for p in store.parameters():
            p.add_(torch.randn_like(p))
    store.save(tmp_path / "w.pt", generation=3)
    raw = torch.load(tmp_path / "w.pt", weights_only=True)
    _, fresh = _space_and_store()
    meta = fresh.load(tmp_path / "w.pt")
    assert meta["generation"] == 3 and len(fresh) == len(store) == len(raw["keys"])
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, raw["state"][name])
    x = torch.randn(3, 1, 8, 8)
    rebuilt = DagNetwork(space, net_arch := space.sample(random.Random(2)), fresh.get)
    assert torch.allclose(rebuilt(x), DagNetwork(space, net_arch, store.get)(x), atol=1e-6)
