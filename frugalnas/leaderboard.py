"""The leaderboard of a study: its completed trials ranked, with their architectures in full,
objective values, network size (parameters, forward FLOPs per example) and what each
evaluation cost.

:func:`leaderboard_rows` builds the rows from a study (nothing else is read: the optuna
storage holds everything); :func:`leaderboard_html` renders them as a self-contained HTML page
(optionally linking each trial to its MLflow run) and :func:`leaderboard_table` as a ``rich``
table for the terminal (``frugalnas report``). The module belongs to neither plugin that uses
it: the ``export`` plugin (``frugalnas report``) and the ``mlflow`` plugin (the leaderboard on
a study's parent run) both import it, and neither imports the other.

Order: with one objective, best value first (ties by trial number); with several, by Pareto
front (non-dominated sorting: ``front`` 1 is the Pareto front), then by the first objective.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import TrialState

from frugalnas.ports.cost import count_flops, count_params
from frugalnas.ports.keys import COST_ATTR, METRICS_ATTR
from frugalnas.ports.trial_architecture import architecture_of
from frugalnas.ports.task import IMAGE_CLASSIFICATION, Task
from frugalnas.ports.trial_constraints import recorded_feasible
from frugalnas.multiobjective.pareto import pareto_fronts

#: Input shape and classes used to count a network's size when the study has no dataset.
FALLBACK_INPUT = ((3, 32, 32), 10)


class _SizeCounter:
    """Parameters and forward FLOPs per example of each architecture (built on the meta
    device: nothing is allocated and torch's RNG is untouched), cached by architecture."""

    def __init__(self, study: Any, input_shape: Sequence[int] | None, num_classes: int | None):
        self.study = study
        self.task: Task = IMAGE_CLASSIFICATION
        if input_shape is None or num_classes is None:
            shape, classes = self._data_shape()
            input_shape = input_shape if input_shape is not None else shape
            num_classes = num_classes if num_classes is not None else classes
        self.input_shape, self.num_classes = tuple(int(v) for v in input_shape), int(num_classes)
        self.cache: dict[str, tuple[int | None, int | None]] = {}

    def _data_shape(self) -> tuple[tuple[int, ...], int]:
        if getattr(self.study.config, "dataset", None) is None:
            return FALLBACK_INPUT
        data = self.study.load_dataset()
        self.task = data.task
        return tuple(data.input_shape), int(data.num_classes)

    def __call__(self, arch: Any) -> tuple[int | None, int | None]:
        key = str(arch)
        if key not in self.cache:
            self.cache[key] = self._count(arch)
        return self.cache[key]

    def _count(self, arch: Any) -> tuple[int | None, int | None]:
        import torch

        space = self.study.space
        for device in ("meta", "cpu"):
            try:
                with torch.random.fork_rng(devices=[]), torch.device(device):
                    model = space.build(arch, self.num_classes, self.input_shape)
                x = self.task.example_batch(1, self.input_shape, self.num_classes)[0]
                return count_params(model), count_flops(model, x.to(device))
            except Exception:
                continue
        return None, None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def recorded_sizes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill ``params`` and ``flops`` of rows built with ``sizes=False`` from what the trials
    recorded, without building any network: ``params`` from the cost (the candidate's
    parameters), ``flops`` from an estimator metric ``flops`` (forward FLOPs per example)
    where there is one. Returns ``rows``."""
    for row in rows:
        if row.get("params") is None:
            p = (row.get("cost") or {}).get("params")
            row["params"] = int(p) if p else None
        if row.get("flops") is None:
            f = (row.get("metrics") or {}).get("flops")
            row["flops"] = float(f) if f else None
    return rows


def leaderboard_rows(study: Any, *, limit: int | None = None, sizes: bool = True,
                     input_shape: Sequence[int] | None = None,
                     num_classes: int | None = None) -> list[dict[str, Any]]:
    """The completed trials of ``study`` (a :class:`frugalnas.Study`), best first.

    Each row: ``rank`` (1-based), ``trial`` (number), ``architecture`` (its full text form),
    ``values`` (objective name -> value), ``front`` (Pareto front, 1 = non-dominated; ``None``
    with one objective), ``params`` and ``flops`` (the network's parameters and forward FLOPs
    per example at the dataset's input shape; ``None`` with ``sizes=False`` or where the
    network cannot be built), ``cost`` (what evaluating the trial cost: ``seconds``, ``flops``,
    ``epochs``, ...), ``metrics`` (the estimator's metrics), ``feasible`` (whether the trial
    met the study's constraints; ``None`` without constraints) and ``datetime_complete`` (ISO
    text). ``limit`` keeps the first rows (sizes are only counted for those)."""
    objectives = list(study.config.objectives)
    directions = list(study.directions)
    trials = [t for t in study.optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.values is not None]
    if len(objectives) == 1:
        sign = 1 if directions[0] == "maximize" else -1
        fronts: list[int | None] = [None] * len(trials)
        keys = [(-sign * t.values[0], t.number) for t in trials]
    else:
        found = pareto_fronts([t.values for t in trials], directions)
        fronts = list(found)
        sign = 1 if directions[0] == "maximize" else -1
        keys = [(f, -sign * t.values[0], t.number) for f, t in zip(found, trials)]
    order = sorted(range(len(trials)), key=lambda i: keys[i])
    if limit is not None:
        order = order[:max(0, int(limit))]
    counter = _SizeCounter(study, input_shape, num_classes) if sizes and order else None
    rows = []
    for rank, i in enumerate(order, start=1):
        t = trials[i]
        arch = architecture_of(t, study.space)
        cost = {k: float(v) for k, v in (t.user_attrs.get(COST_ATTR) or {}).items()
                if _number(v) is not None}
        metrics = {k: float(v) for k, v in (t.user_attrs.get(METRICS_ATTR) or {}).items()
                   if _number(v) is not None}
        params, flops = counter(arch) if counter is not None and arch is not None else (None, None)
        rows.append({
            "rank": rank, "trial": t.number, "architecture": str(arch) if arch is not None else "",
            "values": {name: float(v) for name, v in zip(objectives, t.values)},
            "front": fronts[i], "params": params, "flops": flops, "cost": cost,
            "metrics": metrics, "feasible": recorded_feasible(t),
            "datetime_complete": t.datetime_complete.isoformat() if t.datetime_complete else None,
        })
    return rows


# -- rendering ---------------------------------------------------------------------------------
def _directions(objectives: Sequence[str] | Mapping[str, str]) -> dict[str, str | None]:
    if isinstance(objectives, Mapping):
        return {str(k): (str(v) if v else None) for k, v in objectives.items()}
    return {str(k): None for k in objectives}


def fmt_number(v: Any, digits: int = 4) -> str:
    """A compact number: ``93.21``, ``802k``, ``1.2M``, ``3.4G``; ``-`` for none."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    v = float(v)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{int(v)}" if v.is_integer() else f"{v:.{digits}g}"


def _seconds(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3g} s"


def _columns(objectives: Mapping[str, str | None], feasible: bool = False) -> list[str]:
    arrows = {"maximize": " \u2191", "minimize": " \u2193"}
    return (["rank", "trial", "architecture"]
            + [f"{name}{arrows.get(d or '', '')}" for name, d in objectives.items()]
            + (["feasible"] if feasible else [])
            + ["params", "FLOPs", "cost (time)", "cost (FLOPs)"])


def _has_feasibility(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(r.get("feasible") is not None for r in rows)


def _cells(row: Mapping[str, Any], objectives: Mapping[str, str | None],
           feasible: bool = False) -> list[str]:
    cost = row.get("cost") or {}
    ok = row.get("feasible")
    return ([str(row.get("rank", "")), str(row.get("trial", "")), str(row.get("architecture", ""))]
            + [fmt_number((row.get("values") or {}).get(name)) for name in objectives]
            + ([("-" if ok is None else "yes" if ok else "no")] if feasible else [])
            + [fmt_number(row.get("params")), fmt_number(row.get("flops")),
               _seconds(cost.get("seconds")), fmt_number(cost.get("flops"))])


def leaderboard_html(rows: Sequence[Mapping[str, Any]],
                     objectives: Sequence[str] | Mapping[str, str],
                     run_links: Mapping[int, str] | None = None, *,
                     title: str = "frugalnas leaderboard", notes: Sequence[str] = ()) -> str:
    """A self-contained HTML page with the rows of :func:`leaderboard_rows` as a table.
    ``objectives`` names the value columns (a mapping name -> ``maximize``/``minimize`` adds
    an arrow); ``run_links`` maps trial numbers to URLs (their MLflow runs), which the trial
    numbers and an "MLflow run" column then link to. Pareto-front rows (front 1) of a
    multi-objective study are marked; a ``feasible`` column appears when any row says whether
    it met the study's constraints. ``notes`` are extra paragraphs (plain text) under the
    title."""
    objs = _directions(objectives)
    links = {int(k): str(v) for k, v in (run_links or {}).items()}
    feasible = _has_feasibility(rows)
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in _columns(objs, feasible))
    if links:
        head += "<th>MLflow run</th>"
    body = []
    for row in rows:
        cells = _cells(row, objs, feasible)
        trial = row.get("trial")
        if trial is not None and int(trial) in links:
            cells_html = [esc(cells[0]),
                          f'<a href="{esc(links[int(trial)], quote=True)}">{esc(cells[1])}</a>']
        else:
            cells_html = [esc(cells[0]), esc(cells[1])]
        cells_html.append(f"<code>{esc(cells[2])}</code>")
        cells_html += [esc(c) for c in cells[3:]]
        cls = ' class="pareto"' if row.get("front") == 1 else ""
        if links:
            url = links.get(int(trial)) if trial is not None else None
            cells_html.append(f'<a href="{esc(url, quote=True)}" target="_blank">run</a>'
                              if url else "-")
        tds = "".join(f'<td class="{"arch" if k == 2 else "num"}">{c}</td>'
                      for k, c in enumerate(cells_html))
        body.append(f"<tr{cls}>{tds}</tr>")
    note = ("<p>Rows in bold are on the Pareto front.</p>"
            if any(r.get("front") is not None for r in rows) else "")
    note += "".join(f"<p>{esc(n)}</p>" for n in notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; font-size: 14px; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }}
th {{ background: #f4f4f4; position: sticky; top: 0; }}
td.num {{ text-align: right; white-space: nowrap; }}
td.arch code {{ font-size: 12px; word-break: break-all; }}
tr.pareto td {{ font-weight: 600; }}
</style></head>
<body><h1>{esc(title)}</h1>
<p>{len(rows)} completed trial(s), best first. params and FLOPs: the network (forward FLOPs
per example); cost: what evaluating the trial took.</p>{note}
<table><thead><tr>{head}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table></body></html>
"""


def leaderboard_table(rows: Sequence[Mapping[str, Any]],
                      objectives: Sequence[str] | Mapping[str, str], *,
                      title: str | None = None) -> Any:
    """The rows as a ``rich.table.Table`` (architectures in full, wrapped)."""
    from rich.table import Table

    objs = _directions(objectives)
    feasible = _has_feasibility(rows)
    table = Table(title=title, show_lines=False, header_style="bold")
    for k, col in enumerate(_columns(objs, feasible)):
        if col == "architecture":
            table.add_column(col, overflow="fold", ratio=1, min_width=20)
        else:
            table.add_column(col, justify="right" if k != 2 else "left", no_wrap=True)
    for row in rows:
        table.add_row(*_cells(row, objs, feasible), style="bold" if row.get("front") == 1 else None)
    return table
