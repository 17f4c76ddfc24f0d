"""The NAS-Bench-201 cell space (Dong & Yang, ICLR 2020): 6 edges, 5 operations, 15,625 cells.

A cell is a DAG of 4 nodes; node ``j`` sums ``op(j, i)(node i)`` over ``i < j``. The network is
the benchmark's macro skeleton: a 3x3 conv stem, three stages of ``N`` cells at ``C``, ``2C``
and ``4C`` channels separated by residual reduction blocks, then BN-ReLU, global pooling and
a linear classifier. Defaults ``N=5, C=16`` are the benchmark's.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution
from torch import nn

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError, check_range
from frugalnas.ports.capabilities import (CellGraph, OwnEncodings, Scaling, WeightSharing, itself,
                                          scaling_by)
from frugalnas.ports.space import SearchSpace

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
EDGES = ((1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2))
DECISIONS = tuple(f"edge_{j}_{i}" for j, i in EDGES)
_OP_INDEX = {op: i for i, op in enumerate(OPS)}
# The cell string and the cell's JSON form with one field per decision, in DECISIONS order.
_CELL_TEXT = "+".join("|" + "".join(f"{{}}~{i}|" for i in range(j)) for j in (1, 2, 3))
_CELL_JSON = ('{{"space":"nb201","decisions":{{'
              + ",".join(f'"{k}":"{{}}"' for k in DECISIONS) + "}}}}")


def _is_cell(decisions: Mapping[str, Any]) -> bool:
    """Whether ``decisions`` are exactly an NB201 cell's, in order, each an operation."""
    return tuple(decisions) == DECISIONS and all(op in _OP_INDEX for op in decisions.values())


class NB201Cell(Architecture, space="nb201"):
    """An NB201 genotype; ``str()`` gives ``nb201:|op~0|+|op~0|op~1|+|op~0|op~1|op~2|``."""

    def _format_body(self) -> str:
        d = dict(self._decisions)
        return _CELL_TEXT.format(*(d[k] for k in DECISIONS))

    def to_json(self) -> str:
        # Operation names need no escaping: the generic encoder's text, from a template.
        d = dict(self._decisions)
        return _CELL_JSON.format(*d.values()) if _is_cell(d) else super().to_json()

    @classmethod
    def _parse_body(cls, space: str, body: str) -> "NB201Cell":
        return cls(space, parse_cell_string(body))


def parse_cell_string(text: str) -> dict[str, str]:
    """Decisions of an NB201 cell string ``|op~0|+|op~0|op~1|+|op~0|op~1|op~2|``."""
    example = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
    nodes = text.strip().split("+")
    if len(nodes) != 3:
        raise ArchitectureParseError(
            f"malformed NB201 cell string {text!r}: expected 3 nodes separated by '+', "
            f"got {len(nodes)}; example: {example}")
    decisions: dict[str, str] = {}
    for j, node in enumerate(nodes, start=1):
        if not (node.startswith("|") and node.endswith("|")):
            raise ArchitectureParseError(
                f"malformed NB201 cell string {text!r}: node {node!r} must be wrapped in '|'")
        edges = node[1:-1].split("|")
        if len(edges) != j:
            raise ArchitectureParseError(
                f"malformed NB201 cell string {text!r}: node {j} needs {j} inputs, got {len(edges)}")
        for i, edge in enumerate(edges):
            op, sep, src = edge.partition("~")
            if not sep or src != str(i):
                raise ArchitectureParseError(
                    f"malformed NB201 cell string {text!r}: edge {edge!r} of node {j} must be "
                    f"'OP~{i}'")
            if op not in OPS:
                raise ArchitectureParseError(
                    f"unknown NB201 operation {op!r} in {text!r}; valid: {', '.join(OPS)}")
            decisions[f"edge_{j}_{i}"] = op
    return {k: decisions[k] for k in DECISIONS}


# -- the network -------------------------------------------------------------------------
class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1):
        super().__init__(nn.ReLU(inplace=False),
                         nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(c_out))


class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul(0.0)


def make_op(name: str, channels: int) -> nn.Module:
    if name == "none":
        return Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name == "nor_conv_1x1":
        return ReLUConvBN(channels, channels, 1)
    if name == "nor_conv_3x3":
        return ReLUConvBN(channels, channels, 3)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    raise ArchitectureParseError(f"unknown NB201 operation {name!r}; valid: {', '.join(OPS)}")


class InferCell(nn.Module):
    def __init__(self, decisions: dict[str, str], channels: int):
        super().__init__()
        self.edges = nn.ModuleDict({key: make_op(decisions[key], channels) for key in DECISIONS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for j in (1, 2, 3):
            nodes.append(sum(self.edges[f"edge_{j}_{i}"](nodes[i]) for i in range(j)))
        return nodes[3]


class ResidualReduction(nn.Module):
    """The benchmark's residual block that halves resolution and doubles channels."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv_a = ReLUConvBN(c_in, c_out, 3, stride=2)
        self.conv_b = ReLUConvBN(c_out, c_out, 3)
        self.shortcut = nn.Sequential(nn.AvgPool2d(2, 2, ceil_mode=True), nn.Conv2d(c_in, c_out, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x) + self.conv_b(self.conv_a(x))


class NB201Network(nn.Module):
    """The NB201 macro network. ``blocks`` lists the stem, cells and reductions in order, so
    backends that work block by block (out-of-core) can walk it."""

    def __init__(self, decisions: dict[str, str], num_classes: int, in_channels: int = 3,
                 N: int = 5, C: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, C, 3, padding=1, bias=False), nn.BatchNorm2d(C))
        blocks: list[nn.Module] = []
        c = C
        for stage in range(3):
            if stage > 0:
                blocks.append(ResidualReduction(c, c * 2))
                c *= 2
            blocks.extend(InferCell(decisions, c) for _ in range(N))
        self.cells = nn.Sequential(*blocks)
        self.lastact = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU())
        self.classifier = nn.Linear(c, num_classes)

    @property
    def blocks(self) -> list[nn.Module]:
        return [self.stem, *self.cells]

    def forward_blocks(self) -> list[nn.Module]:
        """The stem, cells and reductions in forward order (a ``BlockNetwork``)."""
        return self.blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cells(self.stem(x))
        x = self.lastact(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# -- the space ---------------------------------------------------------------------------
def _new_cell(ops: tuple[Any, ...]) -> NB201Cell:
    for k, op in zip(DECISIONS, ops):
        if not isinstance(op, str) or op not in OPS:
            raise ArchitectureParseError(f"invalid value {op!r} for decision {k!r} of space "
                                         f"'nb201'; valid: {', '.join(OPS)}")
    return NB201Cell("nb201", dict(zip(DECISIONS, ops)))


# A strategy's proposal, the trial's suggest and the history each make the same cell: one
# immutable object for them all formats its text and hashes its key once. Only valid cells
# are kept (an error is not cached), so at most the space's 15,625.
_known_cell = lru_cache(maxsize=None)(_new_cell)


_DISTRIBUTIONS = {key: CategoricalDistribution(OPS) for key in DECISIONS}


class NB201Space(SearchSpace):
    """NAS-Bench-201: 6 edges x 5 operations (15,625 cells); options N (cells per stage) and C
    (stem channels)."""

    network_family = "convolutional"

    name = "nb201"
    genotype = NB201Cell
    capabilities = {WeightSharing: "frugalnas.spaces.nb201.supernet:NB201Sharing",
                    OwnEncodings: "frugalnas.spaces.nb201.encodings:NB201Encodings",
                    Scaling: scaling_by(width="C", depth="N"), CellGraph: itself}

    def __init__(self, N: int = 5, C: int = 16):
        check_range("N (cells per stage)", N, 1)
        check_range("C (channels)", C, 1)
        self.N, self.C = int(N), int(C)

    def distributions(self) -> dict[str, CategoricalDistribution]:
        return dict(_DISTRIBUTIONS)  # built once: every trial asks for them

    def build(self, arch: Architecture, num_classes: int = 10,
              input_shape: tuple[int, ...] = (3, 32, 32)) -> NB201Network:
        self.validate(arch)
        return NB201Network(arch.decisions, num_classes, input_shape[0], self.N, self.C)

    def from_params(self, params):  # type: ignore[override]
        missing = [k for k in DECISIONS if k not in params]
        if missing:
            raise ArchitectureParseError(f"parameters for space 'nb201' miss decision(s) {missing}")
        ops = tuple(params[k] for k in DECISIONS)
        try:
            return _known_cell(ops)
        except TypeError:  # an unhashable value: not an operation
            return _new_cell(ops)

    def validate(self, arch: Architecture) -> None:
        # Every trial's cell is checked before it is evaluated: the valid case in one pass,
        # anything else through the generic check and its message.
        if arch.space != self.name or not _is_cell(arch.decisions):
            super().validate(arch)

    def sample(self, rng: random.Random) -> NB201Cell:
        # The draws of SearchSpace.sample (one choice of OPS per decision, in order).
        return _known_cell(tuple(rng.choice(OPS) for _ in DECISIONS))

    def parse(self, text: str) -> NB201Cell:
        """Accepts ``nb201:|...|`` and the benchmark's bare ``|...|`` form."""
        text = text.strip()
        if text.startswith("nb201:"):
            text = text[len("nb201:"):]
        elif not text.startswith("|"):
            raise ArchitectureParseError(
                f"malformed NB201 cell string {text!r}; expected "
                "'|op~0|+|op~0|op~1|+|op~0|op~1|op~2|' with ops from: " + ", ".join(OPS))
        return NB201Cell("nb201", parse_cell_string(text))

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        return [(str(i), str(j), arch[f"edge_{j}_{i}"]) for j, i in EDGES if arch[f"edge_{j}_{i}"] != "none"]

    def index(self, arch: Architecture) -> int:
        """The cell's position in :meth:`enumerate` (its op indices as a base-5 number)."""
        idx = 0
        decisions = arch.decisions
        for key in DECISIONS:
            op = decisions[key]
            if op not in _OP_INDEX:
                raise ArchitectureParseError(f"invalid value {op!r} for decision {key!r} of "
                                             f"space 'nb201'; valid: {', '.join(OPS)}")
            idx = idx * len(OPS) + _OP_INDEX[op]
        return idx

    def from_index(self, index: int) -> NB201Cell:
        if not 0 <= index < len(OPS) ** len(DECISIONS):
            raise ArchitectureParseError(f"invalid NB201 index {index}; valid range: [0, 15624]")
        ops = []
        for _ in DECISIONS:
            index, r = divmod(index, len(OPS))
            ops.append(OPS[r])
        return NB201Cell("nb201", dict(zip(DECISIONS, reversed(ops))))

    def enumerate(self) -> Iterator[NB201Cell]:
        for ops in itertools.product(OPS, repeat=len(DECISIONS)):
            yield NB201Cell("nb201", dict(zip(DECISIONS, ops)))

    def __len__(self) -> int:
        return len(OPS) ** len(DECISIONS)

