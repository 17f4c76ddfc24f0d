"""PNG drawings for MLflow: a cell's graph, and a study's best-so-far curve / Pareto front,
with axes named after the objectives and their units (:func:`objective_label`)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure



def _png(fig: "Figure") -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


WHITE, BLACK, BLUE, ORANGE = 0, 1, 2, 3


def draw_cell(title: str, edges: Sequence[tuple[str, str, str]], decisions: dict[str, object]) -> bytes:
    """Nodes on a line, each edge an arc labelled with its operation; without edges the
    decisions are listed as text. Drawn with Pillow: a few milliseconds per cell, so it can
    be made for every trial."""
    from PIL import Image, ImageDraw

    width, height = 640, 380
    # a 4-colour palette image: small and quick to encode
    img = Image.new("P", (width, height), WHITE)
    img.putpalette([255, 255, 255, 0, 0, 0, 31, 119, 180, 255, 127, 14])
    draw = ImageDraw.Draw(img)
    _text(img, (8, 6), title[:110], BLACK)
    if len(title) > 110:
        _text(img, (8, 20), title[110:220], BLACK)
    if not edges:
        y = 40
        for key, value in decisions.items():
            _text(img, (12, y), f"{key} = {value}", BLACK)
            y += 14
            if y > height - 14:
                break
        return _png_image(img)
    nodes: list[str] = []
    for src, dst, _ in edges:
        for n in (src, dst):
            if n not in nodes:
                nodes.append(n)
    margin, mid = 50, height // 2 + 15
    step = (width - 2 * margin) / max(1, len(nodes) - 1)
    xs = {n: margin + i * step for i, n in enumerate(nodes)}
    for k, (src, dst, label) in enumerate(edges):
        x0, x1 = xs[src], xs[dst]
        bend = 0.24 * abs(x1 - x0) * (1 if k % 2 == 0 else -1)
        pts = [(x0 + (x1 - x0) * t / 24, mid - bend * math.sin(math.pi * t / 24)) for t in range(25)]
        draw.line(pts, fill=BLUE, width=2)
        (ax, ay), (bx, by) = pts[-3], pts[-1]
        ang = math.atan2(by - ay, bx - ax)
        for da in (2.6, -2.6):
            draw.line([(bx, by), (bx + 10 * math.cos(ang + da), by + 10 * math.sin(ang + da))],
                      fill=BLUE, width=2)
        tx, ty = (x0 + x1) / 2, mid - bend
        box = _text_box((tx, ty), label, "mm")
        draw.rectangle(box, fill=WHITE)
        _text(img, (tx, ty), label, BLACK, "mm")
    for n, x in xs.items():
        draw.ellipse((x - 14, mid - 14, x + 14, mid + 14), fill=ORANGE)
        _text(img, (x, mid), n, BLACK, "mm")
    return _png_image(img)


@lru_cache(maxsize=1024)
def _glyphs(text: str, anchor: str) -> tuple[Any, tuple[int, int, int, int]]:
    """``text`` rendered once as a two-level mask, with its box relative to the anchor
    point: a cell's labels repeat from trial to trial, so each is drawn only once."""
    from PIL import Image, ImageDraw

    font = _font()
    # measured and drawn as Pillow draws text on the palette image: no antialiasing
    left, top, right, bottom = (int(v) for v in ImageDraw.Draw(Image.new("P", (1, 1))).textbbox(
        (0, 0), text, font=font, anchor=anchor))
    mask = Image.new("L", (max(1, right - left), max(1, bottom - top)), 0)
    pen = ImageDraw.Draw(mask)
    pen.fontmode = "1"
    pen.text((-left, -top), text, fill=255, font=font, anchor=anchor)
    return mask, (left, top, right, bottom)


def _text_box(xy: tuple[float, float], text: str, anchor: str = "la") -> tuple[int, int, int, int]:
    _, (left, top, right, bottom) = _glyphs(text, anchor)
    x, y = int(xy[0]), int(xy[1])
    return (x + left, y + top, x + right, y + bottom)


def _text(img: Any, xy: tuple[float, float], text: str, fill: int, anchor: str = "la") -> None:
    mask, _ = _glyphs(text, anchor)
    box = _text_box(xy, text, anchor)
    img.paste(fill, box[:2], mask)


@lru_cache(maxsize=1)
def _font():
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=11)
    except TypeError:  # Pillow without FreeType sizes
        return ImageFont.load_default()


def _png_image(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


#: Units of objectives and metrics recognised by name (first match wins): frugalnas's
#: accuracies are percentages, latencies ``latency_ms_*`` milliseconds, cost fields as in
#: :class:`frugalnas.ports.cost.Cost`. The plugin option ``mlflow.units`` adds or overrides.
UNIT_RULES: tuple[tuple[str, str], ...] = (
    ("accuracy", "%"), ("latency_ms", "ms"), ("_ms", "ms"), ("seconds", "s"),
    ("memory_mb", "MiB"), ("peak_memory", "bytes"), ("memory", "bytes"), ("energy_mj", "mJ"),
    ("params", "count"), ("flops", "FLOPs"), ("epochs", "epochs"))


def unit_of(name: str, units: dict[str, str] | None = None) -> str | None:
    """The unit of objective or metric ``name``: from ``units`` (exact name), else from
    :data:`UNIT_RULES`, else ``None``."""
    if units and name in units:
        return units[name] or None
    low = name.lower()
    for part, unit in UNIT_RULES:
        if part in low:
            return unit
    return None


def objective_label(name: str, alias: str | None = None,
                    units: dict[str, str] | None = None) -> str:
    """An axis label: the objective's name, what it stands for when it is the estimator's
    ``value`` (``alias``, the metric it equals) and its unit, e.g. ``accuracy (%)``,
    ``value = valid_accuracy_cifar10 (%)``, ``params (count)``."""
    shown = f"{name} = {alias}" if alias and alias != name else name
    unit = unit_of(name, units) or (unit_of(alias, units) if alias else None)
    return f"{shown} ({unit})" if unit else shown


def draw_best_so_far(numbers: Sequence[int], values: Sequence[float], maximize: bool,
                     title: str, ylabel: str = "objective",
                     curve: Sequence[tuple[int, float]] | None = None) -> bytes:
    """Each trial's value and the best so far, against the trial number; ``ylabel`` names
    the objective (:func:`objective_label`). ``curve``: the best-so-far curve's change points
    (trial number, best value), when ``numbers``/``values`` are a sample of the trials;
    without it the curve is computed from them."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    if curve is None:
        best, steps = None, []
        for v in values:
            best = v if best is None else (max(best, v) if maximize else min(best, v))
            steps.append(best)
        xs, ys = list(numbers), steps
    else:
        xs, ys = [n for n, _ in curve], [v for _, v in curve]
        if xs and numbers and max(numbers) > xs[-1]:  # hold the best to the last trial
            xs, ys = xs + [max(numbers)], ys + [ys[-1]]
    ax.scatter(numbers, values, s=8, alpha=0.5, label="trial value")
    ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def draw_pareto(points: Sequence[Sequence[float]], front: Sequence[Sequence[float]],
                names: Sequence[str], title: str,
                directions: Sequence[str] | None = None) -> bytes:
    """Every trial of a two-objective study, the Pareto front highlighted (joined as the
    staircase it dominates when ``directions`` are given); ``names`` are the axis labels
    (:func:`objective_label`)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    ax.scatter([p[0] for p in points], [p[1] for p in points], s=10, alpha=0.35,
               color="tab:blue", label="trials")
    front = sorted(front)
    if directions is not None and len(front) > 1:
        # a staircase: between two front points, the region the front still dominates
        # (sorted by the first objective: each point holds until the next when the first is
        # minimised, from the previous one when it is maximised)
        where = "post" if directions[0] == "minimize" else "pre"
        ax.step([p[0] for p in front], [p[1] for p in front], where=where, color="tab:red",
                lw=1.2, alpha=0.8)
    elif len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "-", color="tab:red", lw=1.2)
    ax.scatter([p[0] for p in front], [p[1] for p in front], s=28, color="tab:red",
               edgecolor="black", linewidth=0.5, zorder=3, label=f"Pareto front ({len(front)})")
    ax.grid(alpha=0.3)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)
