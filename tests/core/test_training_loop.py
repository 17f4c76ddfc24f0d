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
