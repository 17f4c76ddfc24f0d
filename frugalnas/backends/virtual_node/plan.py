"""Virtual-node bookkeeping: batch splits, rank shares and per-virtual-node seeds.

Everything here is a pure function of its arguments, so every process computes the same
plan without talking to the others."""

from __future__ import annotations

from collections.abc import Sequence

from frugalnas.ports.errors import ConfigError

_MASK64 = (1 << 64) - 1


def split_sizes(batch_size: int, virtual_nodes: int) -> list[int]:
    """Examples per virtual node: the first ``batch_size % V`` nodes get one extra example.
    With fewer examples than nodes, the trailing nodes are empty."""
    base, extra = divmod(batch_size, virtual_nodes)
    return [base + 1] * extra + [base] * (virtual_nodes - extra)


def even_shares(virtual_nodes: int, world_size: int) -> list[int]:
    """Virtual nodes per rank when every rank is equally fast (rank 0 takes any remainder first)."""
    return split_sizes(virtual_nodes, world_size)


def check_shares(shares: Sequence[int], virtual_nodes: int, world_size: int) -> list[int]:
    """Validate a user-given split of the virtual nodes over the ranks."""
    shares = list(shares)
    if len(shares) != world_size or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                                        for s in shares):
        raise ConfigError(f"invalid shares {shares!r}; expected {world_size} non-negative integers "
                          f"(one per process)")
    if sum(shares) != virtual_nodes:
        raise ConfigError(f"invalid shares {shares!r}: they sum to {sum(shares)}, but "
                          f"virtual_nodes is {virtual_nodes}")
    return shares


def shares_from_speed(virtual_nodes: int, speeds: Sequence[float]) -> list[int]:
    """Split the virtual nodes in proportion to measured speeds (largest remainder method,
    ties to the lower rank), so faster ranks get more nodes."""
    total = float(sum(speeds))
    if total <= 0 or any(s < 0 for s in speeds):
        return even_shares(virtual_nodes, len(speeds))
    quotas = [virtual_nodes * s / total for s in speeds]
    shares = [int(q) for q in quotas]
    order = sorted(range(len(speeds)), key=lambda r: (-(quotas[r] - shares[r]), r))
    for r in order[:virtual_nodes - sum(shares)]:
        shares[r] += 1
    return shares


def offsets(shares: Sequence[int]) -> list[int]:
    """First global virtual-node index of each rank (ranks own contiguous ranges)."""
    out, acc = [], 0
    for s in shares:
        out.append(acc)
        acc += s
    return out


def vn_seed(seed: int, step: int, vn: int) -> int:
    """Random seed of virtual node ``vn`` at global ``step``: a SplitMix64 hash of
    ``(seed, step, vn)``, independent of which process runs the node."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + vn * 0x94D049BB133111EB) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)
