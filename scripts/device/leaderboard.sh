#!/usr/bin/env bash
# The 2026 leaderboard (issue 20) in one device call on an H200, everything under $OUT:
#   CS336_GIT_COMMIT=<commit> bash scripts/device/leaderboard.sh [cold] [reduced] [full] [dp] [guard] [shapes] [tests]
# reduced: 2 layers at context 8192 with the logits check; full: the handout's naive step (its OOM) and ours at
# full size (FULL_IMPLS, FULL_ARGS); dp: ours data parallel under torchrun on DP_NPROC GPUs (default: all there
# are; on one GPU the same code in a group of one, e.g. DP_ARGS="--batch-size 1" for one GPU's share of two);
# guard: the bf16 quality guard (small, 300 steps) for each of GUARD_SEEDS (with GUARD_ARGS, e.g. --rounding nearest); cold: TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR start empty; tests: the
# GPU tests of what the step uses; shapes: issue 18's attention shapes against the SDPA backends (SHAPE_IMPLS).
set -u
OUT=${OUT:-/tmp/leaderboard-out}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
started=$(date +%s)
lb() { python3 -m cs336_systems leaderboard --results-dir "$OUT/results" "$@"; }
for s in "$@"; do
  case $s in
    cold) export TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) ;;
    reduced) timeout "${LIMIT_reduced:-90}" bash -c "$(declare -f lb); OUT=$OUT; lb --layers ${REDUCED_LAYERS:-2} \
               --context-length ${REDUCED_CONTEXT:-8192} --check-logits" \
               2>&1 | tee "$OUT/log-reduced.txt" | grep -E "logits|^\| ours|error" ;;
    full) timeout "${LIMIT_full:-330}" bash -c "$(declare -f lb); OUT=$OUT; lb --impl ${FULL_IMPLS:-naive ours} ${FULL_ARGS:-}" 2>&1 \
            | tee "$OUT/log-full.txt" | grep -vE "^\|:|^  " ;;
    dp) timeout "${LIMIT_dp:-330}" python3 -m torch.distributed.run --standalone \
          --nproc-per-node "${DP_NPROC:-$(nvidia-smi -L | wc -l)}" -m cs336_systems leaderboard \
          --results-dir "$OUT/results" ${DP_ARGS:-} 2>&1 | tee "$OUT/log-dp.txt" | grep -vE "^\|:|^  " ;;
    guard) for seed in ${GUARD_SEEDS:-0}; do
             timeout "${LIMIT_guard:-100}" bash -c "$(declare -f lb); OUT=$OUT; lb --quality-check --seed $seed --layers 1 \
               --context-length 1024 ${GUARD_ARGS:-}" 2>&1 | tee -a "$OUT/log-guard.txt" | grep -E "quality|error"
           done ;;
    shapes) timeout "${LIMIT_shapes:-150}" python3 -m cs336_systems flash-bench --only shapes \
              --impl ${SHAPE_IMPLS:-triton sdpa_cudnn sdpa_flash flex} --shape-rep-ms ${SHAPE_REP_MS:-300} \
              --results-dir "$OUT/results" 2>&1 | tee "$OUT/log-shapes.txt" | tail -12 ;;
    tests) timeout "${LIMIT_tests:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_fused.py \
             tests/test_train.py tests/test_checkpoint.py tests/test_flash_attention.py -k "not kernel_forms" 2>&1 \
             | tee "$OUT/log-tests.txt" | tail -4 ;;
  esac
  echo "[$s done at +$(( $(date +%s) - started )) s]" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf results.tgz results && rm -rf results)
