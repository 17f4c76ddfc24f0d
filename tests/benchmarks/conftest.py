"""The benchmark scripts' own folder on the path, as when they run (``python benchmarks/NAME.py``),
so that their tests import the lab (``frugalnas_lab``) as the scripts do."""

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
