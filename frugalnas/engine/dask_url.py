"""How a storage URL names a study kept in the memory of a Dask scheduler, known without
importing Dask."""

from __future__ import annotations

from typing import Any

#: A study kept in the memory of a Dask scheduler: ``dask`` with ``frugalnas run --cluster``
#: (the cluster's scheduler), or ``dask:tcp://HOST:PORT`` (frugalnas.engine.dask_storage).
DASK_STORAGE = "dask"


def is_dask_url(url: Any) -> bool:
    """Whether ``url`` names a study kept by a Dask scheduler (``dask``, ``dask:ADDRESS``)."""
    return isinstance(url, str) and (url == DASK_STORAGE or url.startswith(DASK_STORAGE + ":"))
