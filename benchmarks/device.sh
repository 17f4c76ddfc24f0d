#!/usr/bin/env bash
# Every GPU figure frugalnas claims, in one prepared run for a lent device machine (sized for one
# H200 with 16 cores: at most 8 minutes of wall time, each part in its own time-boxed process).
#
#   bash benchmarks/device.sh              # on the device machine
#   bash benchmarks/device.sh --rehearse   # anywhere, on the CPU, tiny sizes (about a minute)
#
# Writes $OUT/device.json (figures) and $OUT/device.log (everything the parts printed);
# OUT defaults to ./device-out. Further options go to benchmarks/device.py (--parts NAME...,
# --total SECONDS). See docs/device.md.
#
# Nothing is downloaded: the project runs from the working tree (PYTHONPATH), with whatever
# Python the machine has (PYTHON, else python3). Wheels placed in $WHEELS (default ./.whl), for
# instance optuna and its needs for the parts that run studies, are installed offline into a
# temporary folder first. A part whose dependency is missing reports "skipped: <module> missing".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export OUT
PY=${PYTHON:-$(command -v python3 || command -v python || true)}
if [ -z "$PY" ]; then
  echo "device.sh: no python3 on PATH (set PYTHON)" | tee -a "$OUT/device.log" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WHEELS=${WHEELS:-$PWD/.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE=${TMPDIR:-/tmp}/frugalnas-device-site
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target "$SITE" "$WHEELS"/*.whl; then
    export PYTHONPATH="$PYTHONPATH:$SITE"
  else
    echo "device.sh: installing the wheels of $WHEELS failed; going on without them" >&2
  fi
fi
exec "$PY" benchmarks/device.py --out "$OUT" "$@"
