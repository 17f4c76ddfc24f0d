"""Compressing a trained transformer: a trained language model becomes the supernet of a
search, its heads, MLP units, embedding channels and layers ordered by importance, a
sub-network searched under a budget, distilled from the parent and written back in the
format it came in (docs/compress.md)."""

from __future__ import annotations

import argparse
from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
from frugalnas.ports.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {
    "compress": "frugalnas.compression.pipeline",
    "CompressionResult": "frugalnas.compression.pipeline",
    "SubnetSpace": "frugalnas.compression.space",
    "InheritedLoss": "frugalnas.compression.estimator"})

__all__ = ["CompressionResult", "InheritedLoss", "SubnetSpace", "compress"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"gpt-subnet": LazyFactory(
        "frugalnas.compression.space:SubnetSpace",
        "Sub-networks of one trained language model, every layer alike: width, depth, heads "
        "and MLP units, built with the parent's (importance-ordered) weights; options parent, "
        "widths, heads, mlp_hidden, min_depth, steps, tied_width.")}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"inherited-loss": LazyFactory(
        "frugalnas.compression.estimator:InheritedLoss",
        "A sub-network of the ``gpt-subnet`` space scored with the weights it inherits from "
        "the trained parent, without training: validation loss in nats per token (minimise "
        "it); options valid_examples, latency.")}


@hookimpl
def frugalnas_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
                       host: Any) -> None:
    from frugalnas.compression.cli import add_command

    add_command(subparsers)
