"""NB201 for weight sharing: the space's side of :mod:`frugalnas.weight_sharing`.

Every module of a candidate network comes from a :class:`~frugalnas.nn.weight_store.WeightStore`
under a key, so candidates that ask for the same key train the same tensors:

- ``("stem",)``, ``("reduction", stage)``, ``("head",)``: the macro skeleton, shared by all;
- ``("cell", k, "edge_j_i", op)`` with ``sharing="operation"``: one module per operation and
  position (cell ``k``, edge ``j <- i``), the usual one-shot supernet (SPOS, DARTS);
- ``("cell", k, "node_j", op)`` with ``sharing="operation-across-inputs"``: one module per
  operation and *target node*, shared by the edges from every input into node ``j``: a coarser
  store with fewer weights, each trained more often.

:class:`MixedNB201Network` is DARTS's continuous relaxation over the same keys: each edge
outputs the softmax(alpha)-weighted sum of its five operations, with one alpha matrix shared by
all cells (as in NB201's DARTS baseline, Dong & Yang 2020).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from frugalnas.ports.capabilities import sharing_by
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import check_choice
from frugalnas.nn.weight_store import Key
from frugalnas.spaces.nb201.space import (DECISIONS, EDGES, OPS, InferCell, NB201Space,
                                          ResidualReduction, make_op)

SHARING = ("operation", "operation-across-inputs")
Getter = Callable[[Key], nn.Module]


class NB201SharedBuilder:
    """Builds NB201 networks from shared modules (see the module docstring for the keys)."""

    def __init__(self, space: NB201Space, num_classes: int, input_shape: tuple[int, ...],
                 sharing: str = "operation"):
        check_choice("sharing", sharing, SHARING)
        self.space, self.num_classes, self.sharing = space, int(num_classes), sharing
        self.in_channels = int(input_shape[0])

    def channels_of_cell(self, k: int) -> int:
        return self.space.C * 2 ** (k // self.space.N)

    def op_key(self, k: int, edge: str, op: str) -> Key:
        if self.sharing == "operation":
            return ("cell", k, edge, op)
        return ("cell", k, "node_" + edge.split("_")[1], op)

    def keys(self) -> list[Key]:
        """Every key a network of this space can ask for (the whole supernet)."""
        keys: list[Key] = [("stem",), ("reduction", 1), ("reduction", 2), ("head",)]
        for k in range(3 * self.space.N):
            keys.extend(dict.fromkeys(self.op_key(k, e, op) for e in DECISIONS for op in OPS))
        return keys

    def factory(self, key: Key) -> nn.Module:
        """A freshly initialised module for ``key`` (called by the store on first use)."""
        C = self.space.C
        if key[0] == "stem":
            return nn.Sequential(nn.Conv2d(self.in_channels, C, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(C))
        if key[0] == "reduction":
            stage = int(key[1])
            return ResidualReduction(C * 2 ** (stage - 1), C * 2 ** stage)
        if key[0] == "head":
            c = C * 4
            return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(c, self.num_classes))
        if key[0] == "cell":
            return make_op(str(key[3]), self.channels_of_cell(int(key[1])))
        raise KeyError(f"unknown NB201 weight-store key {key!r}")

    def skeleton(self, get: Getter) -> tuple[nn.Module, dict[int, nn.Module], nn.Module]:
        return get(("stem",)), {s: get(("reduction", s)) for s in (1, 2)}, get(("head",))

    def subnet(self, arch: Architecture, get: Getter) -> "SharedNB201Network":
        """The network of ``arch``; its parameters are the store's tensors."""
        self.space.validate(arch)
        stem, reductions, head = self.skeleton(get)
        cells = [SharedCell({e: get(self.op_key(k, e, arch[e])) for e in DECISIONS})
                 for k in range(3 * self.space.N)]
        return SharedNB201Network(stem, cells, reductions, head, self.space.N)

    def mixed(self, get: Getter, alphas: torch.Tensor) -> "MixedNB201Network":
        """DARTS's relaxation: every edge mixes all operations with ``softmax(alphas[edge])``."""
        stem, reductions, head = self.skeleton(get)
        cells = [MixedCell({e: nn.ModuleList(get(self.op_key(k, e, op)) for op in OPS)
                            for e in DECISIONS}, alphas)
                 for k in range(3 * self.space.N)]
        return MixedNB201Network(stem, cells, reductions, head, self.space.N, alphas)


class SharedCell(InferCell):
    """An NB201 cell whose edge modules are given (shared), not created."""

    def __init__(self, edges: dict[str, nn.Module]):
        nn.Module.__init__(self)
        self.edges = nn.ModuleDict(edges)


class MixedCell(nn.Module):
    def __init__(self, edges: dict[str, nn.ModuleList], alphas: torch.Tensor):
        super().__init__()
        self.edges = nn.ModuleDict(edges)
        self.alphas = alphas  # not registered: the search owns it, cells only read it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.alphas, dim=-1)
        nodes = [x]
        for j in (1, 2, 3):
            total = 0
            for i in range(j):
                e = EDGES.index((j, i))
                ops = self.edges[f"edge_{j}_{i}"]
                total = total + sum(w * op(nodes[i]) for w, op in zip(weights[e], ops))
            nodes.append(total)
        return nodes[3]


class SharedNB201Network(nn.Module):
    """NB201's macro network over shared modules (the same layout as ``NB201Network``)."""

    def __init__(self, stem: nn.Module, cells: list[nn.Module], reductions: dict[int, nn.Module],
                 head: nn.Module, N: int):
        super().__init__()
        blocks: list[nn.Module] = []
        for stage in range(3):
            if stage > 0:
                blocks.append(reductions[stage])
            blocks.extend(cells[stage * N:(stage + 1) * N])
        self.stem, self.cells, self.head = stem, nn.Sequential(*blocks), head

    def forward_blocks(self) -> list[nn.Module]:
        """The stem, cells and reductions in forward order (a ``BlockNetwork``)."""
        return [self.stem, *self.cells]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cells(self.stem(x)))


class MixedNB201Network(SharedNB201Network):
    def __init__(self, stem: nn.Module, cells: list[nn.Module], reductions: dict[int, nn.Module],
                 head: nn.Module, N: int, alphas: torch.Tensor):
        super().__init__(stem, cells, reductions, head, N)
        self.alphas = alphas


#: Weight sharing for the space: its networks over one shared weight store.
NB201Sharing = sharing_by(NB201SharedBuilder)
