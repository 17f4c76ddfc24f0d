"""The launcher checks of the conformance suite."""

from __future__ import annotations

from typing import Any

from frugalnas.distribution.launcher import Launcher, WorkerJob
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import ConfigError
from frugalnas.testing._suite import Suite, describe


class LauncherChecks(Suite):
    """The launcher contract: a :class:`frugalnas.distribution.launcher.Launcher` that says where it
    runs workers (``where``) and whose ``check`` refuses, with a ``ConfigError`` and before
    touching any machine, a job on a storage its workers cannot share (the in-memory study,
    a relative sqlite path)."""

    kind = "launchers"
    checks = ("check_is_launcher", "check_refuses_unshared_storage")

    def __init__(self, launcher: Any, *, name: str | None = None):
        self.launcher = launcher
        self.subject = describe("launcher", launcher, name)

    def check_is_launcher(self) -> None:
        if not isinstance(self.launcher, Launcher):
            self.fail(f"is a {type(self.launcher).__name__}, not a "
                      "frugalnas.distribution.launcher.Launcher")
        if not isinstance(self.launcher.where, str) or not self.launcher.where:
            self.fail(f"where = {self.launcher.where!r}; expected a non-empty description")

    def check_refuses_unshared_storage(self) -> None:
        config = StudyConfig.from_mapping({"space": "nb201", "estimator": "nb201-table"})
        for storage in ("", "sqlite:///:memory:", "sqlite:///relative.db"):
            try:
                self.launcher.check(WorkerJob(config, storage, "conformance", 2))
            except ConfigError:
                continue
            self.fail(f"check() accepted storage {storage!r}, which its workers cannot share")
