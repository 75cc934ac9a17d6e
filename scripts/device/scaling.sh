#!/usr/bin/env bash
# The GPU run of issue #7 (data-parallel scaling beyond two GPUs) in one call on `nvidia-h200-x4` or
# `nvidia-h200-x8`: xl, bf16, batch 4 per GPU, context 512, at every world size of 8, 4, 2 that the machine
# has GPUs for (largest first: those are the new numbers), each run beside its single-GPU step and its
# PyTorch peer:
#   ddp-bench   none, bucketed (100 MB buckets), torch-ddp            -> results/ddp_bucketed_benchmarking/
#   shard-bench none, zero1, torch-zero, fsdp, torch-fsdp2             -> results/optimizer_state_sharding_accounting/
# Each step has its own time limit, capped by what is left of a total budget (SCALING_BUDGET_S, default
# 530 s), and may fail without stopping the rest. Expected about 5-6 minutes on 8 GPUs.
#
#   device tool, kind nvidia-h200-x8 (or -x4), timeout 600:
#       CS336_GIT_COMMIT=<commit> bash scripts/device/scaling.sh
#   local CPU dry run (tiny preset, gloo, world sizes 2 and 4, about 1-2 minutes):
#       SCALING_DRY_RUN=1 PY=.venv/bin/python OUT=/tmp/scaling-out bash scripts/device/scaling.sh
#
# Writes under $OUT: results.tgz (records: untar at the repository root, then `cs336-systems report`),
# logs.tgz (one log per step), summary.txt (the tables and each step's exit status). 3 files.
# SKIP="ddp-bench-x8 ..." skips steps; LIMIT_<step>=seconds (dashes as underscores) overrides a limit.
set -u
OUT=${OUT:-/tmp/scaling-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/dist_env.sh"
R="$OUT/results"; mkdir -p "$R"
BUDGET=${SCALING_BUDGET_S:-530}
T_START=$SECONDS

step() {  # step <seconds> <name> <command...>
  local limit=$1 name=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "=== $name skipped (SKIP)" | tee -a "$OUT/summary.txt"; return;; esac
  local var="LIMIT_${name//-/_}"; limit=${!var:-$limit}
  local left=$((BUDGET - (SECONDS - T_START) - 15))  # 15 s kept for packing the results
  if [ "$left" -lt 30 ]; then
    echo "=== $name NOT RUN: ${left}s of the ${BUDGET}s budget left" | tee -a "$OUT/summary.txt"; return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  local t0=$SECONDS
  echo "=== $name $(date +%T) (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" >"$OUT/log-$name.txt" 2>&1; local rc=$?
  grep -v -e '^USDT' -e 'SyncActivityProfiler' -e 'Warning' -e '_warn_once' "$OUT/log-$name.txt" | tail -n 25 \
    | cut -c1-260 | tee -a "$OUT/summary.txt"
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
}

if [ "${SCALING_DRY_RUN:-0}" = 1 ]; then
  PRESET=tiny; CTX=64; DEV="--device cpu"; SIZES="4 2"
  DDP_STEPS="--warmup 1 --steps 2"; SHARD_STEPS="--warmup 1 --steps 2"
  declare -A DDP_LIMIT=([2]=120 [4]=150) SHARD_LIMIT=([2]=120 [4]=150)
else
  PRESET=xl; CTX=512; DEV=""
  DDP_STEPS="--warmup 3 --steps 8"; SHARD_STEPS="--warmup 2 --steps 6"
  declare -A DDP_LIMIT=([2]=100 [4]=120 [8]=160) SHARD_LIMIT=([2]=110 [4]=140 [8]=200)
  $PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
  n_gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  SIZES=""
  for n in 8 4 2; do [ "$n_gpus" -ge "$n" ] && SIZES="$SIZES $n"; done
  nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$OUT/summary.txt"
  nvidia-smi topo -m | tee -a "$OUT/summary.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/summary.txt"
echo "world sizes:${SIZES:- none}; budget ${BUDGET}s" | tee -a "$OUT/summary.txt"

for n in $SIZES; do
  torchrun="$PY -m torch.distributed.run --standalone --nproc-per-node $n"
  step "${DDP_LIMIT[$n]}" "ddp-bench-x$n" $torchrun $CLI ddp-bench --preset $PRESET --context-length $CTX \
    --batch-size 4 --precision bf16 --variants none bucketed torch-ddp --bucket-sizes-mb 100 \
    --timeline-variants $DDP_STEPS --timeout-s "${DDP_LIMIT[$n]}" $DEV --results-dir "$R"
  step "${SHARD_LIMIT[$n]}" "shard-bench-x$n" $torchrun $CLI shard-bench --preset $PRESET --context-length $CTX \
    --batch-size 4 --precision bf16 --variants none zero1 torch-zero fsdp torch-fsdp2 \
    $SHARD_STEPS --timeout-s "${SHARD_LIMIT[$n]}" $DEV --results-dir "$R"
done

echo "total $((SECONDS - T_START))s" | tee -a "$OUT/summary.txt"
cd "$OUT" || exit 1
tar czf results.tgz results && rm -rf results
tar czf logs.tgz log-*.txt && rm -f log-*.txt
ls -la "$OUT"
