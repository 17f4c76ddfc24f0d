"""Built-in plugin "export": from a finished search to a deployable network.

- :func:`export_study` (``frugalnas.export_study``; command ``frugalnas export``) trains the
  chosen trial's architecture from scratch on training + validation data with the study's
  backend, measures it once on the test split, and writes a state dict, TorchScript,
  ``torch.export`` and ONNX files (and, for a language model on request, a Hugging Face
  GPT-2 folder; each checked against the module) and ``report.json``; with
  the study's MLflow tracking on it logs the network as an MLflow model linked to the trial's
  run, and registers it on request.
- :func:`leaderboard_rows`, :func:`leaderboard_html`, :func:`leaderboard_table` (command
  ``frugalnas report``, from :mod:`frugalnas.leaderboard`): the completed trials ranked, for
  the terminal or an HTML file.

The plugin imports no tracking: a plugin that logs models implements
``frugalnas_model_exported`` (the ``mlflow`` plugin does), and one that links trials to its
user interface ``frugalnas_trial_links``.

See docs/deployment.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.export.cli import add_commands

# The commands are added without importing torch or the exporter; the names below are
# imported when first used.
__getattr__ = lazy_attributes(__name__, {
    **{name: "frugalnas.export.exporter" for name in (
        "DEFAULT_EPOCHS", "ExportedModel", "export_study")},
    "FORMATS": "frugalnas.export.options",
    "DEFAULT_FORMATS": "frugalnas.export.options",
    "ExportError": "frugalnas.export.options",
    **{name: "frugalnas.leaderboard" for name in (
        "leaderboard_html", "leaderboard_rows", "leaderboard_table", "pareto_fronts")},
    "select_trials": "frugalnas.export.select"})

__all__ = ["DEFAULT_EPOCHS", "DEFAULT_FORMATS", "FORMATS", "ExportError", "ExportedModel",
           "export_study", "leaderboard_html", "leaderboard_rows", "leaderboard_table", "pareto_fronts",
           "select_trials"]


@hookimpl
def frugalnas_commands(subparsers: argparse._SubParsersAction, host: Any) -> None:
    add_commands(subparsers)
