"""Spaces of transformer stacks: a few network-wide decisions (the embedding width, the depth,
and whatever a space adds before them, such as a patch size), then per layer the number of
attention heads and the MLP ratio. Layer ``i`` exists only when ``depth > i``, so its decisions
are conditional: an architecture holds only the decisions of the layers it has
(:meth:`LayerStackSpace.active_decisions`).

Text form: ``<space>:<top>/`` then the layers separated by ``,``, each ``h<heads>r<ratio>``;
``<top>`` is each network-wide decision's letter and value (``w128``; ``p4w64`` with a patch
size): ``gpt:w128/h4r4,h4r4,h2r2``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from frugalnas.nn.transformer import BlockChoice, SubnetConfig
from frugalnas.ports.architecture import Architecture, Value
from frugalnas.ports.errors import ArchitectureParseError, ConfigError, check_range
from frugalnas.ports.space import contains, describe_distribution, draw
from frugalnas.spaces.conditional import ConditionalSpace, Fill, extreme

WIDTH_KEY = "embed_width"
DEPTH_KEY = "depth"

_LAYER = re.compile(r"^h(\d+)r(\d+)$")
_TOP = re.compile(r"([a-z])(\d+)")


def layer_keys(i: int) -> tuple[str, str]:
    """The heads and MLP-ratio decisions of layer ``i`` (from 0)."""
    return f"layer{i}_heads", f"layer{i}_mlp_ratio"


def choices(what: str, values: Sequence[int]) -> tuple[int, ...]:
    """``values`` as sorted distinct positive integers (a one-line ConfigError otherwise)."""
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise ConfigError(f"invalid {what} {values!r}; give positive integers") from None
    if not out or out[0] < 1:
        raise ConfigError(f"invalid {what} {list(values)!r}; give positive integers")
    return out


class StackGenotype(Architecture):
    """A layer-stack architecture with the text form of the module docstring; ``LETTERS``
    names each network-wide decision before the depth by its letter."""

    LETTERS: ClassVar[dict[str, str]] = {"w": WIDTH_KEY}

    def _format_body(self) -> str:
        d = self.decisions
        top = "".join(f"{letter}{d[key]}" for letter, key in self.LETTERS.items())
        layers = [f"h{d[layer_keys(i)[0]]}r{d[layer_keys(i)[1]]}"
                  for i in range(int(d[DEPTH_KEY]))]
        return f"{top}/" + ",".join(layers)

    @classmethod
    def _parse_body(cls, space: str, body: str) -> StackGenotype:
        head, sep, rest = body.strip().partition("/")
        top = dict(_TOP.findall(head))
        expected = "".join(f"{letter}<{key}>" for letter, key in cls.LETTERS.items())
        if not sep or "".join(f"{k}{v}" for k, v in top.items()) != head or \
                set(top) != set(cls.LETTERS):
            raise ArchitectureParseError(
                f"malformed {space} architecture {body!r}; expected {expected}/ then layers "
                "h<heads>r<mlp ratio> separated by commas, e.g. "
                + "".join(f"{letter}4" for letter in cls.LETTERS) + "/h4r4,h2r2")
        decisions: dict[str, Value] = {key: int(top[letter])
                                       for letter, key in cls.LETTERS.items()}
        layers = [t.strip() for t in rest.split(",") if t.strip()]
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


class LayerStackSpace(ConditionalSpace):
    """A space of transformer stacks: ``widths`` (embedding width), depths
    ``min_depth..max_depth``, and per layer ``heads`` and ``mlp_ratios`` (hidden units =
    ratio x width). A space adds network-wide decisions before the width by extending
    :meth:`_top`."""

    network_family = "transformer"

    genotype = StackGenotype

    def __init__(self, widths: Sequence[int], min_depth: int, max_depth: int,
                 heads: Sequence[int], mlp_ratios: Sequence[int]):
        self.widths = choices("widths", widths)
        self.heads = choices("heads", heads)
        self.mlp_ratios = choices("mlp_ratios", mlp_ratios)
        check_range("min_depth", min_depth, 1)
        check_range("max_depth", max_depth, 1)
        if min_depth > max_depth:
            raise ConfigError(f"min_depth {min_depth} exceeds max_depth {max_depth}")
        self.min_depth, self.max_depth = int(min_depth), int(max_depth)

    # -- decisions -----------------------------------------------------------------------
    def _top(self) -> dict[str, BaseDistribution]:
        """The network-wide decisions, in order; the depth last."""
        return {WIDTH_KEY: CategoricalDistribution(self.widths),
                DEPTH_KEY: IntDistribution(self.min_depth, self.max_depth)}

    def _layer(self) -> tuple[BaseDistribution, BaseDistribution]:
        return CategoricalDistribution(self.heads), CategoricalDistribution(self.mlp_ratios)

    def distributions(self) -> dict[str, BaseDistribution]:
        """Every decision: the network-wide ones, then each layer's heads and MLP ratio."""
        out = self._top()
        for i in range(self.max_depth):
            out.update(zip(layer_keys(i), self._layer()))
        return out

    def active_decisions(self, arch: Architecture) -> dict[str, BaseDistribution]:
        """The network-wide decisions and those of the layers the network has."""
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
        """One network-wide choice, heads or ratio changed, or one layer more (a copy of the
        last) or less."""
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
        top = 1.0
        for dist in self._top().values():
            if isinstance(dist, CategoricalDistribution):
                top *= len(dist.choices)
        return top * sum(per_layer ** d for d in range(self.min_depth, self.max_depth + 1))

    def uniform(self, width: int, depth: int, heads: int, mlp_ratio: int,
                **top: Any) -> Architecture:
        """The network whose layers are all alike; ``top`` gives the space's other
        network-wide decisions."""
        values: dict[str, Any] = {**top, WIDTH_KEY: width, DEPTH_KEY: depth}
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

    def layer_edges(self, arch: Architecture, first: str, last: str
                    ) -> list[tuple[str, str, str]]:
        """The network as a chain for drawings: ``first``, one edge per layer labelled with
        its heads and MLP units, ``last``."""
        config = self.subnet_config(arch)
        nodes = [first, *(f"layer {i}" for i in range(1, config.depth + 1))]
        edges = [(nodes[i], nodes[i + 1], f"{b.heads} heads, mlp {b.mlp_hidden}")
                 for i, b in enumerate(config.blocks)]
        return [*edges, (nodes[-1], last, "")]

    def describe(self) -> dict[str, Any]:
        return {"widths": list(self.widths), "depth": [self.min_depth, self.max_depth],
                "heads": list(self.heads), "mlp_ratios": list(self.mlp_ratios),
                "architectures": f"{self.size():.3g}"}


class StackSandwich:
    """The sandwich rule's bounds of a layer-stack space: its largest and smallest
    networks."""

    def __init__(self, space: LayerStackSpace):
        self.space = space

    def sandwich_bounds(self) -> tuple[Architecture, Architecture]:
        return self.space.largest(), self.space.smallest()


class StackShrinking:
    """Progressive shrinking over a layer-stack space (Once-for-All's order, for transformers
    as HAT and whittle train them): the largest network, then elastic MLP ratios, then heads,
    then depth, then width and the other network-wide decisions; each phase draws the
    decisions released so far and keeps the others at their largest."""

    PHASES = (("largest", ()), ("mlp ratio", ("mlp_ratio",)),
              ("heads", ("mlp_ratio", "heads")), ("depth", ("mlp_ratio", "heads", DEPTH_KEY)),
              ("width", ("mlp_ratio", "heads", DEPTH_KEY, "*")))

    def __init__(self, space: LayerStackSpace):
        self.space = space

    def shrinking_phases(self) -> list[tuple[str, Callable[[random.Random], Architecture]]]:
        return [(name, self._sampler(released)) for name, released in self.PHASES]

    def _sampler(self, released: tuple[str, ...]) -> Callable[[random.Random], Architecture]:
        def sample(rng: random.Random) -> Architecture:
            def answer(key: str, dist: BaseDistribution) -> Any:
                if "*" in released or any(key == r or key.endswith(f"_{r}")
                                          for r in released):
                    return draw(dist, rng)
                return extreme(dist, largest=True)
            return self.space.complete({}, answer)
        return sample
