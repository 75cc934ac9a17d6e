#!/usr/bin/env bash
# FlashAttention-2 v3 device run (issue #3) on `nvidia-h100-x1`, one call, <= 540 s in all: install, the
# GPU flash tests (incl. the TMA / warp-specialised variants against the default kernels), the tile and
# kernel-form sweep (writes the winners into cs336_systems/attention/flash_tune_h100.json, so the steps
# after it run them), the leaderboard (ours, cuDNN, FlashAttention-2 SDPA, Flex; torch.compile(apply)),
# and the sweep re-run (flex, triton, cudnn; bf16; d 64, 128; 1k..64k). Each step has its own limit
# (LIMIT_<step>=seconds overrides; SKIP="step ..." skips) and may fail without stopping the rest.
#
#   device tool, kind nvidia-h100-x1, timeout 600:   bash scripts/device/flash_v3.sh
#
# Writes under $OUT (5 files): tune.json (all measurements + winners), flash_tune_h100.json (the file to
# commit as cs336_systems/attention/flash_tune_h100.json), results.tgz (records for results/),
# logs.tgz (one log per step), summary.txt (tails of every step).
set -u
OUT=${OUT:-/tmp/flash-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
R="$OUT/results"; mkdir -p "$R"
PIN=cs336_systems/attention/flash_tune_h100.json
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
T0=$SECONDS

$PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee -a "$OUT/summary.txt"

# Fill Triton's kernel cache with every sweep candidate (sm_90a, same keys as the JIT) on 10 CPU processes
# while the tests use the GPU: the sweep then mostly times instead of compiling.
timeout -k 5 120 $PY scripts/device/flash_tune.py --aot --jobs 10 --quiet --shapes leaderboard d128 long >"$OUT/log-aot.txt" 2>&1 &
AOT_PID=$!

step 95 tests $PY -m pytest -m gpu tests/test_flash_attention.py -q -p no:cacheprovider -x \
  -k "variant or compiled or deterministic or fp32 or model" --timeout 80
wait $AOT_PID; echo "=== aot (cache warm) rc=$? $(grep -c ' ok ' "$OUT/log-aot.txt") compiled, $(grep -c FAILED "$OUT/log-aot.txt") failed" | tee -a "$OUT/summary.txt"
step 190 tune $PY scripts/device/flash_tune.py --out "$OUT/tune.json" --pin "$PIN" \
  --shapes leaderboard d128 long --shape-timeout 80
[ -f "$PIN" ] && cp "$PIN" "$OUT/flash_tune_h100.json"
step 110 leaderboard $PY -m cs336_systems flash-bench --only leaderboard --impl triton sdpa_cudnn sdpa_flash flex \
  --lb-rep-ms 1000 --results-dir "$R"
LEFT=$(( 530 - (SECONDS - T0) )); [ $LEFT -lt 20 ] && LEFT=20
step $LEFT sweep $PY -m cs336_systems flash-bench --only sweep --impl flex triton sdpa_cudnn --dtype bf16 \
  --head-dim 64 128 --seq-len 1024 4096 16384 65536 --results-dir "$R"

(cd "$OUT" && tar czf results.tgz results && rm -rf results && tar czf logs.tgz log-*.txt && rm -f log-*.txt)
echo "=== done in $((SECONDS - T0))s" | tee -a "$OUT/summary.txt"
