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
cd "$FINAL" || exit 1
mv ddp/*.png shard/*.png . 2>/dev/null
cat ddp/summary.txt shard/summary.txt > summary.txt 2>/dev/null
tar czf all.tgz ddp shard && rm -rf ddp shard
ls -la
