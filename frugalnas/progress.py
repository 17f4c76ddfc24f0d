"""Built-in plugin "progress": a progress bar over a study's trials (block it with
``-p no:progress``).

Its one option, ``show`` (``true``/``false``), comes from the study's ``session_options``
(``frugalnas run`` and ``frugalnas worker`` set ``show = not -q`` there through
``frugalnas_run_settings``; not stored with the study) or from its ``plugin_options``
(``-o progress.show=false``, ``[plugin_options.progress]``; stored with it); the session's
wins. Without it the bar shows when stderr is a terminal. The environment variable
``FRUGALNAS_PROGRESS`` is the user's override (``1`` always, ``0`` never), except that
``show = false`` (``-q``) always wins. While the study runs, the same setting decides the bars
of work outside trials, such as a strategy's warm start (:mod:`frugalnas.ports.work_progress`).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import hookimpl
from frugalnas.ports.work_progress import end_session_progress, progress_shown, session_progress

if TYPE_CHECKING:  # the plugin loads with every command: optuna only when a study runs
    from frugalnas.ports.trial_report import TrialReport

PLUGIN = "progress"
OPTIONS = ("show",)


def show_option(config: Any) -> bool | None:
    """The ``show`` option of a study's config: its session's, else its plugin option's."""
    return {**config.plugin_options.get(PLUGIN, {}),
            **config.session_options.get(PLUGIN, {})}.get("show")


class _Bar:
    """One study's bar and the best objective value seen, kept in ``study.plugin_state``."""

    def __init__(self, study: Any):
        from tqdm.auto import tqdm

        self.single = len(study.directions) == 1
        self.maximize = study.directions[0] == "maximize"
        self.best: float | None = None
        if self.single:
            try:
                self.best = float(study.best_value)
            except (ValueError, RuntimeError):  # nothing (feasible) completed yet
                self.best = None
        self.tqdm = tqdm(total=study.planned_trials, desc=f"study {study.name}", unit="trial",
                         file=sys.stderr, dynamic_ncols=True)

    def finished(self, report: TrialReport) -> None:
        from optuna.trial import TrialState

        # The hook runs before optuna records the trial, so the best is kept here.
        if (self.single and report.state == TrialState.COMPLETE and report.values
                and report.feasible is not False):
            value = float(report.values[0])
            if math.isfinite(value) and (self.best is None or (
                    value > self.best if self.maximize else value < self.best)):
                self.best = value
        best = f" best={self.best:.4g}" if self.best is not None else ""
        self.tqdm.set_postfix_str(f"last={report.state.name.lower()}{best}")
        self.tqdm.update(1)


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    for group in ("plugin_options", "session_options"):
        options = getattr(config, group).get(PLUGIN, {})
        for key, value in options.items():
            if key not in OPTIONS:
                raise ConfigError(f"unknown option {key!r} for plugin {PLUGIN!r}; valid "
                                  f"options: {', '.join(OPTIONS)}")
            if not isinstance(value, bool):
                raise ConfigError(f"invalid progress show {value!r}; expected true or false")


@hookimpl
def frugalnas_run_settings(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    if hasattr(args, "quiet"):
        settings.setdefault("session_options", {}).setdefault(PLUGIN, {})["show"] = \
            not args.quiet


class _Session:
    """The plugin's state for one study session, in ``study.plugin_state``: the setting of the
    bars of work outside trials while it runs, and the trials' bar when it is shown."""

    def __init__(self, study: Any):
        self.token = session_progress(show_option(study.config))
        self.bar = _Bar(study) if progress_shown() else None

    def finished(self, report: TrialReport) -> None:
        if self.bar is not None:
            self.bar.finished(report)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.tqdm.close()
        end_session_progress(self.token)


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    study.plugin_state[PLUGIN] = _Session(study)


@hookimpl
def frugalnas_trial_finished(study: Any, report: TrialReport) -> None:
    session = study.plugin_state.get(PLUGIN)
    if session is not None:
        session.finished(report)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    session = study.plugin_state.pop(PLUGIN, None)
    if session is not None:
        session.close()
