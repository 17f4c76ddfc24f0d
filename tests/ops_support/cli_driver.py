"""Several ``frugalnas`` command lines in one fresh interpreter.

Starting ``python -m frugalnas.cli.main`` costs seconds (torch, optuna, MLflow, scipy are
imported), so tests whose command lines only parse, check and print run them in one process
that calls the CLI's ``main`` once per case, each with its own captured stdout and stderr and
its exit status (``main``'s return value or ``SystemExit``'s code). Command lines that train,
run workers, or whose exit status, signals or progress bar matter as a process's keep their
own ``subprocess.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

DRIVER = textwrap.dedent('''
    import contextlib, io, json, sys, traceback
    from frugalnas.cli.main import main
    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
            except BaseException:
                rc = "exception"
                traceback.print_exc()
        results.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue()})
    print(json.dumps(results))
''')


def cli_cases(cases: list[list[str]], cwd: Path, env: dict[str, str] | None = None,
              timeout: float = 300) -> list[dict]:
    """Run ``frugalnas ARGV`` for each case in one fresh interpreter (in ``cwd``, with
    ``env``, default: this process's); one ``{"rc", "out", "err"}`` per case."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases)], cwd=cwd,
                          capture_output=True, text=True, env=env or dict(os.environ),
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])
