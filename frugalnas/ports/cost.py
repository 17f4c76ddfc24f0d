"""What an estimate cost: seconds, FLOPs, parameters, epochs, peak memory."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Cost:
    seconds: float = 0.0
    flops: float = 0.0          # forward+backward FLOPs spent by the estimate
    params: int = 0             # parameters of the candidate network
    epochs: float = 0.0         # training epochs (fractions for sub-epoch budgets)
    peak_memory: int = 0        # bytes, where the backend can measure it

    def record(self) -> dict[str, float | int]:
        """The fields by name, as a trial records them (a flat copy)."""
        return {name: getattr(self, name) for name in COST_FIELDS}

    def to_metrics(self) -> dict[str, float]:
        return {f"cost_{k}": float(v) for k, v in asdict(self).items()}

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.seconds + other.seconds, self.flops + other.flops,
                    max(self.params, other.params), self.epochs + other.epochs,
                    max(self.peak_memory, other.peak_memory))


#: The fields of :class:`Cost`, in order.
COST_FIELDS = tuple(f.name for f in fields(Cost))


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: torch.nn.Module, inputs: torch.Tensor, backward: bool = False) -> int:
    """FLOPs of one forward (and backward) pass of ``model`` on ``inputs``, counted by
    ``torch.utils.flop_counter``. The model's training mode and gradients are restored."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            if backward:
                model(inputs).sum().backward()
            else:
                with torch.no_grad():
                    model(inputs)
    finally:
        model.train(was_training)
        if backward:
            model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())
