"""A progress bar for long work before or outside trials (a warm start, an export)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress_shown(progress: bool | None = None) -> bool:
    """Whether to draw a bar: ``progress`` when given, else ``FRUGALNAS_PROGRESS`` (``1``
    always, ``0`` never), else when stderr is a terminal."""
    if progress is not None:
        return bool(progress)
    flag = os.environ.get("FRUGALNAS_PROGRESS", "auto")
    return flag == "1" or (flag != "0" and sys.stderr.isatty())


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
