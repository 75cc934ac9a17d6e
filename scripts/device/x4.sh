#!/usr/bin/env bash
# Issues #5, #7 and #8 on one `nvidia-h200-x4` lease, in two calls of under 10 minutes each (a second call
# made while the machine is warm pays no new start):
#   plan a: the multi-GPU tests, then on 2 of the GPUs: ddp-bench bf16 (every wrapper and bucket size, PyTorch
#           DDP, timelines), shard-bench bf16 with FSDP profiles, ddp-bench fp32, a short `train` run of every
#           sharding strategy, shard-bench fp32. (Its NCCL CTA-cap runs left with the experiment:
#           experiments/nccl_sm_sharing/.)
#   plan b: scaling to 4 GPUs (scripts/device/scaling.sh at world size 4 only: the 2-GPU rows come from plan a).
#
#   device tool, kind nvidia-h200-x4, timeout 600:
#       CS336_GIT_COMMIT=<commit> bash scripts/device/x4.sh a     (then the same with b)
#
# Writes under $OUT: results.tgz (untar at the repository root), logs.tgz, summary.txt, timeline / trace PNGs.
set -u
PLAN=${1:?usage: x4.sh a|b}
OUT=${OUT:-/tmp/x4-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/dist_env.sh"
R="$OUT/results"; T="$OUT/traces"; mkdir -p "$R" "$T"
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
$PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$OUT/summary.txt"
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/summary.txt"

case "$PLAN" in
a)
  nvidia-smi topo -m | tee -a "$OUT/summary.txt"
  export CUDA_VISIBLE_DEVICES=0,1
  TR2="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
  XL="--preset xl --context-length 512 --batch-size 4"
  step 150 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py tests/test_fsdp.py \
    tests/test_sharded_optimizer.py tests/test_shard_bench.py tests/test_train.py tests/test_comm.py -p no:cacheprovider
  step 120 ddp-bench-bf16 $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 6 \
    --timeline-variants naive overlap bucketed-100MB --trace-dir "$T" --results-dir "$R"
  step 100 shard-bench-bf16 $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 5 \
    --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  step 170 ddp-bench-fp32 $TR2 $CLI ddp-bench $XL --precision fp32 --warmup 2 --steps 4 \
    --timeline-variants --results-dir "$R"
  for s in zero1 fsdp torch-zero torch-fsdp2; do
    step 40 "train-$s" $TR2 $CLI train --preset small --context-length 512 --batch-size 4 --precision bf16 \
      --parallel "$s" --steps 15 --lr 1e-4 --save --results-dir "$R"
  done
  step 100 shard-bench-fp32 $TR2 $CLI shard-bench $XL --precision fp32 --warmup 2 --steps 4 --results-dir "$R"
  ;;
b)
  OUT="$OUT/scaling" SKIP="ddp-bench-x2 shard-bench-x2 ${SKIP:-}" SCALING_BUDGET_S=${SCALING_BUDGET_S:-480} \
    bash scripts/device/scaling.sh
  mv "$OUT"/scaling/* "$OUT"/ && rmdir "$OUT/scaling"
  ;;
esac

cd "$OUT" || exit 1
if [ "$PLAN" = a ]; then
  mv traces/*.png . 2>/dev/null
  tar czf results.tgz results traces && rm -rf results traces
  tar czf logs.tgz log-*.txt && rm -f log-*.txt
fi
ls -la "$OUT"
