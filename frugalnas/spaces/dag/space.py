"""An evolvable DAG cell space with channel attention (after Zhang et al., "Efficient
Evolutionary Search of Attention Convolutional Networks via Sampled Training and Node
Inheritance", IEEE TEVC, arXiv 2003.11613).

A cell has ``nodes`` computing nodes numbered ``2 .. nodes+1``; 0 and 1 are the outputs of the
two previous cells. Node ``n`` adds ``op0(state[in0])`` and ``op1(state[in1])`` with
``in0, in1 < n`` and may gate its sum with squeeze-and-excitation. The cell outputs the
concatenation of its nodes. A normal and a reduction cell (stride 2 on the cell inputs) are
searched and stacked as ``[normal] * normal_cells`` then ``reduce`` per stage, ``reductions``
times, then ``normal_cells`` more normal cells.

Decisions are named ``{cell}_node{n}_in{0,1}``, ``{cell}_node{n}_op{0,1}`` and
``{cell}_node{n}_se``; every choice list is fixed, so every assignment is a valid DAG.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from optuna.distributions import BaseDistribution, CategoricalDistribution
from torch import nn

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError, ConfigError, check_range
from frugalnas.ports.capabilities import (CellGraph, DartsRelaxation, Scaling, WeightSharing,
                                          itself, scaling_by)
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.dag.ops import (DEFAULT_OPS, OPS, BatchNorm, FactorizedReduce, ReLUConvBN, SqueezeExcite,
                      batch_stat_bn, make_op, running_bn)
from frugalnas.nn.weight_store import Key

CELL_TYPES = ("normal", "reduce")
FIELDS = ("in0", "op0", "in1", "op1", "se")


class DagGenotype(Architecture, space="dag"):
    """A DAG genotype; ``str()`` gives
    ``dag:normal:sep_conv_3x3~0+skip_connect~1+se|...;reduce:max_pool_3x3~0+...``."""

    def _format_body(self) -> str:
        d = self.decisions
        cells = []
        for cell in CELL_TYPES:
            nodes, n = [], 2
            while f"{cell}_node{n}_op0" in d:
                p = f"{cell}_node{n}_"
                text = f"{d[p + 'op0']}~{d[p + 'in0']}+{d[p + 'op1']}~{d[p + 'in1']}"
                nodes.append(text + ("+se" if d[p + "se"] else ""))
                n += 1
            cells.append(f"{cell}:" + "|".join(nodes))
        return ";".join(cells)

    @classmethod
    def _parse_body(cls, space: str, body: str) -> "DagGenotype":
        example = "normal:sep_conv_3x3~0+skip_connect~1+se|avg_pool_3x3~2+sep_conv_3x3~0;reduce:..."
        if "=" in body:  # the generic key=value form
            return super()._parse_body(space, body)
        parts = body.strip().split(";")
        if [p.partition(":")[0] for p in parts] != list(CELL_TYPES):
            raise ArchitectureParseError(
                f"malformed DAG genotype {body!r}: expected 'normal:...;reduce:...', e.g. {example}")
        decisions: dict[str, Any] = {}
        for part in parts:
            cell, _, nodes = part.partition(":")
            for n, node in enumerate(nodes.split("|"), start=2):
                pieces = node.split("+")
                se = pieces[-1] == "se"
                edges = pieces[:-1] if se else pieces
                if len(edges) != 2:
                    raise ArchitectureParseError(
                        f"malformed node {node!r} in DAG genotype {body!r}: expected "
                        f"'OP~IN+OP~IN' with an optional '+se'")
                p = f"{cell}_node{n}_"
                for slot, edge in enumerate(edges):
                    op, sep, src = edge.partition("~")
                    if not sep or not src.isdigit():
                        raise ArchitectureParseError(
                            f"malformed edge {edge!r} in DAG genotype {body!r}: expected 'OP~INPUT'")
                    decisions[f"{p}in{slot}"] = int(src)
                    decisions[f"{p}op{slot}"] = op
                decisions[p + "se"] = se
        order = sorted(decisions, key=lambda k: (CELL_TYPES.index(k.split("_")[0]),
                                                  int(k.split("_")[1][4:]), FIELDS.index(k.split("_")[2])))
        return cls(space, {k: decisions[k] for k in order})


def _node_keys(cell: str, n: int) -> list[str]:
    return [f"{cell}_node{n}_{f}" for f in FIELDS]


class DagSpace(SearchSpace):
    """Evolvable DAG cells (normal + reduction) with optional squeeze-and-excitation per node."""

    network_family = "convolutional"

    name = "dag"
    genotype = DagGenotype
    capabilities = {WeightSharing: "frugalnas.spaces.dag.supernet:DagSharing",
                    DartsRelaxation: "frugalnas.spaces.dag.relaxation:DagRelaxation",
                    Scaling: scaling_by(width="channels", depth="normal_cells"),
                    CellGraph: itself}

    def __init__(self, nodes: int = 4, channels: int = 8, normal_cells: int = 1,
                 reductions: int = 2, ops: Sequence[str] = DEFAULT_OPS, attention: bool = True,
                 se_reduction: int = 4, stem_multiplier: int = 2):
        check_range("nodes", nodes, 1, 12)
        check_range("channels", channels, 2)
        check_range("normal_cells", normal_cells, 0)
        check_range("reductions", reductions, 0)
        check_range("se_reduction", se_reduction, 1)
        check_range("stem_multiplier", stem_multiplier, 1)
        ops = tuple(ops)
        unknown = [o for o in ops if o not in OPS]
        if not ops or unknown or len(set(ops)) != len(ops):
            raise ConfigError(f"invalid DAG ops {list(ops)!r}; give distinct names from: "
                              f"{', '.join(OPS)}")
        if normal_cells + reductions == 0:
            raise ConfigError("invalid DAG macro network: normal_cells=0 and reductions=0 leave no cell")
        self.nodes, self.channels = int(nodes), int(channels)
        self.normal_cells, self.reductions = int(normal_cells), int(reductions)
        self.ops, self.attention = ops, bool(attention)
        self.se_reduction, self.stem_multiplier = int(se_reduction), int(stem_multiplier)
        self._dists = self._make_distributions()

    def _make_distributions(self) -> dict[str, BaseDistribution]:
        dists: dict[str, BaseDistribution] = {}
        se_choices = [False, True] if self.attention else [False]
        for cell in CELL_TYPES:
            for n in range(2, self.nodes + 2):
                p = f"{cell}_node{n}_"
                dists[p + "in0"] = CategoricalDistribution(list(range(n)))
                dists[p + "op0"] = CategoricalDistribution(list(self.ops))
                dists[p + "in1"] = CategoricalDistribution(list(range(n)))
                dists[p + "op1"] = CategoricalDistribution(list(self.ops))
                dists[p + "se"] = CategoricalDistribution(se_choices)
        return dists

    def distributions(self) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def cell_layout(self) -> list[str]:
        """Cell types of the macro network in order."""
        layout: list[str] = []
        for _ in range(self.reductions):
            layout += ["normal"] * self.normal_cells + ["reduce"]
        return layout + ["normal"] * self.normal_cells

    # -- variation that keeps the DAG valid ----------------------------------------------
    def mutate(self, arch: Architecture, rng: random.Random) -> Architecture:
        """Pick one node and change one of its inputs, operations or its attention flag."""
        d = arch.decisions
        cell, n = rng.choice(CELL_TYPES), rng.randrange(2, self.nodes + 2)
        keys = [k for k in _node_keys(cell, n) if len(self._dists[k].choices) > 1]
        key = rng.choice(keys)
        d[key] = rng.choice([c for c in self._dists[key].choices if c != d[key]])
        return self.from_params(d)

    def crossover(self, a: Architecture, b: Architecture, rng: random.Random) -> Architecture:
        """Node-wise uniform crossover: each node (inputs, operations, attention) comes whole
        from one parent, so the child's nodes can inherit that parent's weights."""
        da, db = a.decisions, b.decisions
        child: dict[str, Any] = {}
        for cell in CELL_TYPES:
            for n in range(2, self.nodes + 2):
                src = da if rng.random() < 0.5 else db
                child.update({k: src[k] for k in _node_keys(cell, n)})
        return self.from_params({k: child[k] for k in self._dists})

    def validate(self, arch: Architecture) -> None:
        super().validate(arch)
        check_dag(arch, self.nodes)

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """Edges ``(source, target, label)`` of the normal cell then the reduction cell, for
        drawings: nodes ``n:in0``, ``n:in1`` (the cell inputs), ``n:2`` ... and ``r:...`` for
        the reduction cell; the label is the operation, with ``+se`` on the edges into a node
        gated by channel attention."""
        d = arch.decisions
        edges: list[tuple[str, str, str]] = []
        for cell, prefix in zip(CELL_TYPES, ("n", "r")):
            def name(i: int) -> str:
                return f"{prefix}:in{i}" if i < 2 else f"{prefix}:{i}"

            for n in range(2, self.nodes + 2):
                p = f"{cell}_node{n}_"
                suffix = "+se" if d[p + "se"] else ""
                for slot in (0, 1):
                    edges.append((name(int(d[f"{p}in{slot}"])), name(n), f"{d[f'{p}op{slot}']}{suffix}"))
        return edges

    def parse(self, text: str) -> Architecture:
        arch = DagGenotype.parse(text if text.startswith("dag:") else f"dag:{text}")
        self.validate(arch)
        return arch

    # -- networks ------------------------------------------------------------------------
    def macro(self, num_classes: int, input_shape: tuple[int, ...],
              shared: bool = False) -> "DagMacro":
        return DagMacro(self, num_classes, input_shape, batch_stat_bn if shared else running_bn)

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A stand-alone network with fresh weights."""
        self.validate(arch)
        macro = self.macro(num_classes, input_shape)
        local: dict[Key, nn.Module] = {}

        def get(key: Key) -> nn.Module:
            if key not in local:
                local[key] = macro.make(key)
            return local[key]

        return DagNetwork(self, arch, get)


def check_dag(arch: Architecture, nodes: int) -> None:
    """Raise ArchitectureParseError unless every node reads only cell inputs or earlier nodes."""
    d = arch.decisions
    for cell in CELL_TYPES:
        for n in range(2, nodes + 2):
            for slot in (0, 1):
                src = d[f"{cell}_node{n}_in{slot}"]
                if not (isinstance(src, int) and 0 <= src < n):
                    raise ArchitectureParseError(
                        f"node {n} of the {cell} cell reads state {src!r}; valid: 0..{n - 1}")


class DagMacro:
    """Channel and stride bookkeeping of the macro network; ``make(key)`` creates the fresh
    module for a weight-store key."""

    def __init__(self, space: DagSpace, num_classes: int, input_shape: tuple[int, ...],
                 bn: BatchNorm):
        self.space, self.num_classes, self.bn = space, num_classes, bn
        self.in_channels = int(input_shape[0])
        c, k = space.channels, space.nodes
        self.stem_channels = space.stem_multiplier * c
        self.cells: list[dict[str, Any]] = []
        c_pp, c_p, c_curr, prev_reduce = self.stem_channels, self.stem_channels, c, False
        for kind in space.cell_layout():
            if kind == "reduce":
                c_curr *= 2
            self.cells.append({"type": kind, "c_pp": c_pp, "c_p": c_p, "c": c_curr,
                               "prev_reduce": prev_reduce})
            c_pp, c_p, prev_reduce = c_p, k * c_curr, kind == "reduce"
        self.out_channels = c_p

    def all_keys(self) -> list[Key]:
        """Every weight-store key some candidate of the space uses (the whole supernet)."""
        keys: list[Key] = [("stem",)]
        se = self.space.attention
        for i, cell in enumerate(self.cells):
            keys += [("pre0", i), ("pre1", i)]
            for n in range(2, self.space.nodes + 2):
                keys += [("edge", i, cell["type"], n, src, op)
                         for src in range(n) for op in self.space.ops]
                if se:
                    keys.append(("se", i, cell["type"], n))
        return keys + [("final",), ("head",)]

    def arch_keys(self, arch: Architecture) -> list[Key]:
        """The keys a network of ``arch`` calls, once per call (an edge key used by both
        inputs of a node appears twice)."""
        d = arch.decisions
        keys: list[Key] = [("stem",)]
        for i, cell in enumerate(self.cells):
            ctype = cell["type"]
            keys += [("pre0", i), ("pre1", i)]
            for n in range(2, self.space.nodes + 2):
                p = f"{ctype}_node{n}_"
                keys += [("edge", i, ctype, n, d[f"{p}in{slot}"], d[f"{p}op{slot}"]) for slot in (0, 1)]
                if d[p + "se"]:
                    keys.append(("se", i, ctype, n))
        return keys + [("final",), ("head",)]

    def make(self, key: Key) -> nn.Module:
        kind = key[0]
        if kind == "stem":
            return nn.Sequential(nn.Conv2d(self.in_channels, self.stem_channels, 3, 1, 1, bias=False),
                                 self.bn(self.stem_channels))
        if kind == "head":
            return nn.Linear(self.out_channels, self.num_classes)
        if kind == "final":
            return self.bn(self.out_channels)
        cell = self.cells[int(key[1])]
        if kind == "pre0":
            if cell["prev_reduce"]:
                return FactorizedReduce(cell["c_pp"], cell["c"], self.bn)
            return ReLUConvBN(cell["c_pp"], cell["c"], 1, 1, self.bn)
        if kind == "pre1":
            return ReLUConvBN(cell["c_p"], cell["c"], 1, 1, self.bn)
        if kind == "edge":
            _, _, ctype, _node, src, op = key
            stride = 2 if ctype == "reduce" and int(src) < 2 else 1
            return make_op(str(op), cell["c"], stride, self.bn)
        if kind == "se":
            return SqueezeExcite(cell["c"], self.space.se_reduction)
        raise ValueError(f"unknown DAG weight key {key!r}")


class DagCell(nn.Module):
    def __init__(self, index: int, ctype: str, arch: Architecture, nodes: int,
                 get: Callable[[Key], nn.Module]):
        super().__init__()
        d = arch.decisions
        self.pre0, self.pre1 = get(("pre0", index)), get(("pre1", index))
        self.plan: list[tuple[int, int, bool]] = []
        edges, gates = [], []
        for n in range(2, nodes + 2):
            p = f"{ctype}_node{n}_"
            for slot in (0, 1):
                edges.append(get(("edge", index, ctype, n, d[f"{p}in{slot}"], d[f"{p}op{slot}"])))
            se = bool(d[p + "se"])
            gates.append(get(("se", index, ctype, n)) if se else nn.Identity())
            self.plan.append((int(d[p + "in0"]), int(d[p + "in1"]), se))
        self.edges, self.gates = nn.ModuleList(edges), nn.ModuleList(gates)

    def forward(self, s0: torch.Tensor, s1: torch.Tensor) -> torch.Tensor:
        states = [self.pre0(s0), self.pre1(s1)]
        for i, (a, b, _) in enumerate(self.plan):
            out = self.edges[2 * i](states[a]) + self.edges[2 * i + 1](states[b])
            states.append(self.gates[i](out))
        return torch.cat(states[2:], dim=1)


class DagNetwork(nn.Module):
    """Stem, the cells of ``space.cell_layout()``, batch norm and ReLU, global pooling and a
    linear classifier. Every module comes from ``get(key)``: fresh ones, or shared ones from a
    WeightStore. The final batch norm matters under weight sharing: the last cell concatenates
    its nodes, whose scales depend on the candidate's operations, and the shared classifier
    should see the same per-channel statistics whatever the candidate."""

    def __init__(self, space: DagSpace, arch: Architecture | None, get: Callable[[Key], nn.Module],
                 cells: Sequence[nn.Module] | None = None):
        """``cells``, when given, replace the cells of ``arch`` (DARTS's mixed cells)."""
        super().__init__()
        self.stem = get(("stem",))
        if cells is None:
            cells = [DagCell(i, t, arch, space.nodes, get) for i, t in enumerate(space.cell_layout())]
        self.cells = nn.ModuleList(cells)
        self.final = get(("final",))
        self.head = get(("head",))

    def forward_blocks(self) -> list[nn.Module]:
        """The stem and the cells in forward order (a ``BlockNetwork``)."""
        return [self.stem, *self.cells]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s0 = s1 = self.stem(x)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.head(torch.relu(self.final(s1)).mean(dim=(2, 3)))

