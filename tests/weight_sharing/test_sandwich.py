"""The sandwich rule with in-place distillation: which networks a step trains, that the
students learn from the teacher and not the reverse, that it trains through any backend, and
the refusals where a space has no largest and smallest network."""

import math

import pytest
import torch
import torch.nn.functional as F

from frugalnas.ports.capabilities import SandwichRule, capability
import frugalnas
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.ports.errors import ConfigError
from frugalnas.engine.training import TrainConfig
from frugalnas.datasets.images import synthetic
from frugalnas.spaces.mobilenet.space import MobileNetSpace
from frugalnas.weight_sharing.sandwich import SandwichNetwork, sandwich_loss
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet

SMALL = {"width_mult": 0.25, "stages": [[16, 3, 2], [24, 2, 1]], "head_channels": 32}
DATA = {"n": 96, "num_classes": 4, "channels": 1, "size": 12}


class RecordingBackend(SingleDeviceBackend):
    """The single-device backend, keeping the networks each step trained."""

    def __init__(self):
        super().__init__("cpu")
        self.steps: list[list[str]] = []

    def train_step(self, model, optimizer, loss_fn, inputs, targets, step):
        nets = model.networks if isinstance(model, SandwichNetwork) else [model]
        self.steps.append([repr(n) for n in nets])
        return super().train_step(model, optimizer, loss_fn, inputs, targets, step)


def test_the_students_learn_the_teachers_predictions_and_not_the_reverse():
    torch.manual_seed(0)
    teacher = torch.randn(5, 3, requires_grad=True)
    student = torch.randn(5, 3, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0, 1])
    loss = sandwich_loss(torch.stack([teacher, student], 1), y)
    expected = (F.cross_entropy(teacher, y) + F.cross_entropy(student, F.softmax(teacher, 1))) / 2
    assert torch.allclose(loss, expected)
    loss.backward()
    alone = teacher.detach().clone().requires_grad_(True)
    (F.cross_entropy(alone, y) / 2).backward()
    assert torch.equal(teacher.grad, alone.grad)   # no gradient from the student's term
    # a student that already predicts the teacher's distribution is at its minimum
    s = teacher.detach().clone().requires_grad_(True)
    sandwich_loss(torch.stack([teacher.detach(), s], 1), y).backward()
    assert s.grad.abs().max() < 1e-6


def test_each_step_trains_the_largest_the_smallest_and_drawn_networks():
    space = MobileNetSpace(**SMALL, resolutions=[8, 12])
    data = synthetic(**DATA)
    backend = RecordingBackend()
    supernet = Supernet(space, 4, data.input_shape, sandwich=2)
    before = {k: v.clone() for k, v in supernet.stores[0].state_dict().items()}
    supernet.train(data, backend, TrainConfig(batch_size=32), epochs=1)
    largest, smallest = capability(space, SandwichRule).sandwich_bounds()
    assert str(largest) == "mobilenet:r12/k7e6s,k7e6s,k7e6s|k7e6s,k7e6s"
    assert str(smallest) == "mobilenet:r8/k3e3|k3e3"
    first = [repr(supernet.subnet(a)) for a in (largest, smallest)]
    assert len(backend.steps) == math.ceil(data.num_examples("train") / 32) >= 2
    for nets in backend.steps:
        assert len(nets) == 3 and nets[:2] == first
    assert len({s[2] for s in backend.steps}) > 1   # the third is drawn anew each step
    after = supernet.stores[0].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert supernet.describe()["sandwich"] == 2


def test_under_progressive_shrinking_the_students_come_from_the_phase():
    space = MobileNetSpace(**SMALL)
    data = synthetic(**DATA)
    backend = RecordingBackend()
    supernet = Supernet(space, 4, data.input_shape, progressive=True, sandwich=1)
    supernet.train(data, backend, TrainConfig(batch_size=32), epochs=4)
    # phase 1 (the largest alone) has no student; the later phases one each
    per_epoch = math.ceil(data.num_examples("train") / 32)
    assert [len(s) for s in backend.steps] == [1] * per_epoch + [2] * (3 * per_epoch)
    largest = repr(supernet.subnet(space.largest()))
    assert all(s[0] == largest for s in backend.steps)


def test_a_sandwich_step_splits_over_virtual_nodes_like_any_step():
    """Virtual nodes split the batch; each node's soft labels come from its own slice of the
    teacher's logits, so the accumulated gradient equals one step on the whole batch."""
    space = MobileNetSpace(**SMALL)
    data = synthetic(**DATA)
    x, y = data.split("train")
    x, y = x[:16], y[:16]
    grads = []
    for backend in (SingleDeviceBackend("cpu"), VirtualNodeBackend(virtual_nodes=4)):
        supernet = Supernet(space, 4, data.input_shape, seed=0, sandwich=1)
        net = SandwichNetwork([supernet.subnet(a) for a in
                                       capability(space, SandwichRule).sandwich_bounds()])
        net.eval()   # batch statistics would differ between a slice and the whole batch
        backend.forward_backward(net, sandwich_loss, x, y)
        grads.append(torch.cat([p.grad.flatten() for p in supernet.stores[0].parameters()
                                if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_sandwich_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match="sandwich needs a search space with the sandwich "
                                          "rule.*'nb201' has none"):
        frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                               estimator="supernet", estimator_options={"sandwich": 2},
                               dataset="synthetic", dataset_options=DATA)
    with pytest.raises(ConfigError, match="invalid sandwich -1"):
        frugalnas.create_study(space="mobilenet", space_options=SMALL, estimator="supernet",
                               estimator_options={"sandwich": -1}, dataset="synthetic",
                               dataset_options=DATA)
    space = MobileNetSpace(**SMALL)
    with pytest.raises(ConfigError, match="does not combine with a few-shot split"):
        Supernet(space, 4, (1, 12, 12), sandwich=1,
                 few_shot=FewShotSplit.create(space, ["stage1_block0_kernel"], 2))


def test_a_study_scores_candidates_on_a_sandwich_trained_supernet():
    study = frugalnas.create_study(
        space="mobilenet", space_options=SMALL, estimator="supernet",
        estimator_options={"epochs": 1, "batch_size": 32, "bn_batches": 1, "sandwich": 2},
        dataset="synthetic", dataset_options=DATA, seed=0,
        disable_plugins=("mlflow", "progress"))
    study.optimize(n_trials=3)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and all(0.0 <= t.values[0] <= 100.0 for t in done)
