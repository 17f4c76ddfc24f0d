#!/usr/bin/env bash
# The SI-EvoNAS measurements that outgrow a 2-core CPU, as one prepared run for a machine with
# a GPU and many cores (sized for one H200 with 16 cores and a 10-minute command limit):
#
#   1. the mnist5k tau reference: 30 random candidates x 4 seeds x 8 epochs (~10 hours on 2
#      CPU cores), then Kendall tau of inherited accuracy against it, for the search's store
#      with no warm-up, 200 and 1,000 warm-up batches;
#   2. search seeds 0-3 at the benchmark's size (18 candidates) and at a larger one (50
#      candidates), si-evolution against train-each REA, SPOS (supernet trained as long as
#      si-evolution's sampled training, then evolution on inherited scores) and first-order
#      DARTS on the dag relaxation, winners retrained with two seeds.
#
# Every result goes to JSON caches under DIR (default: $OUT/sievo, else ./sievo-device), so a
# run cut short resumes where it stopped: copy DIR back and pass it again.
#
#   bash benchmarks/sievo_device.sh [DIR]
#
# Needs the project's Python dependencies (optuna and mlxtend above all) importable; the
# stand-alone trainings use the GPU through the default 'auto' device.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${OUT:+$OUT/sievo}}
DIR=${DIR:-sievo-device}
JOBS=${JOBS:-$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# SIEVO_EXTRA: options appended to every call (they win over the ones above), for a quick
# rehearsal elsewhere, e.g. SIEVO_EXTRA="--dataset digits --rea-epochs 0.05 ..." (see tests);
# SIEVO_SEARCH_SEEDS: the search seeds of part 2 (default "0 1 2 3"); SIEVO_WARMUPS: the
# warm-ups of part 1's tau runs (default "0 200 1000").
bench() { python benchmarks/sievo.py --dataset mnist5k "$@" ${SIEVO_EXTRA:-}; }

# 1. the reference (all jobs in parallel), then tau for three stores
bench --parts reference --jobs "$JOBS" --tau-cache "$DIR/reference.json" | tee "$DIR/reference.log"
for warmup in ${SIEVO_WARMUPS:-0 200 1000}; do
  bench --parts tau --search-seeds 1 --population 6 --offspring 6 --generations 2 --batches 30 \
        --warmup "$warmup" --jobs "$JOBS" \
        --tau-cache "$DIR/reference.json" | tee "$DIR/tau_warmup$warmup.log"
done

# 2. search seeds, one process each (each has its own cache: no two writers share a file)
pids=()
for seed in ${SIEVO_SEARCH_SEEDS:-0 1 2 3}; do
  bench --parts search --seed "$seed" --search-seeds 1 --retrain-seeds 2 --population 6 \
        --offspring 6 --generations 2 --batches 30 --warmup 200 --jobs 1 \
        --tau-cache "$DIR/search$seed.json" > "$DIR/search$seed.log" 2>&1 &
  pids+=($!)
  bench --parts search --seed "$seed" --search-seeds 1 --retrain-seeds 2 --population 10 \
        --offspring 10 --generations 4 --batches 60 --warmup 400 --jobs 1 \
        --tau-cache "$DIR/search_large$seed.json" > "$DIR/search_large$seed.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done  # a bare wait hides failures
tail -n 4 "$DIR"/search*.log
exit "$failed"
