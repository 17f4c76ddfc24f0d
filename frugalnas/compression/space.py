"""The ``gpt-subnet`` space: the sub-networks of one trained language model (a
:mod:`~frugalnas.compression.checkpoint` folder), every layer alike, as Minitron prunes and as a
Hugging Face config can hold them. A network is built with the parent's weights: the first
``width`` embedding channels, the ``depth`` most important layers, each with its first
``heads`` heads and ``mlp_hidden`` MLP units (after :func:`~frugalnas.compression.importance.
reorder`, the most important ones).

The choices come from the parent (``steps`` evenly spaced fractions of its width and MLP
units, every head count that fills whole key/value groups, depths ``min_depth..max``) or are
given. ``tied_width`` (a GPT-2 parent) makes the width follow the heads: ``heads x
head_dim``, as GPT-2 splits its width into its heads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from torch import nn

from frugalnas.compression.checkpoint import read_checkpoint
from frugalnas.nn.transformer import BlockChoice, ElasticGPT, GPTConfig, SubnetConfig
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.space import SearchSpace

WIDTH, DEPTH, HEADS, HIDDEN = "width", "depth", "heads", "mlp_hidden"
#: Bytes of one float32 value: the weights and caches of a written model.
FLOAT32 = 4
MIB = 2 ** 20


@dataclass(frozen=True)
class Shape:
    """A sub-network whose layers are all alike."""

    width: int
    depth: int
    heads: int
    mlp_hidden: int

    def subnet(self) -> SubnetConfig:
        return SubnetConfig(self.width, self.depth,
                            (BlockChoice(self.heads, self.mlp_hidden),) * self.depth)

    def __str__(self) -> str:
        return (f"width {self.width}, {self.depth} layers, {self.heads} heads, "
                f"{self.mlp_hidden} MLP units")


def fractions(largest: int, steps: int, multiple: int) -> tuple[int, ...]:
    """``steps`` evenly spaced sizes up to ``largest``, each rounded to ``multiple`` (at least
    ``multiple``; ``largest`` itself always included)."""
    sizes = {max(multiple, round(largest * k / steps / multiple) * multiple)
             for k in range(1, steps + 1)}
    return tuple(sorted({min(s, largest) for s in sizes} | {largest}))


def _given(what: str, values: Sequence[int] | None, largest: int) -> tuple[int, ...] | None:
    if values is None:
        return None
    try:
        out = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise ConfigError(f"invalid {what} {values!r}; give positive integers") from None
    if not out or out[0] < 1 or out[-1] > largest:
        raise ConfigError(f"invalid {what} {list(values)!r}; give integers from 1 to the "
                          f"parent's {largest}")
    return out


class SubnetSpace(SearchSpace):
    """Sub-networks of one trained language model, every layer alike: width, depth, heads and
    MLP units, built with the parent's (importance-ordered) weights; options parent, widths,
    heads, mlp_hidden, min_depth, steps, tied_width.

    ``parent`` is a frugalnas checkpoint folder (``frugalnas compress`` writes the reordered
    parent as one); the other options narrow the choices, which default to ``steps`` evenly
    spaced fractions of the parent's sizes."""

    network_family = "transformer"

    name = "gpt-subnet"
    tasks = ("language-modelling",)

    def __init__(self, parent: str, widths: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, mlp_hidden: Sequence[int] | None = None,
                 min_depth: int = 1, steps: int = 8, tied_width: bool = False):
        self.parent_dir = Path(str(parent)).expanduser()
        model, about = read_checkpoint(self.parent_dir)
        self._parent: ElasticGPT | None = model
        config: GPTConfig = model.config
        self.config, self.about = config, about
        check_range("steps", steps, 1)
        check_range("min_depth", min_depth, 1, config.max_depth)
        group = config.group
        self.group, self.tied_width = int(group), bool(tied_width)
        self.heads = _given("heads", heads, config.max_heads) or \
            tuple(range(group, config.max_heads + 1, group))
        bad = [h for h in self.heads if h % group]
        if bad:
            raise ConfigError(f"heads {bad} do not fill whole key/value groups of {group}; "
                              f"valid: multiples of {group} up to {config.max_heads}")
        self.widths = _given("widths", widths, config.max_width) or \
            fractions(config.max_width, steps, 8 if config.max_width >= 64 else 1)
        self.mlp_hidden = _given("mlp_hidden", mlp_hidden, config.max_mlp_hidden) or \
            fractions(config.max_mlp_hidden, steps, 8 if config.max_mlp_hidden >= 64 else 1)
        self.min_depth = int(min_depth)
        if self.tied_width:
            too_wide = [h for h in self.heads if h * config.head_dim > config.max_width]
            if too_wide:
                raise ConfigError(f"heads {too_wide} x head_dim {config.head_dim} exceed the "
                                  f"parent's width {config.max_width}")

    # -- the parent ------------------------------------------------------------------------
    def parent(self) -> ElasticGPT:
        """The parent network (read once per process)."""
        if self._parent is None:
            self._parent, _ = read_checkpoint(self.parent_dir)
        return self._parent

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_parent": None}   # child processes read the folder

    # -- decisions -------------------------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        out: dict[str, BaseDistribution] = {}
        if not self.tied_width:
            out[WIDTH] = CategoricalDistribution(self.widths)
        out[DEPTH] = IntDistribution(self.min_depth, self.config.max_depth)
        out[HEADS] = CategoricalDistribution(self.heads)
        out[HIDDEN] = CategoricalDistribution(self.mlp_hidden)
        return out

    def shape(self, arch: Architecture) -> Shape:
        """The sub-network ``arch`` names."""
        self.validate(arch)
        d = arch.decisions
        heads = int(d[HEADS])
        width = heads * self.config.head_dim if self.tied_width else int(d[WIDTH])
        return Shape(width, int(d[DEPTH]), heads, int(d[HIDDEN]))

    def of_shape(self, shape: Shape) -> Architecture:
        """The architecture of ``shape`` (its sizes must be among the choices)."""
        values: dict[str, Any] = {DEPTH: shape.depth, HEADS: shape.heads, HIDDEN: shape.mlp_hidden}
        if not self.tied_width:
            values[WIDTH] = shape.width
        return self.from_params(values)

    def non_embedding_params(self, arch: Architecture) -> int:
        """Parameters of the sub-network's layers and final norm."""
        return self.parent().non_embedding_params(self.shape(arch).subnet())

    def memory_mib(self, arch: Architecture) -> float:
        """The sub-network's inference memory (:func:`inference_mib`)."""
        return inference_mib(self.parent(), self.shape(arch).subnet())

    def size(self, shape: Shape) -> float:
        """Non-embedding parameters of ``shape``."""
        return float(self.parent().non_embedding_params(shape.subnet()))

    def anchors(self, bound: float, depths: int = 3,
                measure: Callable[[Shape], float] | None = None) -> list[Architecture]:
        """Sub-networks a search starts from: for each of the ``depths`` largest depths, the
        largest whose ``measure`` (default: non-embedding parameters) fits ``bound`` when the
        width, heads and MLP units shrink by one factor, and when only the heads and MLP
        units do (Minitron's width pruning); distinct, feasible ones only."""
        out: list[Architecture] = []
        top = self.config.max_depth
        for depth in range(top, max(self.min_depth, top - depths + 1) - 1, -1):
            for keep_width in (False, True):
                arch = self._largest_fitting(bound, depth, keep_width, measure or self.size)
                if arch is not None and arch not in out:
                    out.append(arch)
        return out

    def _largest_fitting(self, bound: float, depth: int, keep_width: bool,
                         measure: Callable[[Shape], float]) -> Architecture | None:
        c = self.config
        for step in range(100, 0, -1):
            f = step / 100
            heads = _at_most(self.heads, c.max_heads * f)
            width = heads * c.head_dim if self.tied_width else \
                (max(self.widths) if keep_width else _at_most(self.widths, c.max_width * f))
            shape = Shape(width, depth, heads, _at_most(self.mlp_hidden, c.max_mlp_hidden * f))
            if measure(shape) <= bound:
                return self.of_shape(shape)
        return None

    # -- networks --------------------------------------------------------------------------
    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """The sub-network of ``arch`` as a stand-alone network holding copies of the
        parent's weights (not fresh ones: this space compresses a trained model)."""
        config = self.config
        if num_classes > config.vocab_size:
            raise ConfigError(f"the data have {num_classes} tokens, the parent's vocabulary "
                              f"{config.vocab_size}: tokenize the text with the parent's "
                              "tokenizer")
        if len(input_shape) != 1 or input_shape[0] > config.context:
            raise ConfigError(f"space {self.name!r} needs token blocks of at most the "
                              f"parent's {config.context} positions, got examples of shape "
                              f"{tuple(input_shape)}")
        return self.parent().export(self.shape(arch).subnet()).eval()

    def describe(self) -> dict[str, Any]:
        return {"parent": str(self.parent_dir), "widths": list(self.widths),
                "depth": [self.min_depth, self.config.max_depth], "heads": list(self.heads),
                "mlp_hidden": list(self.mlp_hidden), "tied_width": self.tied_width}


def _at_most(choices: Sequence[int], value: float) -> int:
    """The largest choice not above ``value`` (the smallest choice when none is)."""
    fitting = [c for c in choices if c <= value]
    return max(fitting) if fitting else min(choices)


def inference_mib(model: ElasticGPT, config: SubnetConfig | None = None) -> float:
    """The memory an inference of ``model``'s sub-network ``config`` (None: the largest)
    holds, in MiB: its float32 weights, embeddings and head included (a head tied to the
    embedding counted once), and the key/value cache of one full block of the model's context
    at batch 1."""
    config = config or model.largest()
    c = model.config
    embeddings = c.vocab_size * config.width * (1 if c.tie_weights else 2)
    if c.positions == "learned":
        embeddings += c.context * config.width
    weights = model.non_embedding_params(config) + embeddings
    kv_heads = sum(choice.heads // c.group for choice in config.blocks)
    cache = 2 * kv_heads * c.head_dim * c.context
    return (weights + cache) * FLOAT32 / MIB


def shrink(model: ElasticGPT, shape: Shape) -> ElasticGPT:
    """A new :class:`ElasticGPT` whose largest network is ``model``'s sub-network ``shape``,
    with copies of its weights (the child a compression distils and writes)."""
    dense = model.export(shape.subnet())
    config = dataclasses.replace(model.config, max_width=shape.width, max_depth=shape.depth,
                                 max_heads=shape.heads, max_mlp_hidden=shape.mlp_hidden,
                                 kv_heads=shape.heads // model.config.group)
    child = ElasticGPT.from_config(config)
    child.load_state_dict(dense.state_dict(), strict=True)
    return child.train(model.training)
