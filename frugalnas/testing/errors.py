"""The error every conformance check raises."""

from __future__ import annotations


class ConformanceError(AssertionError):
    """A component broke the contract of its kind. ``subject`` names the component (kind,
    name, class), ``check`` the check it failed and ``detail`` what went wrong."""

    def __init__(self, subject: str, check: str, detail: str):
        self.subject, self.check, self.detail = subject, check, detail
        super().__init__(f"{subject} fails {check}: {detail}")
