"""Progress bars without hidden state: ``-q`` reaches the progress plugin as its session option
``show`` (frugalnas_run_settings), which is not stored with the study; FRUGALNAS_PROGRESS is
only the user's override and nothing writes it."""

from __future__ import annotations

import json
import os
import sys

import pytest

import frugalnas
from frugalnas.ports import work_progress
from frugalnas.cli.main import build_parser, resolve_run
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.keys import CONFIG_ATTR
from frugalnas.host.plugins import PluginHost


def _settings(*argv):
    host = PluginHost()
    args = build_parser(host).parse_args(["run", *argv])
    return resolve_run(args, host)[0]


def test_quiet_is_the_progress_plugin_s_session_option():
    assert _settings("-q").session_options == {"progress": {"show": False}}
    assert _settings().session_options == {"progress": {"show": True}}
    host = PluginHost(disable_plugins=["progress"])
    args = build_parser(host).parse_args(["run", "-q", "-p", "no:progress"])
    assert resolve_run(args, host)[0].session_options == {}


def test_session_options_are_not_stored_and_never_conflict(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    common = dict(storage=storage, study_name="s", disable_plugins=["mlflow"],
                  load_if_exists=True)
    first = frugalnas.create_study(session_options={"progress": {"show": False}}, **common)
    assert "session_options" not in json.loads(first.optuna_study.user_attrs[CONFIG_ATTR])
    again = frugalnas.create_study(session_options={"progress": {"show": True}}, **common)
    assert again.config.session_options == {"progress": {"show": True}}
    assert again.config == first.config and not first.config.differences(again.config)
    assert StudyConfig.from_json(first.config.to_json()).session_options == {}


@pytest.mark.parametrize("options, fragment", [
    ({"session_options": {"progress": {"colour": True}}}, "unknown option 'colour'"),
    ({"plugin_options": {"progress": {"show": "yes"}}}, "invalid progress show 'yes'"),
])
def test_the_progress_plugin_checks_its_options(options, fragment):
    with pytest.raises(frugalnas.ConfigError, match=fragment):
        frugalnas.create_study(disable_plugins=["mlflow"], **options)


def test_which_bars_show(monkeypatch):
    monkeypatch.delenv("FRUGALNAS_PROGRESS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    shown = work_progress.progress_shown
    assert shown() is True and shown(False) is False
    token = work_progress.session_progress(False)
    monkeypatch.setenv("FRUGALNAS_PROGRESS", "1")
    assert shown() is False and shown(True) is True  # -q wins over the user's override
    work_progress.end_session_progress(token)
    assert shown() is True
    monkeypatch.setenv("FRUGALNAS_PROGRESS", "0")
    token = work_progress.session_progress(True)
    assert shown() is False  # the user's override wins over a session's default
    work_progress.end_session_progress(token)
    monkeypatch.delenv("FRUGALNAS_PROGRESS")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    token = work_progress.session_progress(True)
    assert shown() is True  # frugalnas run without -q: bars also when stderr is no terminal
    work_progress.end_session_progress(token)
    assert shown() is False


class SeesBars:
    """A plugin that records, during a study, whether work outside trials would draw a bar."""

    __name__ = "sees-bars"

    def __init__(self):
        self.seen = []

    @frugalnas.hookimpl
    def frugalnas_trial_started(self):
        self.seen.append(work_progress.progress_shown())


def test_a_quiet_session_silences_the_work_bars_while_it_runs(monkeypatch):
    monkeypatch.delenv("FRUGALNAS_PROGRESS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    spy = SeesBars()
    study = frugalnas.create_study(plugins=[spy],
                                   disable_plugins=["mlflow"],
                                   session_options={"progress": {"show": False}})
    study.optimize(n_trials=2)
    assert spy.seen == [False, False] and work_progress.progress_shown() is True


def test_the_command_line_writes_no_environment_variable(monkeypatch, capsys):
    from frugalnas.cli.main import main

    monkeypatch.delenv("FRUGALNAS_PROGRESS", raising=False)
    bars = []
    for quiet in (["-q"], []):
        assert main(["run", "--n-trials", "1", "--no-tracking", *quiet]) == 0
        assert "FRUGALNAS_PROGRESS" not in os.environ
        bars.append("1/1" in capsys.readouterr().err)
    assert bars == [False, True]  # without -q the trials' bar shows, also off a terminal
