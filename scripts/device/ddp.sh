#!/usr/bin/env bash
# The GPU run of issue #5 (data-parallel training) on `nvidia-h200-x2`: installs the project, runs the
# multi-GPU tests, the NCCL all-reduce sweep, ddp-bench on xl in bf16 and fp32 (every wrapper, bucket
# sizes 1/10/100/1000 MB, PyTorch DDP and the single-GPU step in the same run, kernel timelines), and a
# short torchrun training run. Each step has its own time limit and may fail without stopping the rest.
#
#   device tool, kind nvidia-h200-x2, timeout 600:   bash scripts/device/ddp.sh
#   local CPU dry run of the same steps (tiny preset, gloo):   DDP_DRY_RUN=1 OUT=/tmp/ddp-out bash scripts/device/ddp.sh
#
# Writes under $OUT: results.tgz (records for results/), ddp_timeline_*.png (naive vs overlapped kernel
# timelines), logs.tgz (one log per step), summary.txt (the tables). At most 6 files.
set -u
OUT=${OUT:-/tmp/ddp-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/dist_env.sh"
R="$OUT/results"; mkdir -p "$R"
TORCHRUN="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"

if [ "${DDP_DRY_RUN:-0}" = 1 ]; then
  PRESET=tiny; CTX=64; DEV="--device cpu"; BACKEND=gloo; SIZES="1 10"; TRAIN_PRESET=tiny
  BF16_STEPS="--warmup 1 --steps 2"; FP32_STEPS="--warmup 1 --steps 2"; TEST_MARK="multigpu"
else
  PRESET=xl; CTX=512; DEV=""; BACKEND=nccl; SIZES="1 10 100 1000"; TRAIN_PRESET=xl
  BF16_STEPS="--warmup 3 --steps 6"; FP32_STEPS="--warmup 2 --steps 4"; TEST_MARK="gpu or multigpu"
  $PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
  nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee -a "$OUT/summary.txt"
  nvidia-smi topo -m | tee -a "$OUT/summary.txt"
fi
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/summary.txt"

step 150 tests $PY -m pytest -q -m "$TEST_MARK" tests/test_ddp.py tests/test_comm.py tests/test_train.py -p no:cacheprovider
step 90 comm-bench $TORCHRUN $CLI comm-bench --backend $BACKEND --sizes-mb $SIZES --warmup 5 --iters 10 \
  --results-dir "$R"
step 170 ddp-bench-bf16 $TORCHRUN $CLI ddp-bench --preset $PRESET --context-length $CTX --batch-size 4 \
  --precision bf16 $BF16_STEPS --timeline-variants naive overlap bucketed-100MB --trace-dir "$OUT" $DEV --results-dir "$R"
step 200 ddp-bench-fp32 $TORCHRUN $CLI ddp-bench --preset $PRESET --context-length $CTX --batch-size 4 \
  --precision fp32 $FP32_STEPS --timeline-variants naive overlap bucketed-100MB --trace-dir "$OUT" $DEV --results-dir "$R"
step 60 train $TORCHRUN $CLI train --preset $TRAIN_PRESET --context-length $CTX --batch-size 4 --precision bf16 \
  --parallel bucketed --bucket-size-mb 100 --steps 6 --lr 1e-4 $DEV --save --results-dir "$R"

cd "$OUT" || exit 1
tar czf results.tgz results && rm -rf results
tar czf logs.tgz log-*.txt && rm -f log-*.txt
ls -la "$OUT"
