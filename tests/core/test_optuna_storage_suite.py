"""optuna's own storage tests against the storages a worker uses.

The test downloads the sdist of the installed optuna version from the package registry into a
temporary folder (nothing of optuna's is kept in this repository), takes its
``tests/storages_tests/test_storages.py``, ``test_heartbeat.py``, ``test_callbacks.py`` and
``tests/test_callbacks.py``, and runs them with pytest in a subprocess, once per storage:

* ``rdb``: optuna's plain ``RDBStorage`` (optuna's own fixtures), the baseline;
* ``make_storage``: ``frugalnas.distribution.quota_storage.make_storage(url, ...)``;
* ``quota``: ``QuotaStorage(make_storage(url, ...), url, n_trials)``, what a worker stores through.

A conftest generated in that folder replaces what optuna's ``StorageSupplier`` gives for its
sqlite modes (``sqlite``, ``cached_sqlite``), mapping its ``heartbeat_interval``,
``grace_period`` and callbacks to ``make_storage``'s arguments; on PostgreSQL (the fixture
server, when it runs here) every storage, the baseline's too, gets a new database. Every
test that passes on the baseline must pass on each wrapper, except those in ``BY_NAME``,
which check the class by name. The other storage modes of optuna's suite (in memory,
journal, gRPC) do not involve these storages and are left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import optuna
import pytest

pytestmark = pytest.mark.slow

FILES = ("tests/storages_tests/test_storages.py", "tests/storages_tests/test_heartbeat.py",
         "tests/storages_tests/test_callbacks.py", "tests/test_callbacks.py")

#: Tests that pass on RDBStorage but check that the storage *is* one by class (``isinstance(
#: storage, RDBStorage)``, then its private methods) and so fail on ``QuotaStorage``, which
#: wraps an RDBStorage (reach it as ``storage.inner``, docs/operations.md). ``make_storage``
#: returns an RDBStorage and has none.
BY_NAME = {
    "quota": {
        "test_create_new_study_unique_id": "asserts 3 distinct study ids unless isinstance("
                                           "storage, (RDBStorage, _CachedStorage, ...)), and "
                                           "an RDB reuses a deleted study's id",
        "test_get_trials_included_trial_ids": "asserts isinstance(storage, RDBStorage), then "
                                              "calls RDBStorage._get_trials",
        "test_get_trials_trial_id_greater_than": "asserts isinstance(storage, RDBStorage), "
                                                 "then calls RDBStorage._get_trials",
        "test_fail_stale_trials": "asserts isinstance(storage, RDBStorage)",
        "test_fail_stale_trials_with_race_condition": "asserts isinstance(storage, RDBStorage)",
        "test_get_stale_trial_ids": "asserts isinstance(storage, RDBStorage), then calls "
                                    "its _get_stale_trial_ids",
    },
}
#: Deliberate differences, for both wrappers: make_storage hides optuna's ExperimentalWarning
#: for the heartbeats (frugalnas turns them on itself, ``frugalnas run`` by default, so the
#: user has nothing to act on; ``quiet_experimental`` in frugalnas/distribution/quota_storage.py).
DELIBERATE = {
    "test_heartbeat_experimental_warnings": "expects optuna's ExperimentalWarning naming "
                                            "heartbeat_interval, which make_storage hides",
}

CONFTEST = '''
import os
import sys
import types

# optuna.testing.storages imports fakeredis for its journal_redis mode, which is not run here.
sys.modules.setdefault("fakeredis", types.SimpleNamespace(FakeStrictRedis=lambda: None))

import optuna
import sqlalchemy
from optuna.testing import storages as supplied

VARIANT = os.environ["FRUGALNAS_SUITE_VARIANT"]
ADMIN = os.environ.get("FRUGALNAS_SUITE_POSTGRES")  # None: sqlite
_enter, _exit = supplied.StorageSupplier.__enter__, supplied.StorageSupplier.__exit__
_count = [0]


def _new_url(self):
    if ADMIN is None:
        self.tempfile = supplied.NamedTemporaryFilePool().tempfile()
        return f"sqlite:///{self.tempfile.name}"
    _count[0] += 1
    name = f"suite_{VARIANT}_{os.getpid()}_{_count[0]}"
    engine = sqlalchemy.create_engine(ADMIN, isolation_level="AUTOCOMMIT",
                                      poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return ADMIN.rsplit("/", 1)[0] + "/" + name


def __enter__(self):
    mode = self.storage_specifier
    if mode not in ("sqlite", "cached_sqlite") or (VARIANT == "rdb" and ADMIN is None):
        return _enter(self)
    url = _new_url(self)
    args = dict(self.extra_args)
    if VARIANT == "rdb":
        storage = optuna.storages.RDBStorage(url, **args)
        self.storage = optuna.storages._CachedStorage(storage) if "cached" in mode else storage
        return self.storage
    from frugalnas.distribution.quota_storage import QuotaStorage, make_storage

    on_stale = args.pop("heartbeat_stale_trial_callback", None) or \\
        args.pop("failed_trial_callback", None)
    storage = make_storage(url, heartbeat=args.pop("heartbeat_interval", None),
                           grace=args.pop("grace_period", None), on_stale=on_stale)
    assert not args, f"arguments not mapped: {args}"
    if VARIANT == "quota":
        storage = QuotaStorage(storage, url, 10**9)
    self.storage = storage
    return storage


def __exit__(self, *exc):
    inner = getattr(self.storage, "inner", None)
    if inner is not None:
        inner.engine.dispose()
    return _exit(self, *exc)


supplied.StorageSupplier.__enter__ = __enter__
supplied.StorageSupplier.__exit__ = __exit__
'''


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    """optuna's test files of the installed version, from its sdist, with the conftest."""
    root = tmp_path_factory.mktemp("optuna_suite")
    version = optuna.__version__
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", f"optuna=={version}", "--no-binary", ":all:",
         "--no-deps", "--no-build-isolation", "-d", str(root / "sdist"), "-q",
         "--timeout", "30"], capture_output=True, text=True, timeout=600)
    archives = list((root / "sdist").glob(f"optuna-{version}.tar.gz"))
    if not archives:
        text = (fetched.stderr or fetched.stdout).lower()
        if any(w in text for w in ("connection", "resolve", "network", "timed out",
                                   "temporary failure", "unreachable", "proxy")):
            pytest.skip(f"the package registry cannot be reached to download optuna=={version}'s "
                        f"sdist: {(fetched.stderr or fetched.stdout).strip().splitlines()[-1]}")
        pytest.fail(f"pip download optuna=={version} failed: {fetched.stderr[-2000:]}")
    tree = root / "suite"
    with tarfile.open(archives[0]) as tar:
        for path in FILES + ("tests/__init__.py", "tests/storages_tests/__init__.py",
                             "tests/conftest.py"):
            member = f"optuna-{version}/{path}"
            try:
                data = tar.extractfile(member)
            except KeyError:
                if path in FILES[:2]:
                    pytest.fail(f"optuna {version}'s sdist has no {path}")
                continue
            target = tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data.read() if data else b"")
    (tree / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tree / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return tree


def _run(tree: Path, variant: str, postgres: str | None) -> dict[str, str]:
    """Each test's outcome (``passed``, ``failed``, ``skipped``) under ``variant``."""
    report = tree / f"{variant}-{'pg' if postgres else 'sqlite'}.xml"
    env = dict(os.environ, FRUGALNAS_SUITE_VARIANT=variant, PYTHONWARNINGS="ignore")
    env.pop("FRUGALNAS_SUITE_POSTGRES", None)
    if postgres:
        env["FRUGALNAS_SUITE_POSTGRES"] = postgres
    files = [f for f in FILES if (tree / f).exists()]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *files,
         "-k", "not inmemory and not journal and not grpc", f"--junitxml={report}"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=1500)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else
                          "skipped" if "skipped" in kinds else "passed")
    return outcomes


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_optunas_storage_tests_pass_on_the_worker_storages(suite, database, request):
    postgres = None
    if database == "postgresql":
        postgres = request.getfixturevalue("postgres_server").url()
    baseline = _run(suite, "rdb", postgres)
    passed = {name for name, outcome in baseline.items() if outcome == "passed"}
    assert len(passed) >= 40, f"too few of optuna's tests passed on RDBStorage: {baseline}"
    problems = []
    for variant in ("make_storage", "quota"):
        outcomes = _run(suite, variant, postgres)
        allowed = {**BY_NAME.get(variant, {}), **DELIBERATE}
        broken = sorted(n for n in passed if outcomes.get(n) != "passed"
                        and n.rsplit("::", 1)[1].split("[", 1)[0] not in allowed)
        if broken:
            problems.append(f"{variant}: {len(broken)} of {len(passed)} fail: {broken}")
    assert not problems, "\n".join(problems)
