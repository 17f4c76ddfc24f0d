"""The ``dag`` space for weight sharing (:mod:`frugalnas.weight_sharing`).

Keys are those of :class:`~frugalnas.spaces.dag.space.DagMacro` (the same store SI-EvoNAS
trains). ``sharing="operation"`` keeps one module per operation and position (cell, node,
input, operation); ``"operation-across-inputs"`` folds the input into a stride class, so the
edges from every input of a node that share an operation (and stride) share one module.
Batch norm uses batch statistics, as under SI-EvoNAS's sampled training.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from frugalnas.ports.capabilities import sharing_by
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import check_choice
from frugalnas.spaces.dag.space import DagNetwork, DagSpace
from frugalnas.nn.weight_store import Key

SHARING = ("operation", "operation-across-inputs")


class DagSharedBuilder:
    def __init__(self, space: DagSpace, num_classes: int, input_shape: tuple[int, ...],
                 sharing: str = "operation"):
        check_choice("sharing", sharing, SHARING)
        self.space, self.sharing = space, sharing
        self.macro = space.macro(num_classes, input_shape, shared=True)

    def canonical(self, key: Key) -> Key:
        if self.sharing == "operation" or key[0] != "edge":
            return key
        _, i, ctype, n, src, op = key
        strided = ctype == "reduce" and int(src) < 2
        return ("edge", i, ctype, n, 0 if strided or ctype != "reduce" else 2, op)

    def keys(self) -> list[Key]:
        return list(dict.fromkeys(self.canonical(k) for k in self.macro.all_keys()))

    def factory(self, key: Key) -> nn.Module:
        return self.macro.make(key)

    def subnet(self, arch: Architecture, get: Callable[[Key], nn.Module]) -> nn.Module:
        self.space.validate(arch)
        return DagNetwork(self.space, arch, lambda key: get(self.canonical(key)))


#: Weight sharing for the space: its networks over one shared weight store.
DagSharing = sharing_by(DagSharedBuilder)
