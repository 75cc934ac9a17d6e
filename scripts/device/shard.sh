#!/usr/bin/env bash
# The GPU run of issue #8 (optimizer-state sharding and FSDP) on `nvidia-h200-x2`: installs the project,
# runs shard-bench on xl (bf16, then fp32): the single-GPU step, unsharded DDP, our sharded optimizer,
# PyTorch's ZeroRedundancyOptimizer, our FSDP and PyTorch's FSDP2 in the same run, with one profiled
# step of each FSDP (kernel timeline PNG and Chrome traces). Each step has its own time limit and may
# fail without stopping the rest. About 5 minutes.
#
#   device tool, kind nvidia-h200-x2, timeout 600:   bash scripts/device/shard.sh
#   local CPU dry run of the same steps (tiny preset, gloo):   SHARD_DRY_RUN=1 OUT=/tmp/shard-out bash scripts/device/shard.sh
#
# Writes under $OUT: results.tgz (records for results/: untar at the repository root), traces.tgz
# (Chrome traces, open in chrome://tracing or ui.perfetto.dev), shard_timeline_*.png, logs.tgz,
# summary.txt. At most 6 files.
set -u
set -x
OUT=${OUT:-/tmp/shard-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/dist_env.sh"
R="$OUT/results"; T="$OUT/traces"; mkdir -p "$R" "$T"
TORCHRUN="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"

if [ "${SHARD_DRY_RUN:-0}" = 1 ]; then
  PRESET=tiny; CTX=64; DEV="--device cpu"; STEPS="--warmup 1 --steps 2"
else
  PRESET=xl; CTX=512; DEV=""; STEPS="--warmup 2 --steps 5"
  $PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
  nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$OUT/summary.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/summary.txt"

step 200 shard-bench-bf16 $TORCHRUN $CLI shard-bench --preset $PRESET --context-length $CTX --batch-size 4 \
  --precision bf16 $STEPS --profile fsdp torch-fsdp2 --trace-dir "$T" $DEV --results-dir "$R"
step 200 shard-bench-fp32 $TORCHRUN $CLI shard-bench --preset $PRESET --context-length $CTX --batch-size 4 \
  --precision fp32 $STEPS --profile $DEV --results-dir "$R"

cd "$OUT" || exit 1
mv traces/*.png . 2>/dev/null
tar czf results.tgz results && rm -rf results
tar czf traces.tgz traces && rm -rf traces
tar czf logs.tgz log-*.txt && rm -f log-*.txt
ls -la "$OUT"
