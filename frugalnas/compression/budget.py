"""A compression's budget: ``params=0.5`` (half the parent's non-embedding parameters),
``params=2e6`` (at most two million), ``latency=0.5`` (half the parent's ONNX Runtime latency,
batch 1, one block of tokens, one thread), ``latency=3`` (at most 3 ms), ``memory=0.5`` (half
the parent's inference memory: float32 weights, embeddings included, and the key/value cache
of one block at batch 1) or ``memory=20`` (at most 20 MiB)."""

from __future__ import annotations

from dataclasses import dataclass

from frugalnas.ports.errors import ConfigError

#: What a budget may bound, and the metric of a sub-network that it bounds.
METRICS = {"params": "non_embedding_params", "latency": "latency_ms", "memory": "memory_mib"}
KINDS = tuple(METRICS)
#: The unit of each kind, as progress lines print it.
UNITS = {"params": "non-embedding parameters", "latency": "ms", "memory": "MiB"}


@dataclass(frozen=True)
class Budget:
    """An upper bound on a sub-network's ``kind``: a fraction of the parent's (``value`` up to
    1) or an absolute amount (above 1)."""

    kind: str
    value: float

    @property
    def metric(self) -> str:
        """The metric of a sub-network the budget bounds."""
        return METRICS[self.kind]

    def bound(self, parent: float) -> float:
        """The bound for a parent whose metric is ``parent`` (parameters: a whole number)."""
        value = self.value * parent if self.value <= 1 else self.value
        return float(int(value)) if self.kind == "params" else float(value)

    def describe(self, parent: float) -> str:
        """``params=0.5 (75,040 non-embedding parameters)``."""
        bound = self.bound(parent)
        shown = f"{bound:,.0f}" if self.kind == "params" else f"{bound:.3g}"
        return f"{self} ({shown} {UNITS[self.kind]})"

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_budget(text: str) -> Budget:
    """The budget ``KIND=VALUE`` (one-line :class:`ConfigError` otherwise)."""
    kind, sep, raw = str(text).partition("=")
    kind = kind.strip()
    if not sep or kind not in KINDS:
        raise ConfigError(f"invalid budget {text!r}; expected KIND=VALUE with KIND one of "
                          f"{', '.join(KINDS)}, e.g. params=0.5 (half the parent's "
                          "non-embedding parameters), params=2e6, latency=0.5 or memory=0.5")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"invalid budget value {raw!r} in {text!r}; expected a number, a "
                          "fraction of the parent (0 < value <= 1) or an amount") from None
    if not value > 0:
        raise ConfigError(f"invalid budget value {raw!r} in {text!r}; it must be above 0")
    return Budget(kind, value)
