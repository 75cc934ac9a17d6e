#!/usr/bin/env bash
# The 2026 leaderboard (issue 20) in one device call on an H200, everything under $OUT:
#   CS336_GIT_COMMIT=<commit> bash scripts/device/leaderboard.sh [tests] [guard] [reduced] [full]
# tests: the GPU tests of what the step uses; guard: the bf16 quality guard (small, 300 steps);
# reduced: 4 layers at the full context with the logits check; full: the handout's naive step (its OOM) and ours.
set -u
OUT=${OUT:-/tmp/leaderboard-out}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
started=$(date +%s)
for s in "$@"; do
  case $s in
    tests) timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_train.py \
             tests/test_checkpoint.py tests/test_leaderboard.py 2>&1 | tee "$OUT/log-tests.txt" | tail -3 ;;
    guard) timeout 240 python3 -m cs336_systems leaderboard --quality-check --layers 1 --context-length 1024 \
             --results-dir "$OUT/results" 2>&1 | tee "$OUT/log-guard.txt" | grep "quality" ;;
    reduced) timeout 240 python3 -m cs336_systems leaderboard --layers 4 --check-logits \
               --results-dir "$OUT/results" 2>&1 | tee "$OUT/log-reduced.txt" | tail -4 ;;
    full) timeout 540 python3 -m cs336_systems leaderboard --impl naive ours --results-dir "$OUT/results" 2>&1 \
            | tee "$OUT/log-full.txt" | tail -30 ;;
  esac
  echo "[$s done at +$(( $(date +%s) - started )) s]" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf results.tgz results && rm -rf results)
