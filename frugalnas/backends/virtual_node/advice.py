"""When virtual nodes cost throughput.

Each virtual node runs the whole network's forward and backward on its share of the batch.
Below some examples per node the device is no longer kept busy (on a GPU each kernel launch
costs more than the work it launches; on a CPU each operator's Python and dispatch do), so
splitting the batch costs examples per second. :func:`measure_node_batch` times one pass at the
per-node batch and at doubling sizes up to the whole batch, and :class:`NodeBatchAdvice` says
where that line lies on this device, for this network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: The share of one whole-batch pass's examples per second a per-node batch may lose.
TOLERANCE = 0.1


@dataclass(frozen=True)
class NodeBatchAdvice:
    """Examples per second measured at per-node batch sizes (the configured one, doubling up
    to the whole batch) on one device."""

    nodes: int
    batch: int
    device: str
    speeds: dict[int, float]

    @property
    def per_node(self) -> int:
        return min(self.speeds)

    @property
    def relative(self) -> float:
        """The configured per-node batch's examples per second over the whole batch's."""
        return self.speeds[self.per_node] / self.speeds[self.batch]

    @property
    def threshold(self) -> int:
        """The smallest measured per-node batch within :data:`TOLERANCE` of the whole batch's
        examples per second."""
        best = self.speeds[self.batch]
        return min(n for n, v in self.speeds.items() if v >= (1 - TOLERANCE) * best)

    def text(self) -> str:
        head = (f"virtual nodes: {self.nodes} nodes of {self.per_node} examples (batch "
                f"{self.batch}) run at {self.relative:.2f}x the examples/s of one pass over the "
                f"batch on {self.device}")
        if self.threshold <= self.per_node:
            return f"{head}; nodes of {self.per_node} or more examples keep within " \
                   f"{TOLERANCE:.0%} of it"
        return (f"{head}; below {self.threshold} examples per node virtual nodes cost more "
                f"than {TOLERANCE:.0%} of the throughput here (fewer, larger nodes, or more "
                "devices, keep it)")


def measure_node_batch(examples_per_second: Callable[[int], float], nodes: int, batch: int,
                       device: str) -> NodeBatchAdvice:
    """Time ``examples_per_second(n)`` at the per-node batch ``ceil(batch / nodes)`` and at
    doubling sizes up to ``batch``."""
    sizes, n = [], max(1, math.ceil(batch / nodes))
    while n < batch:
        sizes.append(n)
        n *= 2
    sizes.append(batch)
    return NodeBatchAdvice(nodes, batch, device, {n: examples_per_second(n) for n in sizes})
