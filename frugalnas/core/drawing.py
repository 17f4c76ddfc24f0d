"""PNG drawings for MLflow: a cell's graph, and a study's best-so-far curve / Pareto front."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from matplotlib.figure import Figure


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def draw_cell(title: str, edges: Sequence[tuple[str, str, str]], decisions: dict[str, object]) -> bytes:
    """Nodes on a line, each edge an arc labelled with its operation. Without edges the
    decisions are listed as text."""
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.86))
    ax.set_axis_off()
    fig.suptitle(title, fontsize=8)
    if not edges:
        text = "\n".join(f"{k} = {v}" for k, v in decisions.items())
        ax.text(0.0, 1.0, text, va="top", family="monospace", fontsize=7)
        return _png(fig)
    nodes: list[str] = []
    for src, dst, _ in edges:
        for n in (src, dst):
            if n not in nodes:
                nodes.append(n)
    xs = {n: i for i, n in enumerate(nodes)}
    for k, (src, dst, label) in enumerate(edges):
        x0, x1 = xs[src], xs[dst]
        height = 0.35 * abs(x1 - x0) * (1 if k % 2 == 0 else -1)
        steps = 24
        px = [x0 + (x1 - x0) * t / steps for t in range(steps + 1)]
        py = [height * math.sin(math.pi * t / steps) for t in range(steps + 1)]
        ax.plot(px, py, color="tab:blue", lw=1)
        ax.annotate("", xy=(px[-1], py[-1]), xytext=(px[-3], py[-3]),
                    arrowprops={"arrowstyle": "->", "color": "tab:blue"})
        ax.text((x0 + x1) / 2, height, label, ha="center", va="center", fontsize=6,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"})
    ax.scatter(range(len(nodes)), [0] * len(nodes), s=260, color="tab:orange", zorder=3)
    for n, x in xs.items():
        ax.text(x, 0, n, ha="center", va="center", fontsize=7, zorder=4)
    span = max(1, len(nodes) - 1)
    ax.set_xlim(-0.5, span + 0.5)
    ax.set_ylim(-0.4 * span, 0.4 * span)
    return _png(fig)


def draw_best_so_far(numbers: Sequence[int], values: Sequence[float], maximize: bool,
                     title: str) -> bytes:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    best, curve = None, []
    for v in values:
        best = v if best is None else (max(best, v) if maximize else min(best, v))
        curve.append(best)
    ax.scatter(numbers, values, s=8, alpha=0.5, label="trial value")
    ax.step(numbers, curve, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("trial number")
    ax.set_ylabel("objective")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def draw_pareto(points: Sequence[Sequence[float]], front: Sequence[Sequence[float]],
                names: Sequence[str], title: str) -> bytes:
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, alpha=0.4, label="trials")
    front = sorted(front)
    ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="tab:red", ms=4,
            label="Pareto front")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)
