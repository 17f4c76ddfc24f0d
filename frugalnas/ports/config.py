"""StudyConfig: everything that defines a study, validated up front, stored with the study."""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.secrets import OptionRoles, mask_options, mask_value

DIRECTIONS = ("maximize", "minimize")
#: Fields that describe one machine, not the study: stored for reference, never compared
#: when a study is reopened (workers of one study may use different devices, threads and
#: virtual-node addresses).
RUN_FIELDS = ("backend_options",)
#: Seeds go to numpy, whose generators take 32-bit seeds.
MAX_SEED = 2**32 - 1


@dataclass
class StudyConfig:
    space: str = "nb201"
    strategy: str = "random"
    estimator: str = "nb201-table"
    backend: str = "single-device"
    dataset: str | None = "digits"
    space_options: dict[str, Any] = field(default_factory=dict)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    estimator_options: dict[str, Any] = field(default_factory=dict)
    backend_options: dict[str, Any] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    directions: list[str] = field(default_factory=lambda: ["maximize"])
    objectives: list[str] = field(default_factory=lambda: ["value"])
    seed: int = 0
    trial_timeout: float | None = None
    plugins: list[str] = field(default_factory=list)
    disable_plugins: list[str] = field(default_factory=list)
    #: Options for plugins by plugin name (e.g. ``{"mlflow": {"tracking_uri": ...}}``); each
    #: plugin checks its own in ``frugalnas_check_config`` before the first trial.
    plugin_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Options for plugins by plugin name, like ``plugin_options``, that set one session
    #: only (the process that runs the study now: a progress bar shown or not, from ``-q``):
    #: they are not stored with the study and not compared when it is reopened.
    session_options: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    #: Upper bounds by metric name (``{"latency_ms_pixel3": 10.0}``): a trial is feasible when
    #: every named metric is at or under its bound. Names are checked against the
    #: estimator's metrics before the first trial.
    constraints: dict[str, float] = field(default_factory=dict)
    #: A registered pruner by name (``"pareto"`` for several objectives, ``"median"``, ...)
    #: and its options; ``None``: no pruning (or the pruner object given to create_study).
    pruner: str | None = None
    pruner_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("space", "strategy", "estimator", "backend"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"invalid {name} {value!r}; expected a component name")
        if isinstance(self.directions, str):
            self.directions = [self.directions]
        if not self.directions:
            raise ConfigError("invalid directions []; give at least one of 'maximize', 'minimize'")
        for d in self.directions:
            check_choice("direction", d, DIRECTIONS)
        if isinstance(self.objectives, str):
            self.objectives = [self.objectives]
        if len(self.objectives) != len(self.directions):
            if self.objectives == ["value"] and len(self.directions) > 1:
                raise ConfigError(
                    f"{len(self.directions)} directions {self.directions} need as many "
                    "objectives, e.g. objectives=['value', 'params']")
            raise ConfigError(
                f"objectives {self.objectives} and directions {self.directions} differ in length")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"invalid seed {self.seed!r}; expected an integer")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"invalid seed {self.seed!r}; valid range: [0, {MAX_SEED}]")
        if self.trial_timeout is not None and not (
                isinstance(self.trial_timeout, (int, float))
                and not isinstance(self.trial_timeout, bool)
                and 0 < self.trial_timeout < math.inf):
            raise ConfigError(f"invalid trial_timeout {self.trial_timeout!r}; expected a finite "
                              "number of seconds > 0")
        for name in ("space_options", "strategy_options", "estimator_options",
                     "backend_options", "dataset_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"invalid {name} {getattr(self, name)!r}; expected a table/dict")
        for name in ("plugin_options", "session_options"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"invalid {name} {value!r}; expected "
                                  "{plugin name: {option: value}}")

        check_constraints(self.constraints)
        if self.pruner is not None and (not isinstance(self.pruner, str) or not self.pruner):
            raise ConfigError(f"invalid pruner {self.pruner!r}; expected a pruner name such as "
                              "'pareto' or 'median'")
        if not isinstance(self.pruner_options, dict):
            raise ConfigError(f"invalid pruner_options {self.pruner_options!r}; expected a "
                              "table/dict")
        if self.pruner_options and self.pruner is None:
            raise ConfigError(f"pruner_options {self.pruner_options!r} given without a pruner; "
                              "set pruner= (e.g. 'pareto')")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> "StudyConfig":
        check_keys("study config", data, [f.name for f in fields(cls)])
        return cls(**data)

    def stored_form(self, roles: Mapping[str, OptionRoles] | None = None) -> dict[str, Any]:
        """What may be stored or shown: every field but ``session_options``, each URI's
        password and each option ``roles`` declares secret masked (``***``)."""
        data = asdict(self)
        data.pop("session_options")
        plugin_options = mask_options(data.pop("plugin_options"), roles or {})
        masked: dict[str, Any] = mask_value(data)
        masked["plugin_options"] = plugin_options
        return masked

    def pinned(self, roles: Mapping[str, OptionRoles] | None = None) -> dict[str, Any]:
        """What every process of one study must agree on: :meth:`stored_form` without the
        settings of one machine (``backend_options``: device, threads, addresses; the plugin
        options ``roles`` declares ``run``)."""
        data = self.stored_form(roles)
        for name in RUN_FIELDS:
            data.pop(name)
        pinned_options = {}
        for plugin, options in data["plugin_options"].items():
            run = (roles or {}).get(plugin, OptionRoles()).run
            kept = {k: v for k, v in options.items() if k not in run}
            if kept:
                pinned_options[plugin] = kept
        data["plugin_options"] = pinned_options
        return data

    def to_json(self, roles: Mapping[str, OptionRoles] | None = None) -> str:
        """The stored form (:meth:`stored_form`) as JSON."""
        return json.dumps(self.stored_form(roles), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "StudyConfig":
        return cls.from_mapping(upgrade_legacy(json.loads(text)))

    def differences(self, other: "StudyConfig",
                    roles: Mapping[str, OptionRoles] | None = None) -> list[str]:
        """The pinned fields (:meth:`pinned`) in which ``other`` differs, as ``field: ours ->
        theirs`` lines (secrets masked)."""
        mine, theirs = self.pinned(roles), other.pinned(roles)
        return [f"{k}: {mine[k]!r} -> {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def check_constraints(constraints: Any) -> None:
    """Raise ConfigError for constraints that are not ``{metric name: finite number}``."""
    if not isinstance(constraints, dict):
        raise ConfigError(f"invalid constraints {constraints!r}; expected {{metric name: upper "
                          "bound}, e.g. {'latency_ms_pixel3': 10.0}")
    for name, bound in constraints.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"invalid constraint name {name!r}; expected a metric name")
        if (not isinstance(bound, (int, float)) or isinstance(bound, bool)
                or not math.isfinite(bound)):
            raise ConfigError(f"invalid bound {bound!r} for constraint {name!r}; expected a "
                              f"finite number (upper bound: {name} <= bound)")
    for name in list(constraints):
        constraints[name] = float(constraints[name])


def parse_constraint(text: str) -> tuple[str, float]:
    """``"NAME<=VALUE"`` (the ``--constraint`` flag) as ``(NAME, VALUE)``."""
    name, sep, raw = text.partition("<=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"malformed constraint {text!r}; expected NAME<=VALUE, e.g. "
                          "latency_ms_pixel3<=10")
    try:
        bound = float(raw)
    except ValueError:
        raise ConfigError(f"invalid bound {raw.strip()!r} in constraint {text!r}; expected a "
                          "number, e.g. latency_ms_pixel3<=10") from None
    check_constraints({name: bound})
    return name, bound


def upgrade_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """A stored config of frugalnas 0.1 in today's fields: ``tracking``/``tracking_uri`` become
    the ``mlflow`` plugin's options (or block it), ``prescreen`` a ``prescreen`` strategy."""
    data = dict(data)
    tracking, uri = data.pop("tracking", True), data.pop("tracking_uri", None)
    if not tracking and "mlflow" not in data.get("disable_plugins", []):
        data["disable_plugins"] = [*data.get("disable_plugins", []), "mlflow"]
    if uri:
        data.setdefault("plugin_options", {}).setdefault("mlflow", {})["tracking_uri"] = uri
    prescreen = data.pop("prescreen", None)
    if prescreen:
        data["strategy_options"] = {"inner": data.get("strategy", "random"),
                                    "inner_options": data.get("strategy_options", {}),
                                    **prescreen}
        data["strategy"] = "prescreen"
    return data


#: Keys of a run file (TOML) that are not part of StudyConfig.
RUN_KEYS = ("study_name", "storage", "n_trials", "timeout", "n_jobs", "load_if_exists")

#: The isolation settings: ``auto`` (a child process for estimators that train, in-process
#: otherwise), ``none`` (in-process), ``process`` (a child process; refused where impossible).
ISOLATION_MODES = ("auto", "none", "process")
#: A worker stops after this many of its own trials failed in a row (``max_failures``).
DEFAULT_MAX_FAILURES = 10
#: Seconds between the heartbeats of ``frugalnas run`` on a database storage (workers choose
#: theirs with ``--heartbeat``).
DEFAULT_RUN_HEARTBEAT = 10


def check_run_settings(run: dict[str, Any]) -> None:
    """Raise ConfigError, naming the bad value and the valid ones, for a run setting (a
    :data:`RUN_KEYS` value from a run file or a flag) that cannot work."""
    check_keys("run settings", run, list(RUN_KEYS))
    n = run.get("n_trials")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ConfigError(f"invalid n_trials {n!r}; expected an integer >= 1")
    jobs = run.get("n_jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool)
                             or jobs == 0 or jobs < -1):
        raise ConfigError(f"invalid n_jobs {jobs!r}; expected an integer >= 1 (or -1: one per "
                          "CPU)")
    timeout = run.get("timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not 0 < timeout < math.inf):
        raise ConfigError(f"invalid timeout {timeout!r}; expected a finite number of seconds > 0 "
                          "for the whole study")
    for key in ("storage", "study_name"):
        value = run.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"invalid {key} {value!r}; expected a non-empty string")
    if "load_if_exists" in run and not isinstance(run["load_if_exists"], bool):
        raise ConfigError(f"invalid load_if_exists {run['load_if_exists']!r}; expected true or "
                          "false")


def check_worker_settings(heartbeat: int | None, grace: int | None, retries: int,
                          max_failures: int = DEFAULT_MAX_FAILURES) -> None:
    """Raise ConfigError for heartbeat/grace/retries/max_failures values that cannot work."""
    check_range("max_failures", max_failures, 0)
    if heartbeat is not None:
        check_range("heartbeat (seconds)", heartbeat, 1)
    if grace is not None:
        if heartbeat is None:
            raise ConfigError(f"grace {grace!r} needs heartbeats; add --heartbeat SECONDS")
        if not isinstance(grace, int) or grace <= heartbeat:
            raise ConfigError(f"invalid grace {grace!r}; it must exceed the heartbeat interval "
                              f"({heartbeat} s), or live trials would be failed as stale")
    check_range("retries", retries, 0)
    if retries and heartbeat is None:
        raise ConfigError(f"retries {retries!r} needs heartbeats to detect dead trials; "
                          "add --heartbeat SECONDS")


def check_keys(what: str, data: dict[str, Any], valid: list[str]) -> None:
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {key!r} in {what}{hint}; valid keys: {', '.join(valid)}")


def load_run_file(path: str | Path) -> tuple[StudyConfig, dict[str, Any]]:
    """Read a TOML run file: returns the study config and the run keys (:data:`RUN_KEYS`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        raise ConfigError(f"config file {str(path)!r}: run files are TOML (a .toml file such "
                          "as examples/first_study.toml; docs/cli.md shows the keys), not "
                          f"{path.suffix.lstrip('.').upper()}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    data = upgrade_legacy(data)
    valid = [f.name for f in fields(StudyConfig)] + list(RUN_KEYS)
    check_keys(f"config file {str(path)!r}", data, valid)
    run = {k: data.pop(k) for k in RUN_KEYS if k in data}
    return StudyConfig.from_mapping(data), run
