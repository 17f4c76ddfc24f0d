"""A file of measured latencies, keyed by what a measurement depends on.

One SQLite file (safe for several processes and workers of one machine): a key is the hash
of the space, the architecture, the input shape, the measurement setup, the processor model
and the runtime's version; the value is the :class:`~frugalnas.latency.measure.Measurement`.
A changed setup, runtime version or machine is a different key, never a stale answer.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frugalnas.ports.errors import ConfigError
from frugalnas.latency.measure import Measurement


def cache_key(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class LatencyCache:
    """Measured latencies in the SQLite file ``path`` (created with its folder on first
    use)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute("CREATE TABLE IF NOT EXISTS latency "
                           "(key TEXT PRIMARY KEY, measurement TEXT NOT NULL)")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"latency cache {str(self.path)!r} cannot be used: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def get(self, key: str) -> Measurement | None:
        with self._connect() as db:
            row = db.execute("SELECT measurement FROM latency WHERE key = ?", (key,)).fetchone()
        return Measurement(**json.loads(row[0])) if row else None

    def put(self, key: str, measurement: Measurement) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO latency VALUES (?, ?)",
                       (key, json.dumps(measurement.to_dict())))

    def __len__(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT COUNT(*) FROM latency").fetchone()[0])
