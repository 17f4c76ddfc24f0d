"""Checks of an MLflow tracking URI that run before the first trial (the plugin's
``frugalnas_check_config``): each takes at most a few seconds and fails with one line that
names the URI and says what to do."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request
from pathlib import Path

from frugalnas.ports.errors import ConfigError
from frugalnas.ports.secrets import mask_text

#: Seconds a tracking server or database may take to answer the reachability check.
PROBE_SECONDS = 5.0
VALID = ("sqlite:///mlflow.db (a file here; sqlite:////abs/path/mlflow.db), "
         "http://HOST:5000 (a tracking server), postgresql://USER@HOST/DB or file:///DIR")
#: Schemes frugalnas checks; any other scheme (databricks, a plugin's store) is left to MLflow.
DATABASES = ("postgresql", "mysql", "mssql")


def check_tracking_uri(uri: str, probe_seconds: float = PROBE_SECONDS) -> None:
    """Raise :class:`ConfigError` for a tracking URI MLflow cannot use: no scheme, a sqlite or
    file store in a folder that does not exist, a server or database that does not answer
    within ``probe_seconds``. The message shows the URI with its password masked."""
    try:
        _check_tracking_uri(uri, probe_seconds)
    except ConfigError as exc:
        raise ConfigError(mask_text(str(exc))) from None


def _check_tracking_uri(uri: str, probe_seconds: float) -> None:
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"invalid MLflow tracking URI {uri!r}; valid URIs look like {VALID}")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if not scheme or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):
        raise ConfigError(f"invalid MLflow tracking URI {uri!r}: it has no scheme; valid URIs "
                          f"look like {VALID}")
    if scheme == "sqlite":
        _check_sqlite(uri)
    elif scheme == "file":
        from urllib.parse import unquote, urlparse

        _check_folder(uri, Path(unquote(urlparse(uri).path)), kind="file store")
    elif scheme in ("http", "https"):
        _check_server(uri, probe_seconds)
    elif scheme.split("+")[0] in DATABASES:
        _check_database(uri, probe_seconds)


def _check_sqlite(uri: str) -> None:
    if not uri.startswith("sqlite:///") or uri == "sqlite:///" or ":memory:" in uri:
        raise ConfigError(f"invalid MLflow tracking URI {uri!r}; a sqlite store is "
                          "sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db")
    _check_folder(uri, Path(uri[len("sqlite:///"):]), kind="sqlite store")


def _check_folder(uri: str, path: Path, kind: str) -> None:
    folder = path.parent
    if not folder.resolve().is_dir():
        raise ConfigError(f"MLflow tracking URI {uri!r}: the folder {str(folder)!r} of the "
                          f"{kind} does not exist; create it first (frugalnas does not create "
                          "folders for a tracking store)")


def _check_server(uri: str, seconds: float) -> None:
    request = urllib.request.Request(uri.rstrip("/") + "/health")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if user:  # a server behind basic authentication may guard /health too
        token = f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        with urllib.request.urlopen(request, timeout=seconds):
            return
    except urllib.error.HTTPError:
        return  # it answered (a proxy or a server without /health): reachable
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"MLflow tracking server {uri} is not reachable within {seconds:g} s "
                          f"({reason}); start it, fix --tracking-uri, or run with "
                          "--no-tracking") from None


def _check_database(uri: str, seconds: float) -> None:
    import sqlalchemy

    connect_args = {"connect_timeout": max(1, int(seconds))} \
        if uri.split(":", 1)[0].split("+")[0] in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.pool.NullPool,
                                          connect_args=connect_args)
        with engine.connect():
            pass
        engine.dispose()
    except ImportError as exc:
        raise ConfigError(f"MLflow tracking URI {uri!r} needs a database driver that is not "
                          f"installed ({exc}); pip install 'frugalnas[postgres]'") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"MLflow tracking database {_redact(uri)} is not reachable within "
                          f"{seconds:g} s ({first[:300]}){_password_hint(uri)}") from None


def _password_hint(uri: str) -> str:
    """A hint for a database URI with a user but no password: a study never stores one."""
    try:
        import sqlalchemy

        url = sqlalchemy.engine.make_url(uri)
    except Exception:
        return ""
    if url.username and url.password is None:
        return ("; a study stores no password: give it in the environment (PGPASSWORD for "
                "PostgreSQL, or ~/.pgpass) or in --tracking-uri")
    return ""


def _redact(uri: str) -> str:
    """``uri`` without its password."""
    try:
        import sqlalchemy

        return sqlalchemy.engine.make_url(uri).render_as_string(hide_password=True)
    except Exception:
        return uri.split("@")[-1]
