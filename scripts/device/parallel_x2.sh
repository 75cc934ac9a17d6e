#!/usr/bin/env bash
# Issues #5 and #8 in one call on `nvidia-h200-x2` (device time is scarce, and a second call would pay
# a second machine start): ddp.sh, then shard.sh, each writing under its own folder, then everything but
# the timeline PNGs packed into one archive (at most 8 files come back from the device).
#
#   device tool, kind nvidia-h200-x2, timeout 600:   bash scripts/device/parallel_x2.sh
#   (SKIP="name ..." and LIMIT_<step>=seconds pass through to both scripts.)
set -u
FINAL=${OUT:-/tmp/x2-out}
mkdir -p "$FINAL"
OUT=$FINAL/ddp bash scripts/device/ddp.sh
OUT=$FINAL/shard bash scripts/device/shard.sh
# On a machine with more GPUs (nvidia-h200-x4 / -x8), also the NCCL all-reduce sweep at 4 and 6 ranks (issue #6).
n_gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
for n in 4 6; do
  [ "$n_gpus" -ge "$n" ] || continue
  mkdir -p "$FINAL/comm$n"
  timeout -k 10 "${LIMIT_comm_n:-60}" python3 -m torch.distributed.run --standalone --nproc-per-node "$n" \
    -m cs336_systems comm-bench --backend nccl --sizes-mb 1 10 100 1000 --warmup 5 --iters 10 \
    --results-dir "$FINAL/comm$n/results" >"$FINAL/comm$n/log.txt" 2>&1
  echo "=== comm-bench nccl x$n rc=$?" | tee -a "$FINAL/comm$n/log.txt"
  tail -n 12 "$FINAL/comm$n/log.txt"
done
cd "$FINAL" || exit 1
mv ddp/*.png shard/*.png . 2>/dev/null
cat ddp/summary.txt shard/summary.txt > summary.txt 2>/dev/null
tar czf all.tgz ddp shard comm* 2>/dev/null; rm -rf ddp shard comm*
ls -la
