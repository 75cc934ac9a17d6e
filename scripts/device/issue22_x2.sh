#!/usr/bin/env bash
# Issue 22 on `nvidia-h200-x2`, everything under $OUT (each step fits one 600 s device call; name the ones to run):
#   CS336_GIT_COMMIT=<commit> bash scripts/device/issue22_x2.sh [lb] [peers512] [peers2048] [tests]
# lb: the 8B leaderboard step on both GPUs, `leaderboard --nproc 2` with each layout of LB_PARALLEL (default: zero1
#     bucketed); peers<context>: `shard-bench --compile --optimizer fused` at xl, bf16, batch 4 per GPU, every variant
#     (ours and PyTorch's) paired with a one-GPU compiled step (--pair-with-none); tests: the multigpu tests.
set -u
OUT=${OUT:-/tmp/issue22-out}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
started=$(date +%s)
for s in "$@"; do
  case $s in
    lb) for layout in ${LB_PARALLEL:-zero1 bucketed}; do
          timeout "${LIMIT_lb:-280}" python3 -m cs336_systems leaderboard --nproc 2 --parallel "$layout" \
            --results-dir "$OUT/results" 2>&1 | tee -a "$OUT/log-lb.txt" | grep -vE "^\|:|^  "
        done ;;
    peers*) ctx=${s#peers}
      timeout "${LIMIT_peers:-560}" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m cs336_systems shard-bench --preset xl --context-length "$ctx" --precision bf16 --batch-size 4 --compile \
        --optimizer fused --pair-with-none --steps "${PEER_STEPS:-6}" --profile --results-dir "$OUT/results" 2>&1 \
        | tr '\r' '\n' | grep -v "it/s\]\|run/s\]" | tee "$OUT/log-peers$ctx.txt" | grep -E "^\||error|Error" ;;
    tests) timeout "${LIMIT_tests:-300}" python3 -m pytest -q -m multigpu -p no:cacheprovider tests/test_leaderboard.py \
             tests/test_ddp.py tests/test_fsdp.py 2>&1 | tee "$OUT/log-tests.txt" | tail -4 ;;
  esac
  echo "[$s done at +$(( $(date +%s) - started )) s]" | tee -a "$OUT/summary.txt"
done
(cd "$OUT" && tar czf results.tgz results && rm -rf results)
