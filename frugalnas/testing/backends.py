"""Conformance checks for backends (:class:`frugalnas.Backend`)."""

from __future__ import annotations

import math
from typing import Any

from frugalnas.ports.backend import Backend
from frugalnas.testing._suite import Suite, describe, is_number


def _tiny_problem(seed: int) -> tuple[Any, Any, Any]:
    """A small convolutional network (with batch norm) and one fixed batch it can fit."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, 3, 6, 6, generator=g)
    y = torch.randint(0, 3, (12,), generator=g)
    return model, x, y


class BackendChecks(Suite):
    """The backend contract: a ``torch.device``; ``prepare`` returns the model to train;
    ``train_step`` returns the finite mean loss and a few steps on one batch reduce it;
    ``forward_backward`` accumulates gradients; ``predict`` returns CPU logits of shape
    ``(n, classes)`` whatever its ``batch_size``, leaving the training mode as it was;
    ``peak_memory()`` is an int; ``trial_outputs()`` is ``(metrics, artifacts)`` and forgets
    what it returned; the backend trains again after ``release()``; ``close()`` works."""

    kind = "backends"
    checks = ("check_device", "check_training_reduces_loss", "check_forward_backward",
              "check_predict", "check_peak_memory", "check_trial_outputs", "check_release")

    def __init__(self, backend: Any, *, name: str | None = None, seed: int = 0, steps: int = 6,
                 close: bool = True):
        self.backend, self.seed, self.steps, self.close_after = backend, seed, steps, close
        self.subject = describe("backend", backend, name)

    _closed = False

    def teardown(self) -> None:
        if self.close_after and not self._closed:
            self._closed = True
            self.backend.close()

    def _train(self, steps: int | None = None) -> list[float]:
        import torch
        from torch import nn

        model, x, y = _tiny_problem(self.seed)
        model = self.backend.prepare(model)
        if not isinstance(model, nn.Module):
            self.fail(f"prepare() returned {type(model).__name__}, not a torch.nn.Module")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        losses = []
        for step in range(steps or self.steps):
            loss = self.backend.train_step(model, optimizer, nn.functional.cross_entropy, x, y,
                                           step)
            value = step_loss_value(loss)
            if value is None or not math.isfinite(value):
                self.fail(f"train_step() returned {loss!r} at step {step}; expected the finite "
                          "mean loss as a float or a 0-d tensor")
            losses.append(float(loss))
        return losses

    # -- checks --------------------------------------------------------------------------
    def check_device(self) -> None:
        import torch

        if not isinstance(self.backend, Backend):
            self.fail(f"{type(self.backend).__name__} does not subclass frugalnas.Backend")
        if not isinstance(self.backend.device, torch.device):
            self.fail(f"device is {self.backend.device!r}; expected a torch.device")
        info = self.backend.describe()
        if not isinstance(info, dict):
            self.fail(f"describe() returned {info!r}; expected a dict")

    def check_training_reduces_loss(self) -> None:
        losses = self._train()
        if not losses[-1] < losses[0]:
            self.fail(f"{len(losses)} train_step() calls on one batch did not reduce the loss "
                      f"({', '.join(f'{v:.4f}' for v in losses)}); does it step the optimizer?")

    def check_forward_backward(self) -> None:
        import torch
        from torch import nn

        model, x, y = _tiny_problem(self.seed)
        model = self.backend.prepare(model)
        model.zero_grad(set_to_none=True)
        loss = step_loss_value(self.backend.forward_backward(model, nn.functional.cross_entropy,
                                                             x, y))
        if loss is None or not math.isfinite(loss):
            self.fail(f"forward_backward() returned {loss!r}; expected the finite mean loss")
        grads = [p.grad for p in model.parameters()]
        if any(g is None for g in grads) or not any(bool(g.abs().sum() > 0) for g in grads):
            self.fail("forward_backward() left parameters without gradients")
        first = [g.detach().clone() for g in grads]
        self.backend.forward_backward(model, nn.functional.cross_entropy, x, y)
        for g0, p in zip(first, model.parameters()):
            if not torch.allclose(p.grad, 2 * g0, rtol=1e-4, atol=1e-6):
                self.fail("a second forward_backward() did not add its gradients to .grad "
                          "(gradients must accumulate)")
                break

    def check_predict(self) -> None:
        import torch

        model, x, _ = _tiny_problem(self.seed)
        model = self.backend.prepare(model)
        model.train()
        full = self.backend.predict(model, x)
        if not isinstance(full, torch.Tensor) or tuple(full.shape) != (len(x), 3):
            got = tuple(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
            self.fail(f"predict() of {len(x)} inputs gave {got}; expected logits of shape "
                      f"({len(x)}, 3)")
        if full.device.type != "cpu":
            self.fail(f"predict() returned logits on {full.device}; expected the CPU")
        if not model.training:
            self.fail("predict() left the model in evaluation mode; restore its training mode")
        parts = self.backend.predict(model, x, batch_size=5)
        if not torch.allclose(parts, full, rtol=1e-4, atol=1e-5):
            self.fail("predict() with batch_size=5 differs from one batch: evaluation must not "
                      "depend on the batch size (evaluation mode)")

    def check_peak_memory(self) -> None:
        self.backend.reset_peak_memory()
        self._train(steps=1)
        peak = self.backend.peak_memory()
        if not isinstance(peak, int) or isinstance(peak, bool) or peak < 0:
            self.fail(f"peak_memory() returned {peak!r}; expected an int >= 0 (bytes)")

    def check_trial_outputs(self) -> None:
        self._train(steps=1)
        out = self.backend.trial_outputs()
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, dict)
                                                                 for o in out)):
            self.fail(f"trial_outputs() returned {out!r}; expected a tuple (metrics, artifacts) "
                      "of two dicts")
        metrics, artifacts = out
        for k, v in metrics.items():
            if not isinstance(k, str) or not is_number(v):
                self.fail(f"trial_outputs() metric {k!r}={v!r}; metrics map names to numbers")
        for k, v in artifacts.items():
            if not isinstance(k, str) or not isinstance(v, (str, bytes)):
                self.fail(f"trial_outputs() artifact {k!r} is {type(v).__name__}; artifacts map "
                          "file names to str or bytes")
        again = self.backend.trial_outputs()
        if again != ({}, {}):
            self.fail(f"a second trial_outputs() returned {again!r}; a backend forgets what it "
                      "returned")

    def check_release(self) -> None:
        self._train(steps=1)
        self.backend.release()
        losses = self._train(steps=2)
        if not losses:
            self.fail("the backend did not train after release()")
        if self.close_after:
            self._closed = True
            self.backend.close()


def check_backend(backend: Any, *, seed: int = 0, steps: int = 6, close: bool = True,
                  checks: list[str] | None = None) -> list[str]:
    """Run the backend checks on ``backend`` with a tiny network and batch (CPU-sized);
    returns the names of the checks run, raises :class:`~frugalnas.testing.ConformanceError`
    at the first broken rule. ``close()`` is called at the end unless ``close=False``."""
    return BackendChecks(backend, seed=seed, steps=steps, close=close).run(checks)


def step_loss_value(loss: Any) -> float | None:
    """A step's loss as the port allows it (a float, or a 0-d tensor), as a float; ``None``
    for anything else."""
    import torch

    if isinstance(loss, torch.Tensor):
        return float(loss) if loss.dim() == 0 and loss.is_floating_point() else None
    return float(loss) if is_number(loss) else None
