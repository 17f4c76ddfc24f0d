"""The shared weight store: one module per key, the same tensors for every candidate."""

import random

import torch

from frugalnas.spaces.dag.space import DagNetwork, DagSpace
from frugalnas.spaces.dag.ops import OPS
from frugalnas.nn.weight_store import WeightStore, decode_key, encode_key


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


def test_bn_recalibration_ignores_what_other_candidates_left_behind():
    """Inherited-weight scoring with recalibrated batch norm depends only on the candidate,
    the store's weights and the calibration batches, not on which candidates ran before."""
    from frugalnas.nn.shared_bn import SharedBatchNorm2d, recalibrated_bn

    space, store = _space_and_store()
    rng = random.Random(4)
    target, others = space.sample(rng), [space.sample(rng) for _ in range(3)]
    net = DagNetwork(space, target, store.get)
    calib = [torch.randn(16, 1, 8, 8) for _ in range(2)]
    x = torch.randn(5, 1, 8, 8)

    def score() -> torch.Tensor:
        with recalibrated_bn(net, calib):
            net.eval()
            with torch.no_grad():
                return net(x)

    first = score()
    # other candidates sharing modules recalibrate on other data (and one stays inside it)
    for other in others:
        with recalibrated_bn(DagNetwork(space, other, store.get), [torch.randn(16, 1, 8, 8) * 3 + 1]):
            pass
    stale = DagNetwork(space, others[0], store.get)
    with recalibrated_bn(stale, [torch.randn(16, 1, 8, 8) * 5]):
        assert torch.allclose(score(), first, atol=1e-6)
    assert torch.allclose(score(), first, atol=1e-6)
    # nothing is left behind: no statistics in the modules, none in the state dict
    norms = [m for m in store.modules() if isinstance(m, SharedBatchNorm2d)]
    assert norms and all(m.stats is None and not m.collecting for m in norms)
    assert not any("running" in k for k in store.state_dict())
    # the recalibrated statistics are those of the calibration batches: the output differs
    # from normalising with the 5 evaluation examples' own statistics
    net.eval()
    with torch.no_grad():
        assert not torch.allclose(net(x), first, atol=1e-4)


def test_bn_recalibration_matches_cumulative_running_statistics():
    """The recalibrated statistics equal those of nn.BatchNorm2d with momentum=None."""
    from frugalnas.nn.shared_bn import SharedBatchNorm2d, recalibrated_bn

    shared, ref = SharedBatchNorm2d(3), torch.nn.BatchNorm2d(3, momentum=None)
    batches = [torch.randn(8, 3, 4, 4) * (i + 1) + i for i in range(3)]
    ref.train()
    with torch.no_grad():
        for b in batches:
            ref(b)
    with recalibrated_bn(shared, batches):
        assert torch.allclose(shared.stats[0], ref.running_mean, atol=1e-5)
        assert torch.allclose(shared.stats[1], ref.running_var, atol=1e-5)
        ref.eval()
        shared.eval()
        x = torch.randn(2, 3, 4, 4)
        assert torch.allclose(shared(x), ref(x), atol=1e-5)


def test_every_operation_but_identity_normalises_its_output():
    """A node adds two operation outputs, and under weight sharing the modules downstream see
    the mixtures of many candidates: every operation except the identity ends in batch norm,
    so its output has unit per-channel variance at initialisation whatever the operation."""
    space = DagSpace(channels=4, nodes=3, reductions=1, ops=OPS)
    macro = space.macro(10, (1, 8, 8), shared=True)
    x = 5.0 * torch.randn(32, 8, 8, 8) + 3.0
    for op in OPS:
        for ctype, src in (("normal", 0), ("reduce", 0), ("normal", 3)):
            cell = 1 if ctype == "reduce" else 0
            channels = macro.cells[cell]["c"]
            module = macro.make(("edge", cell, ctype, 2 if src < 2 else src + 1, src, op))
            out = module(x[:, :channels])
            var = out.var(dim=(0, 2, 3))
            if op == "skip_connect" and not (ctype == "reduce" and src < 2):
                assert torch.allclose(out, x[:, :channels])
            else:
                assert torch.allclose(var, torch.ones_like(var), atol=0.05), (op, ctype, var)


def test_the_classifier_sees_normalised_features_and_every_module_is_a_store_key():
    space, store = _space_and_store()
    macro = space.macro(10, (1, 8, 8), shared=True)
    a = space.sample(random.Random(3))
    net = DagNetwork(space, a, store.get)
    assert set(macro.arch_keys(a)) <= set(macro.all_keys())
    assert {decode_key(k) for k in store.entries} == set(macro.arch_keys(a))
    features = []
    net.head.register_forward_hook(lambda m, inp, out: features.append(inp[0]))
    net(torch.randn(64, 1, 8, 8))
    # batch norm, ReLU, global average: per channel the mean of a rectified unit normal,
    # 1 / sqrt(2 pi), whatever operations the last cell's nodes use
    expected = torch.full((macro.out_channels,), (2 * torch.pi) ** -0.5)
    assert torch.allclose(features[0].mean(0), expected, atol=0.05)
