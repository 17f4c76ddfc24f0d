"""The ``mobilenet`` macro space: conditional block decisions, its compact text form, optuna
samplers on it, its supernet of elastic blocks (a shared network equals its stand-alone
export bitwise), and studies with weight sharing and training on it."""

import random

import optuna
import pytest
import torch

from frugalnas.ports.capabilities import ProgressiveShrinking, WeightSharing, capability
import frugalnas
from frugalnas.ports.errors import ArchitectureParseError, ConfigError
from frugalnas.nn.weight_store import WeightStore
from frugalnas.spaces.mobilenet.network import MobileNetNetwork
from frugalnas.spaces.mobilenet.space import MobileNetSpace, block_keys, depth_key
from frugalnas.spaces.mobilenet.supernet import export_subnet

SMALL = {"width_mult": 0.25, "stages": [[16, 3, 2], [24, 2, 1]], "head_channels": 32}
DATA = {"n": 96, "num_classes": 4, "channels": 1, "size": 12}


def test_text_form_round_trips_and_holds_only_the_blocks_a_stage_has():
    space = MobileNetSpace(**SMALL)
    arch = space.parse("mobilenet:k5e4s|k3e6,k7e3")
    assert arch.decisions == {
        "stage1_depth": 1, "stage1_block0_kernel": 5, "stage1_block0_expand": 4,
        "stage1_block0_se": True, "stage2_depth": 2, "stage2_block0_kernel": 3,
        "stage2_block0_expand": 6, "stage2_block0_se": False, "stage2_block1_kernel": 7,
        "stage2_block1_expand": 3, "stage2_block1_se": False}
    assert space.parse(str(arch)) == arch
    assert type(arch).from_json(arch.to_json()) == arch
    rng = random.Random(0)
    for _ in range(30):
        a = space.sample(rng)
        assert space.parse(str(a)) == a
        depth = a[depth_key(1)]
        assert block_keys(1, depth - 1)[0] in a.decisions
        if depth < 3:
            assert block_keys(1, depth)[0] not in a.decisions


def test_inactive_decisions_are_neither_stored_nor_mutated():
    space = MobileNetSpace(**SMALL)
    arch = space.parse("k3e3|k3e3")
    # from_params ignores values of blocks beyond a stage's depth
    params = {**arch.decisions, "stage1_block2_kernel": 7}
    assert space.from_params(params) == arch
    rng = random.Random(3)
    for _ in range(200):
        child = space.mutate(arch, rng)
        changed = {k for k in child.decisions if arch.decisions.get(k) != child[k]}
        assert len(changed - {k for k in child.decisions if k not in arch.decisions}) == 1
        assert set(child.decisions) == set(space.active_decisions(child))
    # a deeper stage gains drawn blocks, a shallower one drops them
    deeper = space.from_params({**arch.decisions, "stage1_depth": 2, "stage1_block1_kernel": 5,
                                "stage1_block1_expand": 6, "stage1_block1_se": True})
    assert str(deeper) == "mobilenet:k3e3,k5e6s|k3e3"
    assert len(space.neighbours(arch)) == len({n.key for n in space.neighbours(arch)})


def test_bad_architectures_and_options_are_refused_in_one_line():
    space = MobileNetSpace(**SMALL)
    with pytest.raises(ArchitectureParseError, match="malformed block 'k3x3'"):
        space.parse("k3x3|k3e3")
    with pytest.raises(ArchitectureParseError, match=r"invalid value 9 for decision "
                                                     r"'stage1_block0_kernel'.*3, 5, 7"):
        space.parse("k9e3|k3e3")
    with pytest.raises(ArchitectureParseError, match="invalid value 4 for decision 'stage1_depth'"):
        space.parse("k3e3,k3e3,k3e3,k3e3|k3e3")
    with pytest.raises(ArchitectureParseError, match="miss decision 'stage2_depth'"):
        space.from_params({"stage1_depth": 1, "stage1_block0_kernel": 3,
                           "stage1_block0_expand": 3, "stage1_block0_se": False})
    with pytest.raises(ConfigError, match="invalid kernels"):
        MobileNetSpace(kernels=(3, 4))
    with pytest.raises(ConfigError, match="unknown stages 'v9'"):
        MobileNetSpace(stages="v9")
    with pytest.raises(ConfigError, match=r"invalid stage \[16, 0, 2\]"):
        MobileNetSpace(stages=[[16, 0, 2]])


def test_optuna_samplers_see_only_the_active_decisions():
    space = MobileNetSpace(**SMALL)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=4))
    for i in range(10):
        trial = study.ask()
        arch = space.suggest(trial)
        assert trial.params == arch.decisions
        study.tell(trial, float(i % 3))


def test_shared_network_equals_its_stand_alone_export_bitwise():
    space = MobileNetSpace(**SMALL)
    builder = capability(space, WeightSharing).shared_builder(4, (1, 12, 12))
    store = WeightStore(builder.factory, seed=0)
    x = torch.randn(3, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    rng = random.Random(1)
    for _ in range(4):
        arch = space.sample(rng)
        net = builder.subnet(arch, store.get)
        net.train()
        net(x).sum().backward()   # moves batch-norm statistics, leaves gradients
        net.eval()
        alone = export_subnet(net).eval()
        assert isinstance(alone, MobileNetNetwork)
        assert not {id(p) for p in alone.parameters()} & {id(p) for p in store.parameters()}
        assert torch.equal(net(x), alone(x))
        # the export has the stand-alone build's structure
        built = space.build(arch, 4, (1, 12, 12))
        assert [tuple(p.shape) for p in alone.parameters()] == \
            [tuple(p.shape) for p in built.parameters()]


def test_mobilenet_v2_point_and_resolution():
    space = MobileNetSpace(width_mult=0.35, resolution=32)
    v2 = space.mobilenet_v2()
    assert str(v2) == ("mobilenet:k3e6,k3e6|k3e6,k3e6,k3e6|k3e6,k3e6,k3e6,k3e6|"
                       "k3e6,k3e6,k3e6|k3e6,k3e6,k3e6|k3e6")
    net = space.build(v2, 10, (1, 28, 28))
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert net.stem[0].size == 32


def test_a_searched_resolution_is_a_decision_of_every_network():
    space = MobileNetSpace(**SMALL, resolutions=[16, 8, 12])
    assert space.resolutions == (8, 12, 16)
    arch = space.parse("mobilenet:r12/k5e4s|k3e6,k7e3")
    assert list(arch.decisions)[0] == "resolution" and arch["resolution"] == 12
    assert space.parse(str(arch)) == arch and str(arch).startswith("mobilenet:r12/")
    assert space.size() == 3 * MobileNetSpace(**SMALL).size()
    rng = random.Random(0)
    drawn = [space.sample(rng) for _ in range(30)]
    assert {a["resolution"] for a in drawn} == {8, 12, 16}
    assert all(space.parse(str(a)) == a for a in drawn)
    mutated = [space.mutate(arch, rng) for _ in range(300)]
    assert {m["resolution"] for m in mutated} == {8, 12, 16}
    assert {n["resolution"] for n in space.neighbours(arch)} == {8, 12, 16}
    assert space.largest()["resolution"] == 16
    assert space.mobilenet_v2()["resolution"] == 16
    assert space.mobilenet_v2(resolution=8)["resolution"] == 8
    net = space.build(arch, 4, (1, 12, 12))
    assert net.stem[0].size == 12
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 4)
    assert space.cell_graph(arch)[0] == ("stem (12x12)", "stage 1", "k5e4s")
    # the one-hot resolution leads the space's own encoding
    from frugalnas.spaces.mobilenet.encodings import MobileNetStructureEncoding

    features = MobileNetStructureEncoding(space).encode_one(arch)
    assert list(features[:3]) == [0.0, 1.0, 0.0]
    assert len(features) == 3 + len(MobileNetStructureEncoding(MobileNetSpace(**SMALL)).encode_one(
        MobileNetSpace(**SMALL).parse("k5e4s|k3e6,k7e3")))


def test_searched_resolutions_are_refused_when_malformed_or_beside_a_fixed_one():
    with pytest.raises(ConfigError, match=r"either resolution \(20, fixed\) or resolutions"):
        MobileNetSpace(resolution=20, resolutions=[16, 20])
    for bad in ([], [4, 16], "16", [16.5]):
        with pytest.raises(ConfigError, match="invalid resolutions"):
            MobileNetSpace(resolutions=bad)
    space = MobileNetSpace(**SMALL, resolutions=[8, 12])
    with pytest.raises(ArchitectureParseError, match=r"invalid value 20 for decision "
                                                     r"'resolution'.*8, 12"):
        space.parse("r20/k3e3|k3e3")
    with pytest.raises(ArchitectureParseError, match=r"missing \['resolution'\]"):
        space.validate(MobileNetSpace(**SMALL).parse("k3e3|k3e3"))
    with pytest.raises(ConfigError, match="does not search the resolution"):
        MobileNetSpace(**SMALL).mobilenet_v2(resolution=12)


def test_one_supernet_serves_every_searched_resolution_bitwise():
    space = MobileNetSpace(**SMALL, resolutions=[8, 12])
    builder = capability(space, WeightSharing).shared_builder(4, (1, 12, 12))
    store = WeightStore(builder.factory, seed=0)
    x = torch.randn(3, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    for text in ("r8/k5e4s|k3e6,k7e3", "r12/k5e4s|k3e6,k7e3"):
        arch = space.parse(text)
        net = builder.subnet(arch, store.get).eval()
        alone = export_subnet(net).eval()
        assert torch.equal(net(x), alone(x))
        built = space.build(arch, 4, (1, 12, 12))
        assert [n for n, _ in alone.named_parameters()] == \
            [n for n, _ in built.named_parameters()]
        built.load_state_dict(alone.state_dict())
        assert torch.equal(built.eval()(x), net(x))
    small, large = (builder.subnet(space.parse(t), store.get).eval()(x)
                    for t in ("r8/k5e4s|k3e6,k7e3", "r12/k5e4s|k3e6,k7e3"))
    assert not torch.equal(small, large)
    phases = dict(capability(space, ProgressiveShrinking).shrinking_phases())
    rng = random.Random(0)
    assert {phases["largest"](rng)["resolution"] for _ in range(20)} == {8, 12}


@pytest.mark.slow
def test_supernet_and_training_studies_on_the_space(tmp_path):
    for estimator, options in (("supernet", {"epochs": 4, "batch_size": 32, "bn_batches": 1,
                                             "progressive_shrinking": True}),
                               ("train", {"epochs": 1, "batch_size": 32})):
        study = frugalnas.create_study(
            space="mobilenet", space_options=SMALL, strategy="regularized-evolution",
            strategy_options={"population_size": 3, "sample_size": 2}, estimator=estimator,
            estimator_options=options, dataset="synthetic", dataset_options=DATA, seed=0)
        study.optimize(n_trials=4)
        done = [t for t in study.trials if t.state.name == "COMPLETE"]
        assert len(done) == 4
        assert all(0.0 <= t.values[0] <= 100.0 for t in done)


def test_progressive_shrinking_phases_widen_step_by_step():
    space = MobileNetSpace(**SMALL)
    phases = dict(capability(space, ProgressiveShrinking).shrinking_phases())
    assert list(phases) == ["largest", "elastic kernel", "elastic depth", "elastic expand"]
    rng = random.Random(0)
    assert {phases["largest"](rng) for _ in range(5)} == {space.largest()}
    kernel = [phases["elastic kernel"](rng) for _ in range(40)]
    assert {a["stage1_depth"] for a in kernel} == {3}
    assert {a["stage1_block0_expand"] for a in kernel} == {6}
    assert len({a["stage1_block0_kernel"] for a in kernel}) == 3
    depth = [phases["elastic depth"](rng) for _ in range(40)]
    assert len({a["stage1_depth"] for a in depth}) == 3
    assert {a["stage1_block0_expand"] for a in depth} == {6}
    expand = [phases["elastic expand"](rng) for _ in range(40)]
    assert len({a["stage1_block0_expand"] for a in expand}) == 3


def test_progressive_shrinking_is_refused_where_a_space_has_no_phases():
    with pytest.raises(ConfigError, match="progressive_shrinking needs a search space with "
                                          "progressive shrinking; search space 'nb201' has "
                                          "none"):
        frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                               estimator="supernet",
                               estimator_options={"epochs": 1, "progressive_shrinking": True},
                               dataset="synthetic", dataset_options=DATA)


def test_the_review_draws_the_macro_network_stage_by_stage():
    space = MobileNetSpace(**SMALL)
    arch = space.parse("k5e4s,k3e3|k7e6")
    assert space.cell_graph(arch) == [("stem", "stage 1", "k5e4s, k3e3"),
                                      ("stage 1", "stage 2", "k7e6")]


def test_the_shipped_example_passes_its_dry_run(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "mobilenet_search.toml"
    folder = tmp_path / "run"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-m", "frugalnas.cli.main", "run", str(example),
                           "--dry-run"], cwd=folder, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["space"]["options"]["width_mult"] == 0.35
    assert not list(folder.iterdir())   # a dry run writes nothing


@pytest.mark.slow
@pytest.mark.parametrize("backend, options", [("out-of-core", {"budget_fraction": 0.7}),
                                              ("virtual-node", {"virtual_nodes": 4})])
def test_mobilenet_networks_train_on_the_other_backends(backend, options):
    """The out-of-core backend plans over the network's declared blocks (stem, each MBConv,
    head); virtual nodes split its batches."""
    study = frugalnas.create_study(
        space="mobilenet", space_options=SMALL, estimator="train",
        estimator_options={"max_steps": 2, "batch_size": 16}, backend=backend,
        backend_options=options, dataset="synthetic", dataset_options=DATA,
        disable_plugins=("mlflow", "progress"))
    study.optimize(n_trials=2)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def test_a_space_with_searched_resolutions_passes_the_conformance_suite():
    from frugalnas.testing import check_search_space

    check_search_space(MobileNetSpace(**SMALL, resolutions=[8, 12]))


def test_latency_tables_tell_searched_resolutions_apart():
    """A per-layer latency table keys each layer by its configuration and input shape: the
    resize to 8 and to 12 pixels from the same input are different layers."""
    from frugalnas.latency.kernels import network_kernels

    space = MobileNetSpace(**SMALL, resolutions=[8, 12])
    small, large = (network_kernels(space.build(space.parse(t), 4, (1, 12, 12)), (1, 12, 12))
                    for t in ("r8/k5e4s|k3e6", "r12/k5e4s|k3e6"))
    assert small[0].kind == "Resize" and small[0].signature != large[0].signature
    assert small[1].input_shape == (1, 8, 8) and large[1].input_shape == (1, 12, 12)
