"""Throwaway servers for the operations tests: a PostgreSQL cluster in a temporary folder
(``initdb`` + ``pg_ctl``, as the ``postgres`` user when the tests run as root) listening on
127.0.0.1, and an ``mlflow server``. Both pick a free port; both are stopped by the tests.

Set ``FRUGALNAS_REQUIRE_POSTGRES=1`` (CI does) to make a missing PostgreSQL an error instead
of a skip."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PG_USER = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's /usr/lib/postgresql."""
    found = shutil.which("initdb") and shutil.which("pg_ctl")
    if found:
        return Path(shutil.which("initdb")).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


def postgres_missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    bindir = postgres_bindir()
    if bindir is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl) not found; install them with "
                "`apt-get install postgresql` (CI does)")
    try:
        import sqlalchemy

        sqlalchemy.create_engine("postgresql://u@127.0.0.1/db")  # imports the default driver
    except ImportError as exc:
        return f"the PostgreSQL driver is missing ({exc}); pip install -e \".[postgres]\""
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(PG_USER)
        except KeyError:
            return "running as root without a 'postgres' user to run initdb as"
    return None


class PostgresServer:
    """A PostgreSQL cluster in a temporary folder on 127.0.0.1:port (fsync off: a test
    server). The local superuser ``postgres`` logs in without a password (trust), or with
    ``password`` (scram-sha-256) when one is given."""

    def __init__(self, password: str | None = None) -> None:
        self.password = password
        self.bindir = postgres_bindir()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="frugalnas-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            import pwd

            pw = pwd.getpwnam(PG_USER)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._databases = 0

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_root:
            cmd = ["runuser", "-u", PG_USER, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=self.root)
        if proc.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n"
                               f"{proc.stderr}\n{log[-3000:]}")

    def start(self) -> "PostgresServer":
        auth = ["-A", "trust"]
        if self.password is not None:
            pwfile = self.root / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as_root:
                import pwd

                pw = pwd.getpwnam(PG_USER)
                os.chown(pwfile, pw.pw_uid, pw.pw_gid)
            auth = ["-A", "scram-sha-256", f"--pwfile={pwfile}"]
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, *auth, "-E", "UTF8",
                  "--no-sync")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=300 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")
        return self

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """The URL of ``database``, with ``password`` (default: the server's own, if any)."""
        password = self.password if password is None else password
        login = PG_USER if password is None else f"{PG_USER}:{password}"
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "db") -> str:
        """A new, empty database; returns its URL."""
        import sqlalchemy

        self._databases += 1
        name = f"{prefix}_{self._databases}_{os.getpid()}"
        engine = sqlalchemy.create_engine(self.url(), isolation_level="AUTOCOMMIT",
                                          poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop",
                      timeout=60)
        except Exception:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


class MlflowServer:
    """An ``mlflow server`` process started from ``command`` (a list of arguments); ready
    when ``/health`` answers."""

    def __init__(self, command: list[str], port: int, log: Path, env: dict[str, str] | None = None):
        self.command, self.port, self.log = command, port, log
        self.uri = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)

    def wait_ready(self, timeout: float = 180) -> "MlflowServer":
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n"
                                   f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server not ready after {timeout} s:\n"
                           f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=20)


def mlflow_server_command(backend_store_uri: str, artifacts: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port",
            str(port), "--workers", "1"]
