"""The one training loop (core.training.run_steps): steps, epochs, the non-finite-loss rule,
and every trainer (train, supernet, DARTS, si-evolution) running through it."""

from __future__ import annotations

import math
import random

import pytest
import torch

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError, TrialFailure
from frugalnas.engine.training import TrainConfig, run_steps, train
from frugalnas.sievo.session import SievoSession
from frugalnas.spaces.dag.space import DagSpace
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.weight_sharing.darts import darts_search
from frugalnas.weight_sharing.supernet import Supernet


def _data(n: int = 40, poison: bool = False) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    if poison:
        x[:] = float("inf")
    y = torch.randint(0, 3, (n,), generator=g)
    return Dataset("tiny", x, y, x[:10].clone(), y[:10].clone(), num_classes=3)


def _batches(epoch_sizes: list[int]):
    def batches(epoch: int):
        return [(torch.zeros(1), torch.zeros(1))] * epoch_sizes[epoch]
    return batches


def test_run_steps_counts_steps_from_first_step_and_reports_only_full_epochs():
    seen, epochs = [], []
    report = run_steps(_batches([4, 4, 4, 4]), lambda i, x, y: (seen.append(i), 1.0 + i)[1],
                       total_steps=6, steps_per_epoch=4, first_step=8, first_epoch=2,
                       on_epoch=lambda e, losses: epochs.append((e, list(losses))))
    assert seen == [8, 9, 10, 11, 12, 13]
    assert epochs == [(2, [9.0, 10.0, 11.0, 12.0])]  # epoch 3 ran 2 of its 4 batches
    assert report.steps == 6 and report.epochs == 1.5 and len(report.losses) == 6
    assert report.mean_loss(last=2) == 13.5


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_fails_the_trial_naming_the_trainer_and_step(bad):
    with pytest.raises(TrialFailure, match=r"non-finite supernet one-shot loss .* at step 3"):
        run_steps(_batches([5]), lambda i, x, y: bad if i == 3 else 1.0, total_steps=5,
                  steps_per_epoch=5, what="supernet one-shot")


def test_an_epoch_without_batches_is_an_error_not_an_endless_loop():
    with pytest.raises(ConfigError, match="epoch 0 has no training batch"):
        run_steps(_batches([0]), lambda i, x, y: 1.0, total_steps=1, steps_per_epoch=1)


def _nb201() -> NB201Space:
    return NB201Space(N=1, C=4)


def test_every_trainer_fails_on_a_non_finite_loss():
    """One rule: train, the supernet, DARTS and si-evolution's sampled training (which used
    to drop such losses silently) all raise TrialFailure."""
    data, backend = _data(poison=True), SingleDeviceBackend("cpu")
    space = _nb201()
    model = backend.prepare(space.build(space.sample(random.Random(0)), 3, (1, 8, 8)))
    cfg = TrainConfig(epochs=1, batch_size=16)
    with pytest.raises(TrialFailure, match="non-finite training loss"):
        train(model, data, backend, cfg)
    supernet = Supernet(space, 3, (1, 8, 8))
    with pytest.raises(TrialFailure, match="non-finite supernet one-shot loss"):
        supernet.train(data, backend, cfg, epochs=1)
    with pytest.raises(TrialFailure, match="non-finite DARTS loss"):
        darts_search(space, data, backend, epochs=1, batch_size=16)
    dag = DagSpace(nodes=2, channels=4, reductions=1)
    session = SievoSession(dag, data, None)
    population = [dag.sample(random.Random(i)) for i in range(2)]
    with pytest.raises(TrialFailure, match="non-finite sampled training loss"):
        session.train(population, data, backend, generation=0, batches=3, batch_size=16,
                      lr=0.05, momentum=0.9, weight_decay=0.0)


def test_sampled_training_reports_steps_flops_and_its_recent_loss():
    data, backend = _data(), SingleDeviceBackend("cpu")
    dag = DagSpace(nodes=2, channels=4, reductions=1)
    session = SievoSession(dag, data, None)
    population = [dag.sample(random.Random(i)) for i in range(2)]
    report = session.train(population, data, backend, generation=0, batches=5, batch_size=16,
                           lr=0.05, momentum=0.9, weight_decay=0.0)
    assert report.steps == 5 and len(report.losses) == 5 and report.flops > 0
    assert math.isfinite(report.mean_loss(last=20)) and session.trained_generation == 0


def test_supernet_epochs_are_reported_once_and_not_trained_again():
    data, backend = _data(), SingleDeviceBackend("cpu")
    cfg = TrainConfig(batch_size=16, lr=0.05)
    supernet = Supernet(_nb201(), 3, (1, 8, 8), seed=1)
    seen: list[int] = []
    supernet.train(data, backend, cfg, epochs=2, on_epoch=lambda e, loss: seen.append(e))
    before = [p.detach().clone() for p in supernet.stores[0].parameters()]
    supernet.train(data, backend, cfg, epochs=2, on_epoch=lambda e, loss: seen.append(e))
    assert seen == [1, 2] and supernet.history.one_shot_epochs == 2
    assert all(torch.equal(a, b) for a, b in zip(before, supernet.stores[0].parameters()))


# -- the loop without a host read per step --------------------------------------------------
def test_losses_returned_as_tensors_are_read_in_groups_and_a_bad_one_is_still_named():
    """Tensor losses are read every ``read_every`` steps: a NaN at step 5 stops the loop at
    the first read after it (step 7 with groups of 4), naming step 5."""
    seen = []

    def step(i, x, y):
        seen.append(i)
        return torch.tensor(float("nan") if i == 5 else 1.0 + i)

    with pytest.raises(TrialFailure, match=r"non-finite training loss nan at step 5$"):
        run_steps(_batches([20]), step, total_steps=20, steps_per_epoch=20, read_every=4)
    assert seen == list(range(8))


def test_tensor_and_float_losses_give_the_same_report_and_callbacks():
    def run(as_tensor: bool):
        calls, epochs = [], []
        report = run_steps(
            _batches([6, 6]),
            lambda i, x, y: torch.tensor(0.5 * i) if as_tensor else 0.5 * i,
            total_steps=12, steps_per_epoch=6, read_every=5,
            every=(4, lambda done, mean: calls.append((done, mean))),
            on_epoch=lambda e, losses: epochs.append((e, list(losses))))
        return report.losses, calls, epochs

    assert run(True) == run(False)
    losses, calls, epochs = run(True)
    assert losses == [0.5 * i for i in range(12)]
    assert calls == [(4, 0.75), (8, 2.75), (12, 4.75)]
    assert [e for e, _ in epochs] == [0, 1]


def test_the_shared_loop_trains_exactly_as_a_hand_written_loop():
    """train() on the single-device backend: the same losses, bitwise, as the plain PyTorch
    loop (same order, optimiser and schedule) that reads its losses only at the end."""
    from frugalnas.engine.training import make_optimizer
    from frugalnas.ports.data import epoch_order

    data, cfg = _data(n=48), TrainConfig(epochs=3, batch_size=8)

    def net():
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 3))

    shared = train(net(), data, SingleDeviceBackend("cpu"), cfg).losses
    model, losses = net(), []
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=18)
    for epoch in range(3):
        order = epoch_order(48, True, 0, epoch)
        for start in range(0, 48, 8):
            idx = order[start:start + 8]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.detach())
    assert shared == torch.stack(losses).tolist()


def test_a_network_is_put_in_train_mode_once_and_again_after_an_evaluation():
    from frugalnas.engine.training import backend_step

    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Dropout(0.1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    original = torch.nn.Module.train

    def counting(self, mode=True):
        if mode:
            calls.append(type(self).__name__)
        return original(self, mode)

    step = backend_step(SingleDeviceBackend("cpu"), lambda i: (model, optimizer))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    torch.nn.Module.train = counting
    try:
        model.eval()
        for i in range(3):
            step(i, x, y)
        assert model.training and calls.count("Sequential") == 1
        model.eval()  # an evaluation between steps
        step(3, x, y)
        assert model.training and all(m.training for m in model)
        assert calls.count("Sequential") == 2
    finally:
        torch.nn.Module.train = original


def test_batches_pass_unchanged_to_a_cpu_backend():
    batches = [(torch.full((2, 3), float(i)), torch.tensor([i, i])) for i in range(3)]
    moved = list(SingleDeviceBackend("cpu").device_batches(iter(batches)))
    assert all(a is c and b is d for (a, b), (c, d) in zip(moved, batches))


# -- accelerations ---------------------------------------------------------------------------
def _conv_net():
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(256, 3))


def test_bf16_and_channels_last_train_close_to_float32_and_bf16_is_not_bitwise():
    data, cfg = _data(n=32), dict(epochs=2, batch_size=8)
    backend = SingleDeviceBackend("cpu")
    fp32 = train(_conv_net(), data, backend, TrainConfig(**cfg)).losses
    bf16 = train(_conv_net(), data, backend, TrainConfig(precision="bf16", **cfg)).losses
    last = train(_conv_net(), data, backend, TrainConfig(channels_last=True, **cfg)).losses
    assert bf16 != fp32 and all(math.isfinite(v) for v in bf16)
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.1
    assert max(abs(a - b) for a, b in zip(fp32, last)) < 1e-4


def test_an_acceleration_the_backend_does_not_declare_is_refused_in_one_line():
    from frugalnas.backends.out_of_core.backend import OutOfCoreBackend

    with pytest.raises(ConfigError, match=r"backend 'out-of-core' cannot train with bf16, "
                                          r"compile; valid with it: none"):
        train(_conv_net(), _data(), OutOfCoreBackend(device="cpu"),
              TrainConfig(precision="bf16", compile=True))


@pytest.mark.parametrize("field, value, message", [
    ("precision", "fp16", r"invalid precision 'fp16'; valid: .*fp32.*bf16"),
    ("compile", "yes", r"invalid compile 'yes'; valid: true, false")])
def test_bad_acceleration_options_name_the_value_and_the_choices(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value})


@pytest.mark.slow
def test_a_compiled_forward_trains_like_the_eager_one():
    data, cfg = _data(n=32), dict(epochs=1, batch_size=8)
    backend = SingleDeviceBackend("cpu")
    eager = train(_conv_net(), data, backend, TrainConfig(**cfg)).losses
    compiled = train(_conv_net(), data, backend, TrainConfig(compile=True, **cfg)).losses
    assert max(abs(a - b) for a, b in zip(eager, compiled)) < 1e-4
