"""Storage URLs: checked before anything touches the storage, opened the same way everywhere.

A study's storage is optuna's: ``sqlite:///PATH``, ``postgresql[+DRIVER]://...``,
``mysql[+DRIVER]://...`` (SQLAlchemy URLs) or ``journal:PATH`` (an append-only file).
:func:`check_storage_url` refuses, in one line, a URL that cannot work: an unknown scheme, a
database driver that is not installed (naming the pip package to install), a sqlite or
journal file whose directory does not exist. It only reads the file system and imports
nothing but SQLAlchemy's URL parser, so ``--dry-run`` can run it.
"""

from __future__ import annotations

import errno
import importlib.util
import os
from pathlib import Path
from typing import Any

from frugalnas.engine.dask_url import DASK_STORAGE, is_dask_url
from frugalnas.ports.errors import ConfigError, OperationalFailure

VALID = ("sqlite:///PATH, journal:PATH, postgresql://USER:PASSWORD@HOST/DB, "
         "mysql://USER:PASSWORD@HOST/DB (a driver may follow the database name: "
         "postgresql+psycopg://..., mysql+pymysql://...)")

#: database -> default driver, and driver -> (module to import, pip package to install).
DEFAULT_DRIVER = {"sqlite": "pysqlite", "postgresql": "psycopg2", "mysql": "mysqldb"}
DRIVERS: dict[str, dict[str, tuple[str, str]]] = {
    "sqlite": {"pysqlite": ("sqlite3", "a Python built with sqlite3")},
    "postgresql": {"psycopg2": ("psycopg2", "psycopg2-binary"),
                   "psycopg": ("psycopg", "psycopg[binary]"),
                   "pg8000": ("pg8000", "pg8000"),
                   "psycopg2cffi": ("psycopg2cffi", "psycopg2cffi")},
    "mysql": {"mysqldb": ("MySQLdb", "mysqlclient"),
              "pymysql": ("pymysql", "pymysql"),
              "mysqlconnector": ("mysql.connector", "mysql-connector-python"),
              "mariadbconnector": ("mariadb", "mariadb")},
}
#: A driver without C extensions, suggested when none is installed.
PURE_PYTHON = {"postgresql": "pg8000", "mysql": "pymysql"}
DASK_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
#: Common misspellings of a scheme.
ALIASES = {"postgres": "postgresql", "psql": "postgresql", "pg": "postgresql",
           "sqlite3": "sqlite", "mariadb": "mysql", "journal": "journal"}


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages)."""
    if "://" not in url or "@" not in url:
        return url
    head, rest = url.split("://", 1)
    creds, at, tail = rest.rpartition("@")
    user, colon, _ = creds.partition(":")
    return f"{head}://{user}{':***' if colon else ''}{at}{tail}"


def check_storage_url(url: Any, must_exist: bool = False) -> None:
    """Raise :class:`ConfigError` (one line naming the URL and what would be valid, or the
    package to install) unless ``url`` is a storage frugalnas can open. ``None`` (in memory)
    and storage objects pass unchecked. With ``must_exist`` (reopening a study) a sqlite or
    journal file must already exist."""
    if url is None or not isinstance(url, (str, os.PathLike)):
        if url is not None and not hasattr(url, "create_new_study"):
            raise ConfigError(f"invalid storage {url!r}; expected a URL string ({VALID}) "
                              "or an optuna storage object")
        return
    url = os.fspath(url)
    shown = masked(url)
    if not url.strip():
        raise ConfigError(f"invalid storage URL {url!r}; valid: {VALID}")
    if url.startswith("journal:"):
        _check_file("journal", url[len("journal:"):], url, must_exist)
        return
    if is_dask_url(url):
        address = url[len(DASK_STORAGE) + 1:]
        scheme, sep, rest = address.partition("://")
        host, colon, port = rest.rpartition(":")
        if address and not (scheme in DASK_SCHEMES and sep and host and colon and port.isdigit()):
            raise ConfigError(f"invalid storage URL {shown!r}; a study in a Dask scheduler's "
                              "memory is dask (with --cluster tcp://HOST:PORT) or "
                              f"dask:tcp://HOST:PORT (schemes: {', '.join(DASK_SCHEMES)})")
        return
    if "://" not in url:
        raise ConfigError(f"invalid storage URL {shown!r}{_hint_for_path(url)}; valid: {VALID}")
    scheme = url.split("://", 1)[0]
    database, _, driver = scheme.partition("+")
    database = database.lower()
    if database not in DRIVERS:
        alias = ALIASES.get(database)
        hint = f" (did you mean {alias}://?)" if alias and alias != "journal" else \
            " (did you mean journal:PATH?)" if alias == "journal" else ""
        raise ConfigError(f"unsupported storage URL {shown!r}: unknown scheme {scheme!r}{hint}; "
                          f"valid: {VALID}")
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"invalid storage URL {shown!r}: {str(exc).splitlines()[0]}; "
                          f"valid: {VALID}") from None
    driver = driver or DEFAULT_DRIVER[database]
    known = DRIVERS[database]
    if driver not in known:
        raise ConfigError(f"unsupported driver {driver!r} in storage URL {shown!r}; valid "
                          f"{database} drivers: {', '.join(known)} (async drivers do not work "
                          "with optuna)")
    module, package = known[driver]
    if not _installed(module):
        raise ConfigError(f"storage URL {shown!r} needs the {database} driver {module!r}, "
                          f"which is not installed; pip install {package}"
                          + _other_drivers(database, driver))
    if database == "sqlite":
        if parsed.host or parsed.port:
            raise ConfigError(f"invalid storage URL {shown!r}: a sqlite URL has three slashes "
                              f"and a path, e.g. sqlite:///{parsed.host or 'study.db'} (or "
                              "sqlite:////ABSOLUTE/PATH)")
        if parsed.database in (None, "", ":memory:"):
            return  # an in-memory sqlite database
        _check_file("sqlite", parsed.database, shown, must_exist)


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it, but its parent)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _other_drivers(database: str, driver: str) -> str:
    installed = [d for d, (m, _) in DRIVERS[database].items() if d != driver and _installed(m)]
    if not installed:
        pure = PURE_PYTHON.get(database)
        return "" if pure is None or pure == driver else \
            f" (or the pure-Python driver: {database}+{pure}://..., pip install {DRIVERS[database][pure][1]})"
    return f" (or use an installed driver: {', '.join(f'{database}+{d}://' for d in installed)})"


def _hint_for_path(url: str) -> str:
    if url.endswith((".log", ".journal", ".jsonl")):
        return f" (a journal file is written journal:{url})"
    return f" (a sqlite file is written sqlite:///{url})"


def _check_file(kind: str, path: str, shown: str, must_exist: bool = False) -> None:
    if not path:
        raise ConfigError(f"invalid storage URL {shown!r}: no file path; expected "
                          f"{'sqlite:///PATH' if kind == 'sqlite' else 'journal:PATH'}")
    file = Path(path)
    parent = file.parent if str(file.parent) else Path(".")
    if file.is_dir():
        raise ConfigError(f"storage URL {shown!r} names the directory {str(file)!r}; give a "
                          "file path inside it")
    if not parent.is_dir():
        raise ConfigError(f"the directory {str(parent)!r} of storage URL {shown!r} does not "
                          "exist; create it first or choose another path")
    if must_exist and not file.exists():
        raise ConfigError(f"the file {str(file)!r} of storage URL {shown!r} does not exist (no "
                          "study was stored there)")
    if file.exists():
        if not os.access(file, os.R_OK | os.W_OK):
            raise ConfigError(f"the file {str(file)!r} of storage URL {shown!r} is not "
                              "readable and writable")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create the file of storage URL {shown!r}: the directory "
                          f"{str(parent)!r} is not writable")


def open_storage(url: Any) -> Any:
    """What optuna is given for ``url``: a journal storage for ``journal:PATH``, otherwise the
    URL (or storage object) itself."""
    if isinstance(url, str) and url.startswith("journal:"):
        import optuna
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    if is_dask_url(url):
        from frugalnas.engine.dask_storage import open_dask_storage

        return open_dask_storage(url)
    return url


def storage_error(url: Any, exc: BaseException) -> ConfigError | None:
    """A one-line ConfigError for an exception raised while opening ``url`` (the database is
    unreachable, refuses the login, ...); ``None`` if ``exc`` is not about the storage."""
    module = type(exc).__module__ or ""
    if not (module.startswith(("sqlalchemy", "psycopg", "pymysql", "MySQLdb", "sqlite3",
                               "pg8000", "mysql"))
            or isinstance(exc, (ImportError, OSError))):
        return None
    shown = masked(url) if isinstance(url, str) else type(url).__name__
    if isinstance(exc, ImportError):
        return ConfigError(f"storage {shown!r}: a database driver failed to import: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    orig = getattr(exc, "orig", None) or exc
    text = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return ConfigError(f"cannot open storage {shown!r}: {type(orig).__name__}: {text}")


#: Messages of errors that say the disk (or the database's quota) is full.
DISK_FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded",
                   "could not extend file")


def cause_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, innermost last
    (``__cause__``, else ``__context__``), each once."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def operational_failure(exc: BaseException, url: Any = None, what: str = "storage", *,
                        disk_only: bool = False) -> OperationalFailure | None:
    """A one-line error for a failure of the machine rather than of a trial, met while a
    study runs: a full disk under a store, a database server that went away or refuses the
    login. The exception's chain of causes is searched (optuna and SQLAlchemy wrap the
    driver's error, and optuna's own handling may raise another on top). ``url`` names the
    store, ``what`` its kind ("storage": the optuna storage; "MLflow store"), password
    masked. ``disk_only`` finds only a full disk (a database error may be transient, a lock
    held by another process). ``None`` when nothing in the chain is such a failure."""
    found: BaseException | None = None
    for current in cause_chain(exc):
        text = str(current).lower()
        if any(t in text for t in DISK_FULL_TEXTS) or (
                isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT)):
            found = current
            break
        module = type(current).__module__ or ""
        if found is None and not disk_only and module.startswith(("sqlalchemy", "psycopg", "sqlite3", "pymysql")) \
                and "operationalerror" in type(current).__name__.lower():
            found = current
    if found is None:
        return None
    orig = getattr(found, "orig", None) or found
    text = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    where = f"{what} {masked(url)!r}" if isinstance(url, str) else what
    return OperationalFailure(f"{where} failed: {type(orig).__name__}: {text}; what was "
                              "recorded before it is kept: fix it and run the same command to "
                              "continue")
