"""The hardware backends on transformer language models: the out-of-core backend plans and
trains a ``gpt`` network per transformer block under a budget, bitwise as in-core; virtual
nodes train it bitwise alike on one or two processes; studies over ``gpt`` + ``text`` run
through either backend."""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest
import torch

import frugalnas
from frugalnas.backends.out_of_core.backend import OutOfCoreBackend, find_blocks
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.nn.transformer import DenseGPT
from frugalnas.ports.network import BlockNetwork
from frugalnas.ports.task import LANGUAGE_MODELLING
from frugalnas.spaces.gpt.space import GPTSpace
from frugalnas.testing.setups import SMALL_GPT
from ops_support.text_corpus import pseudo_verse

pytestmark = pytest.mark.usefixtures("one_thread")

ARCH = "gpt:w32/h2r4,h1r2"          # the largest width, two layers: embedding, 2 blocks, output
STAGES = ["embedding", "blocks.0", "blocks.1", "output"]
VOCAB, CONTEXT = 64, 16
OFF = {"disable_plugins": ("mlflow", "progress")}


def gpt(arch: str = ARCH) -> DenseGPT:
    space = GPTSpace(**SMALL_GPT)
    torch.manual_seed(0)
    net = space.build(space.parse(arch), VOCAB, (CONTEXT,))
    assert isinstance(net, DenseGPT)
    return net


def tokens(step: int, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next tokens), int64 (n, CONTEXT), as the text dataset gives them."""
    g = torch.Generator().manual_seed(1000 + step)
    seq = torch.randint(0, VOCAB, (n, CONTEXT + 1), generator=g)
    return seq[:, :-1], seq[:, 1:]


def train(backend, model: torch.nn.Module, steps: int = 3) -> tuple[dict, list[float]]:
    model = backend.prepare(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = [backend.train_step(model, opt, LANGUAGE_MODELLING, *tokens(s), s)
                  for s in range(steps)]
    return model.state_dict(), losses


def assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


# -- the network's blocks ------------------------------------------------------------------------
def test_a_gpt_network_lists_embedding_blocks_and_output_and_keeps_its_keys():
    net = gpt()
    assert isinstance(net, BlockNetwork)
    assert [name for name, _ in find_blocks(net)] == STAGES
    assert list(net.forward_blocks()) == [net.embedding, *net.blocks, net.output]
    # the stages own no parameters: the keys are those of the plain decoder
    assert {k.split(".")[0] for k in net.state_dict()} == {"tok", "pos", "blocks", "norm", "head"}
    x, _ = tokens(0)
    manual = net.head(net.norm(net.blocks[1](net.blocks[0](
        net.tok(x) + net.pos(torch.arange(CONTEXT))))))
    assert torch.equal(net(x), manual)
    for clone in (copy.deepcopy(net), torch.load(io.BytesIO(_saved(net)), weights_only=False)):
        assert clone.embedding.parts == (clone.tok, clone.pos)       # the clone's own modules
        assert clone.output.parts == (clone.norm, clone.head)
        assert torch.equal(clone(x), net(x))
    net.head = torch.nn.Linear(32, VOCAB, bias=False)                # stages follow a new part
    assert net.output.parts[1] is net.head


def _saved(model: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


# -- out-of-core ---------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["resident", "swap", "recompute", "plan"])
def test_out_of_core_trains_a_gpt_bitwise_as_in_core(policy):
    """Token inputs (int64), (N, T, V) logits and the task's loss through every policy: the
    losses and the weights after three Adam steps are those of in-core training."""
    net = gpt()
    reference = train(SingleDeviceBackend("cpu"), copy.deepcopy(net))
    backend = OutOfCoreBackend(device="cpu", policy=policy, budget_fraction=0.7,
                               profile_repeats=0)
    state, losses = train(backend, copy.deepcopy(net))
    assert losses == reference[1]
    assert_bitwise(state, reference[0])
    plan = backend.last_plan
    assert [b.name for b in plan.profile.blocks] == STAGES
    if policy != "plan":
        assert plan.policies == [policy] * len(STAGES)
    assert 0 < backend.max_step_peak <= plan.peak       # the cost model is an upper bound
    backend.close()


def test_out_of_core_plans_per_transformer_block_under_a_budget():
    net = gpt()
    x, y = tokens(0)
    backend = OutOfCoreBackend(device="cpu", budget_fraction=0.7, profile_repeats=0)
    model = backend.prepare(copy.deepcopy(net))
    backend.forward_backward(model, LANGUAGE_MODELLING, x, y)
    plan = backend.last_plan
    assert plan.method == "exact" and plan.feasible, plan.table()
    assert plan.budget == int(0.7 * plan.profile.incore_peak)
    assert set(plan.policies) != {"resident"}           # in-core does not fit the budget
    assert 0 < backend.max_step_peak <= plan.peak <= plan.budget < plan.profile.incore_peak
    table = plan.table()
    assert all(name in table for name in STAGES)
    blocks = [b for b in plan.profile.blocks if b.name.startswith("blocks.")]
    # a transformer block saves far more than it takes in (its input is what recompute keeps)
    assert all(b.saved > 4 * b.input for b in blocks)
    # everything the network computes is in a stage; after the last one, the loss saves its
    # (N*T, V) log-probabilities, freed before any stage's backward: the plan counts them
    # at the end of forward only
    assert plan.profile.fixed == 0 and plan.profile.tail >= 8 * CONTEXT * VOCAB * 4


def test_a_deep_gpt_is_planned_greedily_block_by_block_and_trains_as_in_core():
    space = GPTSpace(**{**SMALL_GPT, "max_depth": 9})
    torch.manual_seed(0)
    net = space.build(space.parse("gpt:w32/" + ",".join(["h2r4", "h1r2", "h2r2"] * 3)),
                      VOCAB, (CONTEXT,))
    reference = train(SingleDeviceBackend("cpu"), copy.deepcopy(net), steps=2)
    backend = OutOfCoreBackend(device="cpu", budget_fraction=0.4, profile_repeats=0)
    state, losses = train(backend, copy.deepcopy(net), steps=2)
    plan = backend.last_plan
    assert plan.method == "greedy" and plan.feasible, plan.table()
    assert [b.name for b in plan.profile.blocks] == (
        ["embedding"] + [f"blocks.{i}" for i in range(9)] + ["output"])
    assert plan.policies.count("resident") < 11
    assert 0 < backend.max_step_peak <= plan.peak <= plan.budget
    assert losses == reference[1]
    assert_bitwise(state, reference[0])


def test_swapping_copies_each_saved_storage_once():
    """A block's query, key and value projections save the same normalised input: the swap
    moves it once, so what comes back equals the block's profiled saved bytes."""
    net = gpt()
    backend = OutOfCoreBackend(device="cpu", policy="swap", profile_repeats=0)
    model = backend.prepare(copy.deepcopy(net))
    backend.forward_backward(model, LANGUAGE_MODELLING, *tokens(0))
    prof = backend.last_plan.profile
    # on the device: the loss's saved tensors at the end of forward, then one block's
    # activations at a time, fetched back for its backward, byte for byte as profiled
    assert backend.max_step_peak == max(prof.tail, *(b.saved for b in prof.blocks))
    assert backend.max_step_peak <= backend.last_plan.peak


# -- virtual nodes -------------------------------------------------------------------------------
def test_virtual_nodes_train_a_gpt_bitwise_on_one_and_two_processes():
    """Four virtual nodes over 10 sequences (3, 3, 2, 2 each: the loss is a mean over the
    tokens, and every sequence has as many): the same losses and weights bit for bit on one
    process, on two, and on two with an uneven split of the nodes."""
    net = gpt()

    def run(**options) -> tuple[dict, list[float]]:
        backend = VirtualNodeBackend(virtual_nodes=4, device="cpu", **options)
        try:
            model = backend.prepare(copy.deepcopy(net))
            opt = torch.optim.Adam(model.parameters(), lr=3e-3)
            losses = [backend.train_step(model, opt, LANGUAGE_MODELLING, *tokens(s, n=10), s)
                      for s in range(3)]
            return model.state_dict(), losses
        finally:
            backend.close()

    one = run(nproc=1)
    for options in ({"nproc": 2}, {"nproc": 2, "shares": [3, 1]}):
        other = run(**options)
        assert other[1] == one[1]
        assert_bitwise(other[0], one[0])
    # the nodes' losses weighted by their sequences make the mean over the batch's tokens
    whole = LANGUAGE_MODELLING(net(tokens(0, n=10)[0]), tokens(0, n=10)[1]).item()
    assert math.isclose(one[1][0], whole, rel_tol=1e-6)


# -- studies over gpt + text ---------------------------------------------------------------------
@pytest.fixture
def corpus(tmp_path):
    """Four small documents of seeded pseudo-verse."""
    return pseudo_verse(tmp_path / "corpus", works=4, lines=120)


def _study(corpus, backend: str, options: dict, max_steps: int = 20):
    return frugalnas.create_study(
        space="gpt", space_options=SMALL_GPT, estimator="train",
        estimator_options={"max_steps": max_steps, "batch_size": 16, "optimizer": "adam",
                           "lr": 3e-3},
        dataset="text", dataset_options={"path": str(corpus), "context": CONTEXT},
        direction="minimize", backend=backend, backend_options=options, seed=0, **OFF)


def test_a_gpt_study_on_text_trains_through_out_of_core(corpus):
    study = _study(corpus, "out-of-core", {"budget_fraction": 0.7, "profile_repeats": 0})
    study.optimize(n_trials=2)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 2
    for trial in done:
        assert 0 < trial.values[0] < math.log(256)
        metrics = trial.user_attrs["metrics"]
        assert metrics["ooc_plan_feasible"] == 1.0
        assert metrics["ooc_swapped_layers"] + metrics["ooc_recomputed_layers"] >= 1
        assert 0 < metrics["ooc_measured_peak_bytes"] <= metrics["ooc_budget_bytes"]
    blocks = study.backend.last_plan.profile.blocks
    assert blocks[0].name == "embedding" and blocks[-1].name == "output"


@pytest.mark.slow
def test_a_gpt_study_on_text_through_virtual_nodes_is_the_same_on_one_and_two_processes(corpus):
    studies = {}
    for nproc in (2, 1):
        study = _study(corpus, "virtual-node", {"virtual_nodes": 4, "nproc": nproc})
        study.optimize(n_trials=2)
        assert all(t.state.name == "COMPLETE" for t in study.trials)
        assert study.trials[0].user_attrs["metrics"]["vnode_nproc"] == nproc
        studies[nproc] = study
    for a, b in zip(studies[1].trials, studies[2].trials):
        assert a.params == b.params
        assert a.values == b.values                       # bitwise: the same float


@pytest.mark.slow
def test_virtual_nodes_over_out_of_core_on_two_processes_match_in_core_on_one():
    """Each process plans its nodes' micro-batches under the budget; the weights after three
    steps are those of one process training in-core."""
    from frugalnas.host.plugins import PluginHost

    net = gpt()
    states = []
    for nproc, inner, options in ((1, "single-device", {}),
                                  (2, "out-of-core", {"budget_fraction": 0.7,
                                                      "profile_repeats": 0})):
        backend = VirtualNodeBackend(virtual_nodes=4, nproc=nproc, inner=inner,
                                     inner_options=options, device="cpu", host=PluginHost())
        try:
            model = backend.prepare(copy.deepcopy(net))
            opt = torch.optim.Adam(model.parameters(), lr=3e-3)
            losses = [backend.train_step(model, opt, LANGUAGE_MODELLING, *tokens(s, n=10), s)
                      for s in range(3)]
            states.append((model.state_dict(), losses))
            if inner == "out-of-core":
                plan = backend.inner.last_plan
                assert plan is not None and plan.feasible and len(plan.policies) == 4
        finally:
            backend.close()
    assert states[0][1] == states[1][1]
    assert_bitwise(states[0][0], states[1][0])
