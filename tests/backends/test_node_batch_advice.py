"""Virtual nodes say, at their first step, the per-node batch below which they cost
throughput on this device, measured without changing the training."""

from __future__ import annotations

import torch
from torch import nn

from frugalnas.backends.virtual_node.advice import NodeBatchAdvice
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend


def _problem():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Dropout(0.2), nn.Flatten(), nn.Linear(8 * 8 * 8, 4))
    return net, torch.randn(64, 3, 8, 8), torch.randint(0, 4, (64,))


def _train(backend, net, x, y, steps=3):
    model = backend.prepare(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = [float(backend.train_step(model, optimizer, nn.functional.cross_entropy, x, y, i))
              for i in range(steps)]
    return losses, model.state_dict()


def test_the_first_step_prints_the_node_batch_line_once_and_leaves_no_trace(capsys):
    net, x, y = _problem()
    backend = VirtualNodeBackend(virtual_nodes=8, device="cpu")
    losses, state = _train(backend, net, x, y)
    err = capsys.readouterr().err
    assert err.count("frugalnas: virtual nodes: 8 nodes of 8 examples (batch 64) run at ") == 1
    advice = backend.advice
    assert sorted(advice.speeds) == [8, 16, 32, 64] and advice.per_node == 8
    assert backend.describe()["node_batch_advice"] == advice.text()
    # the same training without the measurement: a backend that already has its advice
    net2, _, _ = _problem()
    again = VirtualNodeBackend(virtual_nodes=8, device="cpu")
    again.advice = advice
    losses2, state2 = _train(again, net2, x, y)
    assert losses == losses2
    assert all(torch.equal(state[k], state2[k]) for k in state)


def test_the_line_names_the_threshold_from_the_speeds():
    slow_small = NodeBatchAdvice(8, 256, "cpu", {32: 100.0, 64: 180.0, 128: 240.0, 256: 250.0})
    assert slow_small.threshold == 128 and slow_small.relative == 0.4
    assert "below 128 examples per node virtual nodes cost more than 10% of the throughput" \
        in slow_small.text()
    fine = NodeBatchAdvice(2, 256, "cuda:0", {128: 240.0, 256: 250.0})
    assert fine.text().endswith("nodes of 128 or more examples keep within 10% of it")
