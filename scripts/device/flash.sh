#!/usr/bin/env bash
# One device call for FlashAttention-2: install, GPU tests, tile sweep, benchmarks; results under $OUT.
# Usage (on the device machine, repo root): bash scripts/device/flash.sh [tests] [tune] [bench-quick|bench] [lb]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
pip install --no-deps --no-build-isolation -e . -q >/dev/null 2>&1; export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    tests) timeout 240 python -m pytest -m gpu tests/test_flash_attention.py -x -q -p no:cacheprovider ${TEST_ARGS:-} 2>&1 | grep -v DEBUG | tail -25 ;;
    tune) timeout ${TUNE_TIMEOUT:-240} python scripts/device/flash_tune.py --out "$OUT/tune.json" --shapes ${TUNE_SHAPES:-leaderboard} 2>&1 | grep -v "^$" | tail -60 ;;
    bench-quick) python -m cs336_systems flash-bench --quick --only sweep --results-dir "$OUT/results" 2>&1 | tail -40 ;;
    bench) timeout ${BENCH_TIMEOUT:-380} python -m cs336_systems flash-bench --only sweep ${BENCH_ARGS:-} --results-dir "$OUT/results" 2>&1 | tail -60 ;;
    lb) python -m cs336_systems flash-bench --only leaderboard ${LB_ARGS:-} --results-dir "$OUT/results" 2>&1 | tail -40 ;;
  esac
done
cd "$OUT" && tar czf results.tgz results && rm -rf results
echo "=== done $(date +%T)"
