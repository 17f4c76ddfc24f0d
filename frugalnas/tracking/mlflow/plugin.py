"""Built-in plugin "mlflow": every study an MLflow experiment, every trial a nested run.

The study gets a parent run (config as params, study-level metrics, best-so-far curve and,
for two objectives, the Pareto front); each trial a child run with the genotype as params,
the estimator's metrics and cost as metrics, strategy/estimator/backend/state as tags, and two
artifacts (``architecture.json`` and ``cell.png``). A trial's run is written when the trial
ends, with the trial's start time. All MLflow calls run on one background writer thread per
study, so logging does not sit on the trial's critical path; the writer is drained when the
study finishes and at interpreter exit. The writer searches MLflow for the study's runs once,
when it connects, and then keeps its own account of the runs it wrote and found (one more
search only when another process's reconciliation wrote runs meanwhile, or for a trial another
process started); finished trials are written in batches, on a SQL store each batch of new
runs in one transaction (:func:`~frugalnas.tracking.mlflow.reconcile.create_runs`). The
study's end writes what is still queued, then reconciles and closes the parent run
(FINISHED; FAILED when the study ended on an exception other than an interrupt, or when the
storage or its lock failed so that the end could not reconcile: the parent run is closed all
the same while MLflow can be written, and the next start reconciles); it waits as long as the
writer makes progress, and a study whose runs could not all be written ends with one line
saying how many (:class:`OperationalFailure`).
Block it with ``-p no:mlflow`` (``--no-tracking``,
``disable_plugins=["mlflow"]``).

The optuna storage is the record of truth and MLflow follows it: when a study (or a worker)
starts and when it ends, :mod:`frugalnas.tracking.mlflow.reconcile` writes the runs that a
killed process never wrote and closes the ones it left open. The writes of all processes on
one storage take turns under one lock (``frugalnas.distribution.locks.study_lock``), so there is one
parent run per study and one run per trial. The tracking URI is checked before the first
trial (:mod:`frugalnas.tracking.mlflow.checks`).

The parent run also carries the review of the study (:meth:`StudyTracker._write_review`):
``leaderboard.html`` (every completed trial ranked, its architecture whole, objective values,
feasibility, size, cost and a link to its run), the best-so-far plot or, with two
objectives, the Pareto plot, axes named with units; it is rewritten at the end of each
session, after a reconciliation that changed something and, while trials finish, at most
every :data:`REVIEW_SECONDS`. It is kept incrementally and bounded
(:mod:`frugalnas.tracking.mlflow.review`: the best 100 trials, the exact best-so-far curve, a
sample of at most 1,000 plotted trials), so rewriting it costs the same at any study size. A study with several objectives logs ``hypervolume`` on the
parent run after every trial (step = trial number), against a reference point that is fixed
once (:func:`default_reference`) and logged as the parent parameter
``hypervolume_reference``.

Options (``plugin_options={"mlflow": {...}}``, ``-o mlflow.KEY=VALUE``): ``tracking_uri``
(default: ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``); ``hypervolume_reference``
(one number per objective, in the objectives' units); ``ui_url`` (the MLflow UI the
leaderboard links to, default ``http://127.0.0.1:5000``, where ``frugalnas ui`` serves);
``units`` (``{objective or metric: unit}`` for plot axes, beyond the units frugalnas knows).
The plugin also adds the ``--tracking-uri``/``--no-tracking`` flags to ``run`` and
``worker``, and the ``frugalnas ui`` command; it logs the networks ``frugalnas export`` trains
as MLflow models (``frugalnas_model_exported``, :mod:`frugalnas.tracking.mlflow.models`) and
links ``frugalnas report``'s leaderboard to the trial runs (``frugalnas_trial_links``).
"""

from __future__ import annotations

import argparse
import atexit
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from frugalnas.ports.errors import ConfigError, OperationalFailure
from frugalnas.host.plugins import hookimpl
from frugalnas.ports.secrets import OptionRoles, mask_text
from frugalnas.tracking.mlflow.checks import check_tracking_uri

from frugalnas.tracking.mlflow.models import log_model, trial_run_links
from frugalnas.tracking.mlflow.reference import parse_reference
from frugalnas.tracking.mlflow.store import (DEFAULT_TRACKING_URI, OPTIONS, PLUGIN,
                                             tracking_uri_of)
from frugalnas.tracking.mlflow.ui import cmd_ui

if TYPE_CHECKING:  # the plugin loads for --help, which needs no optuna
    from frugalnas.ports.trial_report import TrialReport
    from frugalnas.tracking.mlflow.tracker import StudyTracker


# Trackers still open, so that interpreter exit drains their writes (a study used through
# ask/tell may never call finish()). Only for that: hooks find a study's tracker in the study.
_OPEN: weakref.WeakSet[StudyTracker] = weakref.WeakSet()
_LOCK = threading.Lock()


def tracker_for(study: Any) -> StudyTracker | None:
    return study.plugin_state.get(PLUGIN, {}).get("tracker")


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    options = config.plugin_options.get(PLUGIN, {})
    for key in options:
        if key not in OPTIONS:
            raise ConfigError(f"unknown option {key!r} for plugin {PLUGIN!r}; valid options: "
                              f"{', '.join(OPTIONS)}")
    if options.get("hypervolume_reference") is not None:
        if len(config.objectives) < 2:
            raise ConfigError("mlflow hypervolume_reference is for studies with several "
                              f"objectives; this study has one ({config.objectives[0]!r})")
        parse_reference(options["hypervolume_reference"], len(config.objectives))
    ui_url = options.get("ui_url")
    if ui_url is not None and (not isinstance(ui_url, str)
                               or not ui_url.startswith(("http://", "https://"))):
        raise ConfigError(f"invalid mlflow ui_url {mask_text(repr(ui_url))}; expected the "
                          "MLflow UI's address, such as http://127.0.0.1:5000")
    units = options.get("units")
    if units is not None and (not isinstance(units, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in units.items())):
        raise ConfigError(f"invalid mlflow units {units!r}; expected {{name: unit}}, such as "
                          '{"latency_ms_pixel3": "ms"}')
    uri = options.get("tracking_uri")
    if uri is not None and not isinstance(uri, str):
        raise ConfigError(f"invalid mlflow tracking_uri {mask_text(repr(uri))}; expected a URI such as "
                          "sqlite:///mlflow.db or http://127.0.0.1:5000")
    # Before the first trial: a bad or unreachable URI is one line now, not a hang later.
    check_tracking_uri(tracking_uri_of(config))


@hookimpl
def frugalnas_option_roles() -> OptionRoles:
    # Each worker names the tracking store as its machine reaches it (localhost or an
    # address, credentials of its own); every spelling of one store is the same study.
    return OptionRoles(run=("tracking_uri",))


@hookimpl
def frugalnas_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: "
                        "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="do not log to MLflow (same as -p no:mlflow)")


@hookimpl
def frugalnas_run_settings(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    if getattr(args, "tracking_uri", None) and getattr(args, "no_tracking", False):
        raise ConfigError(f"--tracking-uri {mask_text(args.tracking_uri)} and --no-tracking "
                          "contradict each other; give one of them")
    if getattr(args, "tracking_uri", None):
        settings.setdefault("plugin_options", {}).setdefault(PLUGIN, {})["tracking_uri"] = \
            args.tracking_uri
    if getattr(args, "no_tracking", False):
        settings["disable_plugins"] = sorted({*settings.get("disable_plugins", []), PLUGIN})


@hookimpl
def frugalnas_results_location(study: Any) -> str | None:
    uri = tracking_uri_of(study.config)
    flag = "" if uri == DEFAULT_TRACKING_URI else f" --tracking-uri {mask_text(uri)}"
    return (f"MLflow experiment {study.name!r} in {mask_text(uri)}, one run per trial; review it "
            f"with: frugalnas ui{flag} --study-name {study.name}")


@hookimpl
def frugalnas_model_exported(study: Any, exported: Any) -> dict[str, Any]:
    """An exported network becomes an MLflow model in the study's experiment, linked to its
    trial's run (and registered under ``exported.register``)."""
    return log_model(study, exported)


@hookimpl
def frugalnas_trial_links(study: Any, base_url: str) -> dict[int, str]:
    return trial_run_links(study, base_url)


@hookimpl
def frugalnas_commands(subparsers: argparse._SubParsersAction, host: Any) -> None:
    ui = subparsers.add_parser(
        "ui", help="start the MLflow UI for the store in use, on a study's runs",
        description="Start the MLflow UI and print (or --open) the address of a study's "
        "experiment on its training-runs view: every trial a row, best first, with the "
        "objective, architecture, state and cost columns shown.")
    ui.add_argument("--tracking-uri")
    ui.add_argument("--study-name", "--experiment", dest="experiment", metavar="NAME",
                    help="the study (MLflow experiment name or id) to open (default: the most "
                    "recently created frugalnas study in the store)")
    ui.add_argument("--open", action="store_true",
                    help="open the address in a web browser once the server answers")
    # dest is not "host": the command line keeps its plugin host in args.host
    ui.add_argument("--host", dest="bind_host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--workers", type=int, default=1,
                    help="server processes (default 1: starts fast; MLflow's own default is 4)")
    ui.set_defaults(func=cmd_ui)




@hookimpl
def frugalnas_study_started(study: Any) -> None:
    # The tracker (optuna, the storage's locks, the leaderboard) is imported when a study
    # starts, not when the plugin loads with every command.
    from frugalnas.tracking.mlflow.tracker import StudyTracker

    with _LOCK:
        state = study.plugin_state.setdefault(PLUGIN, {})
        if state.get("tracker") is None:
            state["tracker"] = StudyTracker(study)
            _OPEN.add(state["tracker"])


@hookimpl
def frugalnas_trial_started(study: Any, trial: Any, architecture: Any) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_started(trial.number)


@hookimpl
def frugalnas_trial_finished(study: Any, report: TrialReport) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_finished(report)


@hookimpl
def frugalnas_study_metrics(study: Any, metrics: dict[str, float], step: int) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.study_metrics(metrics, step)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    with _LOCK:
        state = study.plugin_state.get(PLUGIN, {})
        tracker = state.pop("tracker", None)
    if tracker is not None:
        # the session ends while an exception leaves the study (a storage failure, a
        # callback's error): the parent run says so; an interrupt (Ctrl-C, SIGTERM) is a stop
        # the user asked for, and the study goes on at the next start
        ending = sys.exc_info()[0]
        status = ("FINISHED" if ending is None or issubclass(ending, KeyboardInterrupt)
                  else "FAILED")
        tracker.close(status)
        _OPEN.discard(tracker)
        state.update(errors=list(tracker.writer.errors), parent_run_id=tracker.parent_run_id,
                     experiment_id=tracker.experiment_id, study_id=tracker.uid,
                     reconciled=dict(tracker.reconciled), counters=dict(tracker.counters))
        if tracker.writer.failure is not None:
            raise tracker.writer.failure
        if tracker.lost:
            raise OperationalFailure(f"MLflow logging errors: {tracker.lost}")
        if tracker.writer.errors:  # some writes failed: the runs are missing until the next start
            raise OperationalFailure(
                f"MLflow logging errors: {len(tracker.writer.errors)} write(s) to "
                f"{mask_text(tracker.uri)} failed, their runs are missing until the next start of "
                f"the study writes them from the storage: {'; '.join(tracker.writer.errors[:2])}")


@atexit.register
def _close_all() -> None:
    for tracker in list(_OPEN):
        tracker.close()
