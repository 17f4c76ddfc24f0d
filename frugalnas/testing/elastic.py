"""Conformance checks for elastic blocks (:mod:`frugalnas.nn.elastic`, or a block of your own
for a space with weight sharing): a module holding the weights of its largest configuration,
with ``forward(x, config)`` and ``export(config)``."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from frugalnas.testing._suite import Suite, describe


class ElasticBlockChecks(Suite):
    """The elastic-block contract: every configuration's forward equals, bitwise, the
    stand-alone module ``export(config)`` returns (in training and in evaluation mode,
    batch-norm statistics included); an export owns copies, not the block's tensors; and
    every configuration trains the block's own parameters."""

    kind = "elastic_blocks"
    checks = ("check_export_matches_forward", "check_export_is_independent",
              "check_configurations_train_shared_weights")

    def __init__(self, block: Any, configs: Sequence[Any], input_shape: Sequence[int], *,
                 name: str | None = None, seed: int = 0):
        self.block, self.configs, self.seed = block, list(configs), seed
        self.input_shape = tuple(int(v) for v in input_shape)
        self.subject = describe("elastic block", block, name)
        if not self.configs:
            raise ValueError("check_elastic_block needs at least one configuration")

    def _input(self) -> Any:
        import torch

        return torch.randn(3, *self.input_shape, generator=torch.Generator().manual_seed(self.seed))

    def check_export_matches_forward(self) -> None:
        import torch

        x = self._input()
        for training in (True, False):
            for config in self.configs:
                block = copy.deepcopy(self.block).train(training)
                alone = block.export(config)
                if not isinstance(alone, torch.nn.Module):
                    self.fail(f"export({config}) returned {type(alone).__name__}, not an nn.Module")
                alone.train(training)
                with torch.no_grad():
                    got, expected = block(x, config), alone(x)
                if got.shape != expected.shape or not torch.equal(got, expected):
                    diff = (got - expected).abs().max().item() if got.shape == expected.shape \
                        else f"shapes {tuple(got.shape)} and {tuple(expected.shape)}"
                    mode = "training" if training else "evaluation"
                    self.fail(f"in {mode} mode, forward(x, {config}) differs from "
                              f"export({config})(x) (largest difference {diff}); they must "
                              "compute the same output from the same weights")

    def check_export_is_independent(self) -> None:
        owned = {id(p) for p in self.block.parameters()} | {id(b) for b in self.block.buffers()}
        for config in self.configs:
            alone = self.block.export(config)
            shared = [n for n, t in [*alone.named_parameters(), *alone.named_buffers()]
                      if id(t) in owned]
            if shared:
                self.fail(f"export({config}) shares {shared[:3]} with the block; an export must "
                          "hold copies (training it would change the supernet)")

    def check_configurations_train_shared_weights(self) -> None:
        params = dict(self.block.named_parameters())
        for config in self.configs:
            block = copy.deepcopy(self.block).train()
            block(self._input(), config).sum().backward()
            if all(p.grad is None or not p.grad.abs().sum() for p in block.parameters()):
                self.fail(f"forward(x, {config}) gives no gradient to the block's parameters "
                          f"({len(params)} of them)")


def check_elastic_block(block: Any, configs: Sequence[Any], input_shape: Sequence[int], *,
                        seed: int = 0, checks: list[str] | None = None) -> list[str]:
    """Run the elastic-block checks on ``block`` for each of ``configs`` with inputs of
    ``input_shape`` (without the batch axis); returns the checks run, raises
    :class:`~frugalnas.testing.ConformanceError` at the first broken rule."""
    return ElasticBlockChecks(block, configs, input_shape, seed=seed).run(checks)
