"""The ``gpt`` macro space: decoder-only language models with a searched embedding width,
depth, and per layer the number of attention heads and the MLP ratio, in the manner of
HW-GPT-Bench's GPT-2 spaces (Sukthanker et al., 2024) scaled to what a CPU trains.

A network is: token embedding (+ learned or rotary positions) of the chosen width, ``depth``
pre-norm blocks (causal self-attention of ``heads`` heads of ``head_dim`` features, MLP of
``mlp_ratio x width`` hidden units), a final norm and the next-token head. Layer ``i`` exists
only when ``depth > i``, so its decisions are conditional: an architecture holds only the
decisions of the layers it has (:meth:`GPTSpace.active_decisions`).

Text form: ``gpt:w<width>/`` then the layers separated by ``,``, each ``h<heads>r<ratio>``:
``gpt:w128/h4r4,h4r4,h2r2``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from frugalnas.nn.transformer import NORMS, POSITIONS, BlockChoice, SubnetConfig
from frugalnas.ports.architecture import Architecture, Value
from frugalnas.ports.capabilities import (CellGraph, OwnEncodings, ProgressiveShrinking,
                                          SandwichRule, WeightSharing, itself)
from frugalnas.ports.errors import ArchitectureParseError, ConfigError, check_choice, check_range
from frugalnas.ports.space import contains, describe_distribution, draw
from frugalnas.spaces.conditional import ConditionalSpace, Fill, extreme

if TYPE_CHECKING:
    from torch import nn

WIDTH_KEY = "embed_width"
DEPTH_KEY = "depth"

_BODY = re.compile(r"^w(\d+)/(.*)$", re.DOTALL)
_LAYER = re.compile(r"^h(\d+)r(\d+)$")

def layer_keys(i: int) -> tuple[str, str]:
    """The heads and MLP-ratio decisions of layer ``i`` (from 0)."""
    return f"layer{i}_heads", f"layer{i}_mlp_ratio"


class GPTGenotype(Architecture):
    """A ``gpt`` architecture with the text form of the module docstring."""

    def _format_body(self) -> str:
        d = self.decisions
        layers = [f"h{d[layer_keys(i)[0]]}r{d[layer_keys(i)[1]]}"
                  for i in range(int(d[DEPTH_KEY]))]
        return f"w{d[WIDTH_KEY]}/" + ",".join(layers)

    @classmethod
    def _parse_body(cls, space: str, body: str) -> GPTGenotype:
        match = _BODY.match(body.strip())
        if match is None:
            raise ArchitectureParseError(
                f"malformed gpt architecture {body!r}; expected w<width>/ then layers "
                "h<heads>r<mlp ratio> separated by commas, e.g. w128/h4r4,h2r2")
        decisions: dict[str, Value] = {WIDTH_KEY: int(match.group(1))}
        layers = [t.strip() for t in match.group(2).split(",") if t.strip()]
        decisions[DEPTH_KEY] = len(layers)
        for i, text in enumerate(layers):
            layer = _LAYER.match(text)
            if layer is None:
                raise ArchitectureParseError(
                    f"malformed layer {text!r} in {body!r}; expected h<heads>r<mlp ratio>, "
                    "e.g. h4r4")
            heads_key, ratio_key = layer_keys(i)
            decisions[heads_key], decisions[ratio_key] = int(layer.group(1)), int(layer.group(2))
        return cls(space, decisions)


def _choices(what: str, values: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise ConfigError(f"invalid {what} {values!r}; give positive integers") from None
    if not out or out[0] < 1:
        raise ConfigError(f"invalid {what} {list(values)!r}; give positive integers")
    return out


class GPTSpace(ConditionalSpace):
    """Decoder-only language models: embedding width, depth, per-layer heads and MLP ratio;
    options widths, min_depth, max_depth, heads, mlp_ratios, head_dim, context, positions,
    norm. Weight sharing through elastic transformer blocks.

    ``widths``, ``heads`` and ``mlp_ratios`` are the choices of the embedding width, of each
    layer's number of heads (each ``head_dim`` wide) and of each layer's MLP ratio (hidden
    units = ratio x width); the depth ranges over ``min_depth..max_depth``. ``context`` is the
    longest sequence a network reads (its positions); ``positions`` is ``"learned"`` or
    ``"rotary"``; ``norm`` is ``"layernorm"`` or ``"rmsnorm"``. Networks predict the next
    token of a ``text`` dataset (the vocabulary comes from the data)."""

    name = "gpt"
    genotype = GPTGenotype
    tasks = ("language-modelling",)
    capabilities = {
        WeightSharing: "frugalnas.spaces.gpt.supernet:GPTSharing",
        OwnEncodings: "frugalnas.spaces.gpt.encodings:GPTEncodings",
        SandwichRule: "frugalnas.spaces.gpt.space:GPTSandwich",
        ProgressiveShrinking: "frugalnas.spaces.gpt.space:GPTShrinking",
        CellGraph: itself}

    def __init__(self, widths: Sequence[int] = (64, 96, 128, 160, 192), min_depth: int = 2,
                 max_depth: int = 6, heads: Sequence[int] = (2, 4, 6),
                 mlp_ratios: Sequence[int] = (2, 3, 4), head_dim: int = 32, context: int = 256,
                 positions: str = "learned", norm: str = "layernorm"):
        self.widths = _choices("widths", widths)
        self.heads = _choices("heads", heads)
        self.mlp_ratios = _choices("mlp_ratios", mlp_ratios)
        check_range("min_depth", min_depth, 1)
        check_range("max_depth", max_depth, 1)
        if min_depth > max_depth:
            raise ConfigError(f"min_depth {min_depth} exceeds max_depth {max_depth}")
        check_range("head_dim", head_dim, 1)
        check_range("context", context, 1)
        check_choice("positions", positions, POSITIONS)
        check_choice("norm", norm, NORMS)
        self.min_depth, self.max_depth = int(min_depth), int(max_depth)
        self.head_dim, self.context = int(head_dim), int(context)
        self.positions, self.norm = positions, norm

    # -- decisions -----------------------------------------------------------------------
    def _top(self) -> dict[str, BaseDistribution]:
        return {WIDTH_KEY: CategoricalDistribution(self.widths),
                DEPTH_KEY: IntDistribution(self.min_depth, self.max_depth)}

    def _layer(self) -> tuple[BaseDistribution, BaseDistribution]:
        return CategoricalDistribution(self.heads), CategoricalDistribution(self.mlp_ratios)

    def distributions(self) -> dict[str, BaseDistribution]:
        """Every decision: width, depth, then each layer's heads and MLP ratio."""
        out = self._top()
        for i in range(self.max_depth):
            out.update(zip(layer_keys(i), self._layer()))
        return out

    def active_decisions(self, arch: Architecture) -> dict[str, BaseDistribution]:
        """Width, depth and the decisions of the layers the network has."""
        out = self._top()
        value = arch.decisions.get(DEPTH_KEY)
        depth = int(value) if contains(out[DEPTH_KEY], value) else self.max_depth  # type: ignore[arg-type]
        for i in range(depth):
            out.update(zip(layer_keys(i), self._layer()))
        return out

    def complete(self, values: Mapping[str, Any], fill: Fill) -> Architecture:
        """The architecture of ``values``; a decision it lacks or holds an invalid value for
        is asked of ``fill(key, dist)``. The depth is settled before the layers, so only the
        layers the network has are asked."""
        decisions: dict[str, Any] = {}
        for key, dist in self._top().items():
            decisions[key] = values[key] if contains(dist, values.get(key)) else fill(key, dist)
        for i in range(int(decisions[DEPTH_KEY])):
            for key, dist in zip(layer_keys(i), self._layer()):
                decisions[key] = values[key] if contains(dist, values.get(key)) \
                    else fill(key, dist)
        return self.genotype.create(self.name, decisions)

    def validate(self, arch: Architecture) -> None:
        """The depth first (which layers an architecture holds follows from it), then
        :meth:`SearchSpace.validate` over the active decisions."""
        depth, dist = arch.decisions.get(DEPTH_KEY), self._top()[DEPTH_KEY]
        if arch.space == self.name and depth is not None and not contains(dist, depth):
            raise ArchitectureParseError(
                f"invalid value {depth!r} for decision {DEPTH_KEY!r} of space {self.name!r}; "
                f"valid: {describe_distribution(dist)}")
        super().validate(arch)

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """One width, heads or ratio changed, or one layer more (a copy of the last) or
        less."""
        out: list[Architecture] = []
        d = arch.decisions
        for key, dist in self.active_decisions(arch).items():
            if isinstance(dist, CategoricalDistribution):
                out.extend(self.from_params({**d, key: c}) for c in dist.choices if c != d[key])
        depth = int(d[DEPTH_KEY])
        if depth > self.min_depth:
            out.append(self.from_params({**d, DEPTH_KEY: depth - 1}))
        if depth < self.max_depth:
            copied = dict(zip(layer_keys(depth), (d[k] for k in layer_keys(depth - 1))))
            out.append(self.from_params({**d, **copied, DEPTH_KEY: depth + 1}))
        return out

    def size(self) -> float:
        """The number of architectures."""
        per_layer = float(len(self.heads) * len(self.mlp_ratios))
        return len(self.widths) * sum(per_layer ** d
                                      for d in range(self.min_depth, self.max_depth + 1))

    def uniform(self, width: int, depth: int, heads: int, mlp_ratio: int) -> Architecture:
        """The network whose layers are all alike (nanoGPT's shape: ``uniform(128, 4, 4, 4)``
        is its small CPU configuration with 32-wide heads)."""
        values: dict[str, Any] = {WIDTH_KEY: width, DEPTH_KEY: depth}
        for i in range(depth):
            values.update(zip(layer_keys(i), (heads, mlp_ratio)))
        return self.from_params(values)

    # -- networks ------------------------------------------------------------------------
    def subnet_config(self, arch: Architecture) -> SubnetConfig:
        """The shape of ``arch`` for the elastic transformer modules."""
        self.validate(arch)
        d = arch.decisions
        width = int(d[WIDTH_KEY])
        blocks = tuple(BlockChoice(heads=int(d[layer_keys(i)[0]]),
                                   mlp_hidden=int(d[layer_keys(i)[1]]) * width)
                       for i in range(int(d[DEPTH_KEY])))
        return SubnetConfig(width=width, depth=len(blocks), blocks=blocks)

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A stand-alone language model of ``arch`` with fresh weights: ``num_classes`` is
        the vocabulary size, ``input_shape`` ``(context,)``."""
        from frugalnas.spaces.gpt.network import build_network

        return build_network(self, arch, num_classes, input_shape)

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """The network as a chain for drawings: embedding, one edge per layer labelled with
        its heads and MLP ratio, the head."""
        config = self.subnet_config(arch)
        nodes = [f"embedding ({config.width})",
                 *(f"layer {i}" for i in range(1, config.depth + 1))]
        edges = [(nodes[i], nodes[i + 1], f"{b.heads} heads, mlp {b.mlp_hidden}")
                 for i, b in enumerate(config.blocks)]
        return [*edges, (nodes[-1], "next-token head", "")]

    def describe(self) -> dict[str, Any]:
        return {"widths": list(self.widths), "depth": [self.min_depth, self.max_depth],
                "heads": list(self.heads), "mlp_ratios": list(self.mlp_ratios),
                "head_dim": self.head_dim, "context": self.context,
                "positions": self.positions, "norm": self.norm,
                "architectures": f"{self.size():.3g}"}


class GPTSandwich:
    """The sandwich rule's bounds of a GPT space: its largest and smallest networks."""

    def __init__(self, space: GPTSpace):
        self.space = space

    def sandwich_bounds(self) -> tuple[Architecture, Architecture]:
        return self.space.largest(), self.space.smallest()


class GPTShrinking:
    """Progressive shrinking over a GPT space (Once-for-All's order, for transformers as
    HAT and whittle train them): the largest network, then elastic MLP ratios, then heads,
    then depth, then width; each phase draws the decisions released so far and keeps the
    others at their largest."""

    PHASES = (("largest", ()), ("mlp ratio", ("mlp_ratio",)),
              ("heads", ("mlp_ratio", "heads")), ("depth", ("mlp_ratio", "heads", DEPTH_KEY)),
              ("width", ("mlp_ratio", "heads", DEPTH_KEY, WIDTH_KEY)))

    def __init__(self, space: GPTSpace):
        self.space = space

    def shrinking_phases(self) -> list[tuple[str, Callable[[random.Random], Architecture]]]:
        return [(name, self._sampler(released)) for name, released in self.PHASES]

    def _sampler(self, released: tuple[str, ...]) -> Callable[[random.Random], Architecture]:
        def sample(rng: random.Random) -> Architecture:
            def answer(key: str, dist: BaseDistribution) -> Any:
                if any(key == r or key.endswith(f"_{r}") for r in released):
                    return draw(dist, rng)
                return extreme(dist, largest=True)
            return self.space.complete({}, answer)
        return sample
