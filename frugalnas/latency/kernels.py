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

A transformer's attention and MLP compute most of their work in functions, not in leaf
modules (the scaled dot-product attention, the activation), so each of those modules, and a
transformer's embedding and output stages, is one kernel of its own (:data:`WHOLE_KINDS`),
measured whole; a module called while another kernel runs belongs to that kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Leaf layers that join the kernel whose output they take (folded or fused by the runtime).
FUSED_KINDS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "ReLU", "ReLU6", "LeakyReLU",
               "Hardswish", "Hardsigmoid", "Sigmoid", "SiLU", "Tanh", "GELU", "Mish",
               "Identity")
#: Modules measured whole as one kernel (their insides run as functions or as parts of them).
WHOLE_KINDS = ("DenseAttention", "DenseMLP", "GPTEmbedding", "GPTOutput", "ViTEmbedding",
               "ViTOutput")


@dataclass
class Kernel:
    """Consecutive leaf layers that run as one operator: their signatures, the modules, and
    the input shape (without the batch axis)."""

    modules: list[Any]
    signatures: list[str]
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...] = ()
    tokens: bool = False
    _output: object = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        """The class names of its layers joined with ``+`` (``Conv2d+BatchNorm2d+ReLU``)."""
        return "+".join(type(m).__name__ for m in self.modules)

    @property
    def signature(self) -> str:
        """Each layer's full configuration (its repr) and the input shape (``int64`` for
        tokens): a table key."""
        tokens = " int64" if self.tokens else ""
        return " + ".join(self.signatures) + f"@{self.input_shape}{tokens}"

    def module(self) -> object:
        """A copy of the kernel's layers as one module, to measure alone."""
        import copy

        from torch import nn

        layers = [_holding(copy.deepcopy(m)) for m in self.modules]
        return layers[0] if len(layers) == 1 else nn.Sequential(*layers)


def _holding(module: Any) -> Any:
    """``module``, or, when it holds layers by reference outside its submodules (a
    transformer stage's references to its parent's embedding or head), a wrapper that
    registers them, so that an exporter sees their weights as the module's own."""
    from torch import nn

    held = [m for sub in module.modules() for value in vars(sub).values()
            if isinstance(value, tuple) for m in value if isinstance(m, nn.Module)]
    if not held:
        return module

    class Holding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stage, self.held = module, nn.ModuleList(held)

        def forward(self, x: Any) -> Any:
            return self.stage(x)

    return Holding()


def network_kernels(model: object, input_shape: Sequence[int],
                    tokens: bool = False) -> list[Kernel]:
    """The kernels of ``model`` in the order a forward pass on one input of ``input_shape``
    (int64 tokens with ``tokens``) runs them (a module run twice appears twice)."""
    import torch

    assert isinstance(model, torch.nn.Module)
    kernels: list[Kernel] = []
    running = [0]   # kernels under way: a module called inside one is part of it

    def shape(x: object) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape[1:]) if isinstance(x, torch.Tensor) else ()

    def enter(module: torch.nn.Module, args: tuple[object, ...]) -> None:
        running[0] += 1

    def record(module: torch.nn.Module, args: tuple[object, ...], output: object) -> None:
        running[0] -= 1
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or running[0]:
            return
        last = kernels[-1] if kernels else None
        if (last is not None and type(module).__name__ in FUSED_KINDS
                and last._output is x and shape(output) == last.output_shape):
            last.modules.append(module)
            last.signatures.append(repr(module))
        else:
            last = Kernel([module], [repr(module)], shape(x),
                          tokens=not torch.is_floating_point(x))
            kernels.append(last)
        last.output_shape = shape(output)
        # the output object is kept alive until the pass ends, so identity is safe
        last._output = output

    probe_leaves(model, input_shape, lambda m: [m.register_forward_pre_hook(enter),
                                                m.register_forward_hook(record)], tokens)
    for k in kernels:
        k._output = None
    return kernels


def units(model: Any) -> list[Any]:
    """The modules a forward pass is split into: those of :data:`WHOLE_KINDS`, and the leaf
    modules outside them."""
    found: dict[int, Any] = {}

    def visit(module: Any) -> None:
        children = list(module.children())
        if type(module).__name__ in WHOLE_KINDS or not children:
            found.setdefault(id(module), module)   # a module used twice is hooked once
            return
        for child in children:
            visit(child)

    visit(model)
    return list(found.values())


def probe_leaves(model: object, input_shape: Sequence[int], hook: Callable[[Any], Any],
                 tokens: bool = False) -> None:
    """One forward pass of a zero example (int64 zeros with ``tokens``) through ``model`` in
    evaluation mode, without gradients, with ``hook(module)`` (which registers hooks and
    returns their handle or a list of handles) on every module of :func:`units`; the hooks,
    the model's mode and torch's thread count are restored after."""
    import torch

    assert isinstance(model, torch.nn.Module)
    hooks = []
    for module in units(model):
        handles = hook(module)
        hooks.extend(handles if isinstance(handles, list) else [handles])
    training, threads = model.training, torch.get_num_threads()
    model.eval()
    # one thread: on a busy machine more threads wait on each other for a tiny batch
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            dtype = torch.int64 if tokens else torch.float32
            model(torch.zeros(1, *map(int, input_shape), dtype=dtype))
    finally:
        torch.set_num_threads(threads)
        model.train(training)
        for h in hooks:
            h.remove()
