"""A progress bar for long work before or outside trials (a warm start, an export).

Whether a bar is drawn: what the caller says (``progress=True/False``); else the setting of the
study session running now (:func:`session_progress`, which the ``progress`` plugin opens with
its ``show`` option, ``False`` under ``frugalnas run -q``); else, as a user's override, the
environment variable ``FRUGALNAS_PROGRESS`` (``1`` always, ``0`` never); else when stderr is
a terminal. A session's ``show = true`` still yields to ``FRUGALNAS_PROGRESS=0``.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: The user's override of every bar (``1``: always, ``0``: never).
PROGRESS_ENV = "FRUGALNAS_PROGRESS"

# The setting of the session that runs in this context (thread): set and reset around a study
# session, never assigned otherwise.
_SESSION: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "frugalnas_session_progress", default=None)


def env_progress() -> bool | None:
    """``FRUGALNAS_PROGRESS``: ``True`` for ``1``, ``False`` for ``0``, else ``None``."""
    flag = os.environ.get(PROGRESS_ENV, "").strip()
    return True if flag == "1" else False if flag == "0" else None


def progress_shown(progress: bool | None = None) -> bool:
    """Whether to draw a bar (see the module): ``progress`` when given, else the session's
    setting (``False`` wins; ``True`` unless ``FRUGALNAS_PROGRESS=0``), else
    ``FRUGALNAS_PROGRESS``, else when stderr is a terminal."""
    if progress is not None:
        return bool(progress)
    session = _SESSION.get()
    if session is False:
        return False
    env = env_progress()
    if env is not None:
        return env
    return True if session else sys.stderr.isatty()


def session_progress(show: bool | None) -> contextvars.Token[bool | None]:
    """Set the bars' setting of the study session that starts in this context (``None``:
    no setting); returns the token :func:`end_session_progress` takes when it ends."""
    return _SESSION.set(None if show is None else bool(show))


def end_session_progress(token: contextvars.Token[bool | None]) -> None:
    """Restore the setting from before :func:`session_progress` returned ``token``."""
    try:
        _SESSION.reset(token)
    except ValueError:  # ended in another context (thread) than it began: nothing to undo
        pass


def work_progress(items: Iterable[T], desc: str, progress: bool | None = None) -> Iterator[T]:
    """``items`` one by one, with a bar on stderr named ``desc`` when :func:`progress_shown`."""
    items = list(items)
    if not progress_shown(progress):
        yield from items
        return
    from tqdm.auto import tqdm

    with tqdm(total=len(items), desc=desc, unit="arch", file=sys.stderr,
              dynamic_ncols=True) as bar:
        for item in items:
            yield item
            bar.update(1)
