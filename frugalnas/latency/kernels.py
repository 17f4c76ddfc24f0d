"""The kernels a network runs: its leaf layers, grouped the way an inference runtime fuses them.

An exported network does not run a batch norm or an activation after a convolution as an
operator of its own: the export folds the batch norm into the convolution's weights and
ONNX Runtime fuses the activation into it. Timing those layers alone (each a separate call
with its own per-call overhead) overstates them, so, after nn-Meter (Zhang et al., MobiSys
2021), a network is split into *kernels*: a layer with weights (convolution, linear) together
with the batch norms and activations that take its output directly, as one unit that is
measured as one module. The grouping follows the data: a layer joins the kernel before it
only when its input is that kernel's output tensor, so a batch norm or activation that runs
on a residual sum starts a kernel of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Leaf layers that join the kernel whose output they take (folded or fused by the runtime).
FUSED_KINDS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "ReLU", "ReLU6", "LeakyReLU",
               "Hardswish", "Hardsigmoid", "Sigmoid", "SiLU", "Tanh", "GELU", "Mish",
               "Identity")


@dataclass
class Kernel:
    """Consecutive leaf layers that run as one operator: their signatures, the modules, and
    the input shape (without the batch axis)."""

    modules: list[Any]
    signatures: list[str]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...] = ()
    _output: object = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """The class names of its layers joined with ``+`` (``Conv2d+BatchNorm2d+ReLU``)."""
        return "+".join(type(m).__name__ for m in self.modules)

    @property
    def signature(self) -> str:
        """Each layer's full configuration (its repr) and the input shape: a table key."""
        return " + ".join(self.signatures) + f"@{self.input_shape}"

    def module(self) -> object:
        """A copy of the kernel's layers as one module, to measure alone."""
        import copy

        from torch import nn

        layers = [copy.deepcopy(m) for m in self.modules]
        return layers[0] if len(layers) == 1 else nn.Sequential(*layers)


def network_kernels(model: object, input_shape: Sequence[int]) -> list[Kernel]:
    """The kernels of ``model`` in the order a forward pass on one input of ``input_shape``
    runs them (a module run twice appears twice)."""
    import torch

    assert isinstance(model, torch.nn.Module)
    kernels: list[Kernel] = []

    def shape(x: object) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape[1:]) if isinstance(x, torch.Tensor) else ()

    def record(module: torch.nn.Module, args: tuple[object, ...], output: object) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        last = kernels[-1] if kernels else None
        if (last is not None and type(module).__name__ in FUSED_KINDS
                and last._output is x and shape(output) == last.output_shape):
            last.modules.append(module)
            last.signatures.append(repr(module))
        else:
            last = Kernel([module], [repr(module)], shape(x))
            kernels.append(last)
        last.output_shape = shape(output)
        # the output object is kept alive until the pass ends, so identity is safe
        last._output = output

    probe_leaves(model, input_shape, lambda m: m.register_forward_hook(record))
    for k in kernels:
        k._output = None
    return kernels


def probe_leaves(model: object, input_shape: Sequence[int], hook: Callable[[Any], Any]) -> None:
    """One forward pass of a zero example through ``model`` in evaluation mode, without
    gradients, with ``hook(module)`` (which registers a hook and returns its handle) on every
    leaf module; the hooks, the model's mode and torch's thread count are restored after."""
    import torch

    assert isinstance(model, torch.nn.Module)
    hooks = [hook(m) for m in model.modules() if not any(True for _ in m.children())]
    training, threads = model.training, torch.get_num_threads()
    model.eval()
    # one thread: on a busy machine more threads wait on each other for a tiny batch
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(torch.zeros(1, *map(int, input_shape)))
    finally:
        torch.set_num_threads(threads)
        model.train(training)
        for h in hooks:
            h.remove()
