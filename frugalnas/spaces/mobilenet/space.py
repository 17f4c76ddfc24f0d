"""The ``mobilenet`` macro space: stages of inverted residuals (MBConv) with a searched depth
per stage and a searched kernel, expansion ratio and squeeze-excite per block, in the manner
of MobileNetV2/V3 and Once-for-All.

A network is: optional resize to the input resolution (fixed by ``resolution`` or searched
among ``resolutions``), stem convolution, one fixed MBConv (ratio 1,
kernel 3), the searched stages, a 1x1 head convolution, global pooling and a classifier.
Block ``b`` of a stage exists only when the stage's depth exceeds ``b``, so its decisions are
conditional: an architecture holds only the decisions of the blocks it has
(:meth:`MobileNetSpace.active_decisions`).

Text form: stages separated by ``|``, blocks by ``,``; a block is ``k<kernel>e<ratio>``,
followed by ``s`` when it has squeeze-excite. ``mobilenet:k3e6,k3e6|k5e4s,k3e3,k3e3|...``
A searched resolution comes first: ``mobilenet:r20/k3e6,k3e6|...``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
)

from frugalnas.nn.elastic import MBConvConfig, make_divisible
from frugalnas.ports.architecture import Architecture, Value
from frugalnas.ports.capabilities import (CellGraph, OwnEncodings, ProgressiveShrinking,
                                          SandwichRule, WeightSharing, itself)
from frugalnas.ports.errors import ArchitectureParseError, ConfigError, check_range
from frugalnas.ports.space import contains, describe_distribution, draw
from frugalnas.spaces.conditional import ConditionalSpace, Fill
from frugalnas.spaces.mobilenet.network import build_network

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Stage:
    """One searched stage: output ``channels`` (before the width multiplier), at most
    ``depth`` blocks, the first with ``stride``."""

    channels: int
    depth: int
    stride: int


#: MobileNetV2's stages after its first bottleneck (Sandler et al., CVPR 2018, table 2):
#: channels, number of blocks, stride of the first.
MOBILENET_V2_STAGES: tuple[Stage, ...] = (
    Stage(24, 2, 2), Stage(32, 3, 2), Stage(64, 4, 2), Stage(96, 3, 1), Stage(160, 3, 2),
    Stage(320, 1, 1))
_BLOCK = re.compile(r"^k(\d+)e(\d+)(s?)$")
_RESOLUTION = re.compile(r"^r(\d+)/(.*)$", re.DOTALL)
#: The decision holding a network's input resolution, when the space searches it.
RESOLUTION_KEY = "resolution"


def depth_key(s: int) -> str:
    return f"stage{s}_depth"


def block_keys(s: int, b: int) -> tuple[str, str, str]:
    """The kernel, expansion and squeeze-excite decisions of block ``b`` of stage ``s``."""
    prefix = f"stage{s}_block{b}"
    return f"{prefix}_kernel", f"{prefix}_expand", f"{prefix}_se"


class MobileNetGenotype(Architecture):
    """A ``mobilenet`` architecture with the compact text form of the module docstring."""

    def _format_body(self) -> str:
        d, stages, s = self.decisions, [], 1
        prefix = f"r{d[RESOLUTION_KEY]}/" if RESOLUTION_KEY in d else ""
        while depth_key(s) in d:
            blocks = []
            for b in range(int(d[depth_key(s)])):
                kernel, expand, se = (d[k] for k in block_keys(s, b))
                blocks.append(f"k{kernel}e{expand}{'s' if se else ''}")
            stages.append(",".join(blocks))
            s += 1
        return prefix + "|".join(stages)

    @classmethod
    def _parse_body(cls, space: str, body: str) -> MobileNetGenotype:
        decisions: dict[str, Value] = {}
        body = body.strip()
        resolution = _RESOLUTION.match(body)
        if resolution is not None:
            decisions[RESOLUTION_KEY] = int(resolution.group(1))
            body = resolution.group(2).strip()
        for s, stage in enumerate(body.split("|"), start=1):
            blocks = [b for b in stage.split(",") if b]
            decisions[depth_key(s)] = len(blocks)
            for b, text in enumerate(blocks):
                match = _BLOCK.match(text.strip())
                if match is None:
                    raise ArchitectureParseError(
                        f"malformed block {text!r} in stage {s} of {body!r}; expected "
                        "k<kernel>e<ratio>, then 's' for squeeze-excite, e.g. k5e6s")
                kernel_key, expand_key, se_key = block_keys(s, b)
                decisions[kernel_key] = int(match.group(1))
                decisions[expand_key] = int(match.group(2))
                decisions[se_key] = bool(match.group(3))
        return cls(space, decisions)


def _parse_resolutions(resolutions: Sequence[int] | None,
                       fixed: int | None) -> tuple[int, ...] | None:
    if resolutions is None:
        return None
    if fixed is not None:
        raise ConfigError(f"give either resolution ({fixed}, fixed) or resolutions "
                          f"({list(resolutions)}, searched), not both")
    if isinstance(resolutions, (str, bytes)) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 8 for r in resolutions) \
            or not resolutions:
        raise ConfigError(f"invalid resolutions {resolutions!r}; valid: a list of input sides "
                          "of at least 8 pixels, e.g. [16, 20, 24, 28]")
    return tuple(sorted(set(resolutions)))


def _parse_stages(stages: Any) -> tuple[Stage, ...]:
    if stages is None or stages == "v2":
        return MOBILENET_V2_STAGES
    if isinstance(stages, str):
        raise ConfigError(f"unknown stages {stages!r}; valid: 'v2' or a list of "
                          "[channels, depth, stride] triples")
    out = []
    for item in stages:
        values = list(item.values()) if isinstance(item, Mapping) else list(item)
        if len(values) != 3 or not all(isinstance(v, int) and v >= 1 for v in values):
            raise ConfigError(f"invalid stage {item!r}; expected [channels, depth, stride] of "
                              "positive integers")
        out.append(Stage(*values))
    if not out:
        raise ConfigError("a mobilenet space needs at least one stage")
    return tuple(out)


class MobileNetSpace(ConditionalSpace):
    """MobileNetV2/V3-like macro space: per stage depth, per block kernel 3/5/7, expansion
    3/4/6 and squeeze-excite; options width_mult, resolution or searched resolutions, stages,
    kernels, expand_ratios, se, min_depth. Weight sharing through elastic blocks.

    Inverted-residual stages with searched depth (``min_depth`` up to each stage's
    depth), kernels (``kernels``), expansion ratios (``expand_ratios``) and squeeze-excite
    (``se``: searched when true, never used when false). ``width_mult`` scales every
    channel count (rounded to multiples of 8). ``resolution`` resizes the input first
    (None keeps it); ``resolutions`` instead makes the input side a decision (``resolution``,
    asked before any other), elastic resolution as in Once-for-All: one supernet serves every
    side. ``stem_stride`` is 2, or 1 (the default for inputs, or largest searched side, of
    at most 64 pixels). ``stages`` is ``"v2"`` (MobileNetV2's) or a list of ``[channels, depth,
    stride]``. Every network is built from elastic blocks when weights are shared
    (its ``WeightSharing`` capability), so the space has a supernet of its own."""

    network_family = "convolutional"

    name = "mobilenet"
    genotype = MobileNetGenotype
    capabilities = {
        WeightSharing: "frugalnas.spaces.mobilenet.supernet:MobileNetSharing",
        OwnEncodings: "frugalnas.spaces.mobilenet.encodings:MobileNetEncodings",
        SandwichRule: "frugalnas.spaces.mobilenet.space:MobileNetSandwich",
        ProgressiveShrinking: "frugalnas.spaces.mobilenet.space:MobileNetShrinking",
        CellGraph: itself}

    def __init__(self, width_mult: float = 1.0, kernels: Sequence[int] = (3, 5, 7),
                 expand_ratios: Sequence[int] = (3, 4, 6), se: bool = True, min_depth: int = 1,
                 stages: Any = "v2", resolution: int | None = None,
                 resolutions: Sequence[int] | None = None, stem_stride: int | None = None,
                 stem_channels: int = 32, first_channels: int = 16, head_channels: int = 1280,
                 dropout: float = 0.0):
        check_range("width_mult", width_mult, 0.05, 4.0)
        check_range("min_depth", min_depth, 1)
        if resolution is not None:
            check_range("resolution", resolution, 8)
        self.resolutions = _parse_resolutions(resolutions, resolution)
        if stem_stride not in (None, 1, 2):
            raise ConfigError(f"invalid stem_stride {stem_stride!r}; valid: 1, 2 or None (auto)")
        check_range("dropout", dropout, 0.0, 0.99)
        self.kernels = tuple(sorted({int(k) for k in kernels}))
        if not self.kernels or any(k < 1 or k % 2 == 0 for k in self.kernels):
            raise ConfigError(f"invalid kernels {list(kernels)!r}; valid: odd sizes such as 3, 5, 7")
        self.expand_ratios = tuple(sorted({int(e) for e in expand_ratios}))
        if not self.expand_ratios or self.expand_ratios[0] < 1 or (
                1 in self.expand_ratios and len(self.expand_ratios) > 1):
            raise ConfigError(f"invalid expand_ratios {list(expand_ratios)!r}; valid: ratios "
                              ">= 2 such as 3, 4, 6 (or 1 alone: no expansion layer)")
        self.width_mult, self.se, self.min_depth = float(width_mult), bool(se), int(min_depth)
        self.stages = _parse_stages(stages)
        too_shallow = [s.depth for s in self.stages if s.depth < self.min_depth]
        if too_shallow:
            raise ConfigError(f"min_depth {min_depth} exceeds a stage's depth ({too_shallow[0]})")
        self.resolution, self.stem_stride = resolution, stem_stride
        self.stem_channels, self.first_channels = int(stem_channels), int(first_channels)
        self.head_channels, self.dropout = int(head_channels), float(dropout)

    # -- channels and shapes -------------------------------------------------------------
    def scaled_channels(self, channels: int) -> int:
        return make_divisible(channels * self.width_mult)

    def stage_channels(self) -> list[tuple[int, int]]:
        """``(in, out)`` channels of each searched stage."""
        cin, out = self.scaled_channels(self.first_channels), []
        for stage in self.stages:
            cout = self.scaled_channels(stage.channels)
            out.append((cin, cout))
            cin = cout
        return out

    def head_width(self) -> int:
        return self.scaled_channels(self.head_channels) if self.width_mult > 1.0 \
            else self.head_channels

    def stem_stride_for(self, input_shape: Sequence[int]) -> int:
        if self.stem_stride is not None:
            return self.stem_stride
        side = self.resolution or (self.resolutions[-1] if self.resolutions else None) \
            or int(input_shape[-1])
        return 1 if side <= 64 else 2

    def resolution_of(self, arch: Architecture) -> int | None:
        """The side ``arch``'s network resizes its input to (None: as given)."""
        if self.resolutions is not None:
            return int(arch.decisions[RESOLUTION_KEY])
        return self.resolution

    def _resolution_dist(self) -> dict[str, BaseDistribution]:
        if self.resolutions is None:
            return {}
        return {RESOLUTION_KEY: CategoricalDistribution(list(self.resolutions))}

    # -- decisions -----------------------------------------------------------------------
    def _block_dists(self) -> tuple[BaseDistribution, BaseDistribution, BaseDistribution]:
        return (CategoricalDistribution(list(self.kernels)),
                CategoricalDistribution(list(self.expand_ratios)),
                CategoricalDistribution([False, True] if self.se else [False]))

    def distributions(self) -> dict[str, BaseDistribution]:
        """Every decision: the searched resolution, each stage's depth, then every block's
        kernel, ratio and SE."""
        out: dict[str, BaseDistribution] = self._resolution_dist()
        block = self._block_dists()
        for s, stage in enumerate(self.stages, start=1):
            out[depth_key(s)] = IntDistribution(self.min_depth, stage.depth)
            for b in range(stage.depth):
                out.update(zip(block_keys(s, b), block))
        return out

    def active_decisions(self, arch: Architecture) -> dict[str, BaseDistribution]:
        """The searched resolution, each stage's depth and the decisions of the blocks it
        has."""
        return self._active({**arch.decisions})

    def _active(self, values: Mapping[str, Any]) -> dict[str, BaseDistribution]:
        out: dict[str, BaseDistribution] = self._resolution_dist()
        block = self._block_dists()
        for s, stage in enumerate(self.stages, start=1):
            depth_dist = IntDistribution(self.min_depth, stage.depth)
            out[depth_key(s)] = depth_dist
            depth = values.get(depth_key(s))
            depth = int(depth) if contains(depth_dist, depth) else stage.depth
            for b in range(depth):
                out.update(zip(block_keys(s, b), block))
        return out

    def complete(self, values: Mapping[str, Any], fill: Fill) -> Architecture:
        """The architecture whose decisions come from ``values``; a decision ``values`` lacks
        (or holds an invalid value for) is asked of ``fill(key, dist)``. Each stage's depth is
        settled before its blocks are, so only the blocks the network has are asked."""
        decisions: dict[str, Any] = {}
        for key, dist in self._resolution_dist().items():
            decisions[key] = values[key] if contains(dist, values.get(key)) else fill(key, dist)
        block = self._block_dists()
        for s, stage in enumerate(self.stages, start=1):
            depth_dist = IntDistribution(self.min_depth, stage.depth)
            key = depth_key(s)
            decisions[key] = values[key] if contains(depth_dist, values.get(key)) \
                else fill(key, depth_dist)
            for b in range(int(decisions[key])):
                for k, dist in zip(block_keys(s, b), block):
                    decisions[k] = values[k] if contains(dist, values.get(k)) else fill(k, dist)
        return self.genotype.create(self.name, decisions)

    def validate(self, arch: Architecture) -> None:
        """The depths first (which blocks an architecture holds follows from them), then
        :meth:`SearchSpace.validate` over the active decisions."""
        decisions = arch.decisions
        for s, stage in enumerate(self.stages, start=1):
            key, dist = depth_key(s), IntDistribution(self.min_depth, stage.depth)
            if arch.space == self.name and key in decisions and not contains(dist, decisions[key]):
                raise ArchitectureParseError(
                    f"invalid value {decisions[key]!r} for decision {key!r} of space "
                    f"{self.name!r}; valid: {describe_distribution(dist)}")
        super().validate(arch)

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """One resolution, kernel, ratio or SE changed, or one stage one block deeper (the new block
        copies the stage's last one) or shallower."""
        out: list[Architecture] = []
        d = arch.decisions
        for key, dist in self.active_decisions(arch).items():
            if isinstance(dist, CategoricalDistribution):
                out.extend(self.from_params({**d, key: c}) for c in dist.choices if c != d[key])
        for s, stage in enumerate(self.stages, start=1):
            depth = int(d[depth_key(s)])
            if depth > self.min_depth:
                out.append(self.from_params({**d, depth_key(s): depth - 1}))
            if depth < stage.depth:
                copied = {new: d[old] for new, old in zip(block_keys(s, depth),
                                                          block_keys(s, depth - 1))}
                out.append(self.from_params({**d, **copied, depth_key(s): depth + 1}))
        return out

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """The macro network as a chain for drawings: one edge per stage from the stem
        onwards, labelled with the stage's blocks (``k5e4s, k3e3``)."""
        text = self.genotype.create(self.name, arch.decisions)._format_body()
        body = text.rpartition("/")[2].split("|")   # the stages, without a resolution
        side = self.resolution_of(arch)
        stem = f"stem ({side}x{side})" if self.resolutions is not None else "stem"
        nodes = [stem, *(f"stage {s}" for s in range(1, len(body) + 1))]
        return [(nodes[i], nodes[i + 1], blocks.replace(",", ", ")) for i, blocks in enumerate(body)]

    def size(self) -> float:
        """The number of architectures."""
        per_block = len(self.kernels) * len(self.expand_ratios) * (2 if self.se else 1)
        total = float(len(self.resolutions or (None,)))
        for stage in self.stages:
            total *= sum(float(per_block) ** d for d in range(self.min_depth, stage.depth + 1))
        return total

    # -- networks ------------------------------------------------------------------------
    def block_configs(self, arch: Architecture) -> list[list[Any]]:
        """Per stage, the :class:`~frugalnas.nn.elastic.MBConvConfig` of each block."""
        self.validate(arch)
        d = arch.decisions
        return [[MBConvConfig(int(d[block_keys(s, b)[0]]), int(d[block_keys(s, b)[1]]),
                              bool(d[block_keys(s, b)[2]]))
                 for b in range(int(d[depth_key(s)]))]
                for s in range(1, len(self.stages) + 1)]

    def mobilenet_v2(self, resolution: int | None = None) -> Architecture:
        """MobileNetV2's own point of the space (every stage at full depth, kernel 3, ratio 6,
        no SE), when the space holds it; where the space searches the resolution, at
        ``resolution`` (default: the largest)."""
        values: dict[str, Any] = {}
        if self.resolutions is not None:
            values[RESOLUTION_KEY] = self.resolutions[-1] if resolution is None else resolution
        elif resolution is not None:
            raise ConfigError(f"space {self.name!r} does not search the resolution; "
                              "give resolutions=[...] to the space to choose one")
        for s, stage in enumerate(self.stages, start=1):
            values[depth_key(s)] = stage.depth
            for b in range(stage.depth):
                values.update(zip(block_keys(s, b), (3, 6, False)))
        return self.from_params(values)

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A stand-alone network of plain torch modules with fresh weights."""
        return build_network(self, arch, num_classes, input_shape)

    def describe(self) -> dict[str, Any]:
        return {"stages": [[s.channels, s.depth, s.stride] for s in self.stages],
                "width_mult": self.width_mult, "kernels": list(self.kernels),
                "expand_ratios": list(self.expand_ratios), "se": self.se,
                "min_depth": self.min_depth, "resolution": self.resolution,
                "resolutions": list(self.resolutions) if self.resolutions else None,
                "architectures": f"{self.size():.3g}"}


class MobileNetSandwich:
    """The sandwich rule's bounds of a MobileNet space: its largest and smallest networks."""

    def __init__(self, space: MobileNetSpace):
        self.space = space

    def sandwich_bounds(self) -> tuple[Architecture, Architecture]:
        return self.space.largest(), self.space.smallest()


class MobileNetShrinking:
    """Progressive shrinking of a MobileNet space, in Once-for-All's order."""

    def __init__(self, space: MobileNetSpace):
        self.space = space

    def shrinking_phases(self) -> list[tuple[str, Any]]:
        """Once-for-All's order: the largest network, then elastic kernels (and SE), then
        elastic depth, then elastic expansion ratios (the whole space). A searched resolution
        is drawn in every phase, as Once-for-All samples the input size throughout."""
        def fixed(drawn: set[str]) -> Any:
            def sampler(rng: random.Random) -> Architecture:
                def answer(key: str, dist: BaseDistribution) -> Any:
                    kind = "depth" if key.endswith("_depth") else key.rsplit("_", 1)[-1]
                    if kind in drawn or key == RESOLUTION_KEY:
                        return draw(dist, rng)
                    return dist.high if isinstance(dist, IntDistribution) else dist.choices[-1]
                return self.space.complete({}, answer)
            return sampler

        return [("largest", fixed(set())), ("elastic kernel", fixed({"kernel", "se"})),
                ("elastic depth", fixed({"kernel", "se", "depth"})),
                ("elastic expand", fixed({"kernel", "se", "depth", "expand"}))]
