"""DARTS's continuous relaxation of the ``dag`` space (Liu et al., ICLR 2019, section 2.2).

Every node reads *every* earlier state through a softmax-weighted mix of all operations
(one row of mixing weights per node and input), and its squeeze-and-excitation choice is
mixed too (a row with two live columns: off, on). The discrete cell is read off as DARTS
does: each node keeps the two inputs whose strongest operation weighs most, each with that
operation, and the heavier attention choice. The modules are the weight store's own
(keys of :class:`~frugalnas.spaces.dag.space.DagMacro`), so the mixed network and every
sub-network share weights.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn

from frugalnas.ports.architecture import Architecture
from frugalnas.spaces.dag.space import CELL_TYPES, DagNetwork, DagSpace
from frugalnas.nn.weight_store import Key


class DagRelaxation:
    """Rows of mixing weights: ``("edge", cell type, node, input)`` over the space's
    operations, then ``("se", cell type, node)`` over (off, on) when the space has attention;
    columns beyond a row's choices are masked out."""

    def __init__(self, space: DagSpace):
        self.space = space
        self.rows: list[tuple] = []
        for ctype in CELL_TYPES:
            for n in range(2, space.nodes + 2):
                self.rows += [("edge", ctype, n, src) for src in range(n)]
        if space.attention:
            self.rows += [("se", ctype, n) for ctype in CELL_TYPES
                          for n in range(2, space.nodes + 2)]
        self.index = {row: i for i, row in enumerate(self.rows)}
        self.shape = (len(self.rows), max(len(space.ops), 2 if space.attention else 1))
        mask = torch.zeros(self.shape)
        for row, i in self.index.items():
            mask[i, 2 if row[0] == "se" else len(space.ops):] = float("-inf")
        self.mask = mask

    def weights(self, alphas: torch.Tensor) -> torch.Tensor:
        """Softmax over each row's live columns."""
        return torch.softmax(alphas + self.mask.to(alphas.device), dim=-1)

    def network(self, builder: object, get: Callable[[Key], nn.Module],
                alphas: torch.Tensor) -> nn.Module:
        """The relaxed network over ``get``'s modules (the shared builder's keys; ``builder``
        itself is not needed): the stem, final batch norm and head of every ``dag`` network
        around mixed cells."""
        cells = [MixedDagCell(self, i, t, get, alphas)
                 for i, t in enumerate(self.space.cell_layout())]
        return DagNetwork(self.space, None, get, cells=cells)

    def read(self, alphas: torch.Tensor) -> Architecture:
        """The discrete cell DARTS reads off ``alphas``."""
        w = self.weights(alphas.detach().cpu())
        params = {}
        for ctype in CELL_TYPES:
            for n in range(2, self.space.nodes + 2):
                rows = [w[self.index[("edge", ctype, n, src)]] for src in range(n)]
                strength = torch.stack([r.max() for r in rows])
                top = torch.argsort(strength, descending=True, stable=True)[:2].tolist()
                self._set_node(params, ctype, n, top, [int(rows[s].argmax()) for s in top], w)
        return self.space.from_params(params)

    def sample(self, alphas: torch.Tensor, rng: random.Random) -> Architecture:
        """A cell drawn from the mixing weights: inputs by the strength of their strongest
        operation, operations and attention by their weights."""
        w = self.weights(alphas.detach().cpu())
        params = {}
        for ctype in CELL_TYPES:
            for n in range(2, self.space.nodes + 2):
                rows = [w[self.index[("edge", ctype, n, src)]].tolist() for src in range(n)]
                strength = [max(r) for r in rows]
                srcs = rng.choices(range(n), weights=strength, k=2)
                ops = [rng.choices(range(len(self.space.ops)), weights=rows[s])[0] for s in srcs]
                self._set_node(params, ctype, n, srcs, ops, w, rng)
        return self.space.from_params(params)

    def _set_node(self, params: dict, ctype: str, n: int, srcs: list[int], ops: list[int],
                  w: torch.Tensor, rng: random.Random | None = None) -> None:
        p = f"{ctype}_node{n}_"
        for slot, (src, op) in enumerate(zip(srcs, ops)):
            params[f"{p}in{slot}"] = int(src)
            params[f"{p}op{slot}"] = self.space.ops[op]
        se = False
        if self.space.attention:
            off, on = w[self.index[("se", ctype, n)], :2].tolist()
            se = (rng.random() < on / (off + on)) if rng is not None else on > off
        params[f"{p}se"] = se


class MixedDagCell(nn.Module):
    def __init__(self, relaxation: DagRelaxation, index: int, ctype: str,
                 get: Callable[[Key], nn.Module], alphas: torch.Tensor):
        super().__init__()
        space = relaxation.space
        self.relaxation, self.ctype, self.alphas = relaxation, ctype, alphas
        self.pre0, self.pre1 = get(("pre0", index)), get(("pre1", index))
        self.nodes = list(range(2, space.nodes + 2))
        self.edges = nn.ModuleDict({
            f"{n}_{src}": nn.ModuleList(get(("edge", index, ctype, n, src, op)) for op in space.ops)
            for n in self.nodes for src in range(n)})
        self.gates = nn.ModuleDict({str(n): get(("se", index, ctype, n)) for n in self.nodes}
                                   if space.attention else {})

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        w = self.relaxation.weights(self.alphas)
        index = self.relaxation.index
        states = [self.pre0(s0), self.pre1(s1)]
        for n in self.nodes:
            out = 0
            for src in range(n):
                row = w[index[("edge", self.ctype, n, src)]]
                out = out + sum(row[k] * op(states[src])
                                for k, op in enumerate(self.edges[f"{n}_{src}"]))
            if self.gates:
                off, on = w[index[("se", self.ctype, n)], :2]
                out = off * out + on * self.gates[str(n)](out)
            states.append(out)
        return torch.cat(states[2:], dim=1)
