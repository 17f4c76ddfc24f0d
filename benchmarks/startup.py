"""Start-up time of the command line against ``python -c "import optuna"``.

Each command runs in a fresh interpreter (a subprocess, as a user types it); the rounds
interleave the commands so that they share the machine's load, and each command's figure is
the median of its rounds. Printed: the median wall-clock seconds, the ratio to importing
optuna, and whether torch, MLflow, LightGBM, scikit-learn or scipy were imported (read from
``sys.modules`` at exit by a small wrapper that runs the same ``main`` as the ``frugalnas``
script).

    python benchmarks/startup.py [--rounds 5]

Goal: ``frugalnas --help`` and an unknown search space's error each within 1.5x of
``import optuna``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "mlflow", "lightgbm", "sklearn", "scipy", "optuna")

#: Runs frugalnas's command line with the arguments after ``--`` and writes the top-level
#: names of the imported modules to the file named by the first argument.
WRAPPER = """
import sys
out, argv = sys.argv[1], sys.argv[2:]
try:
    from frugalnas.cli.main import main
    code = main(argv)
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    f.write(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
sys.exit(code)
"""

#: label -> a plain interpreter command, or the arguments of ``frugalnas``.
COMMANDS: dict[str, list[str]] = {
    'python -c "import optuna"': [sys.executable, "-c", "import optuna"],
    'python -c "import frugalnas"': [sys.executable, "-c", "import frugalnas"],
    "frugalnas --help": ["--help"],
    "frugalnas run --space nosuch --dry-run": ["run", "--space", "nosuch", "--dry-run"],
    "frugalnas run --estimator nosuch --dry-run": ["run", "--estimator", "nosuch", "--dry-run"],
    "frugalnas run --spcae nb201 (misspelt flag)": ["run", "--spcae", "nb201"],
    "frugalnas plugins": ["plugins"],
}


def run_once(args: list[str], modules_file: Path) -> tuple[float, int, set[str]]:
    """Seconds, exit status and the imported top-level modules of one command."""
    if args[0] == sys.executable:
        cmd = [*args[:-1], args[-1] + f"\nimport sys\nopen({str(modules_file)!r}, 'w').write("
               "' '.join(sorted({m.split('.')[0] for m in sys.modules})))"]
    else:
        cmd = [sys.executable, "-c", WRAPPER, str(modules_file), *args]
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, "FRUGALNAS_PROGRESS": "0"})
    seconds = time.perf_counter() - start
    return seconds, done.returncode, set(modules_file.read_text().split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args()
    times: dict[str, list[float]] = {label: [] for label in COMMANDS}
    status: dict[str, int] = {}
    heavy: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        modules_file = Path(tmp) / "modules.txt"
        for label, cmd in COMMANDS.items():  # warm-up: the file system's caches, .pyc files
            run_once(cmd, modules_file)
        for _ in range(args.rounds):
            for label, cmd in COMMANDS.items():
                seconds, code, modules = run_once(cmd, modules_file)
                times[label].append(seconds)
                status[label] = code
                heavy[label] = [m for m in HEAVY if m in modules]
    base = statistics.median(times['python -c "import optuna"'])
    rows = []
    print(f"median of {args.rounds} interleaved rounds (wall clock, one fresh interpreter each)")
    print(f"{'command':<46} {'median s':>9} {'x optuna':>9} {'exit':>5}  heavy imports")
    for label in COMMANDS:
        med = statistics.median(times[label])
        rows.append({"command": label, "median_s": round(med, 3), "ratio": round(med / base, 2),
                     "exit": status[label], "imports": heavy[label]})
        print(f"{label:<46} {med:>9.3f} {med / base:>9.2f} {status[label]:>5}  "
              f"{', '.join(heavy[label]) or '-'}")
    goal = all(r["ratio"] <= 1.5 for r in rows
               if r["command"] in ("frugalnas --help", "frugalnas run --space nosuch --dry-run"))
    print(f"goal (--help and the unknown space within 1.5x of import optuna): "
          f"{'met' if goal else 'not met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
