#!/usr/bin/env bash
# Two-GPU runs of issues #5 and #8 on `nvidia-h200-x2` after the FSDP host-path change and the
# shard-bench timing change (steps synchronised only at their ends). Each step has its own time limit
# and may fail without stopping the rest (step.sh).
#
#   device tool, kind nvidia-h200-x2:   CS336_GIT_COMMIT=<commit> bash scripts/device/x2.sh a
#
# Kept as the record of how those runs were made (see README.md here): it runs only from a checkout of a
# commit that still had these flags and files (5b0e5a9 or earlier; there it lived at scripts/device/x2.sh).
#
# a: GPU tests of the parallel code; shard-bench bf16 (every variant, 10 timed steps); a diagnostic
#    shard-bench of none + fsdp with CPU activity in the profile on both ranks (not saved as records);
#    ddp-bench bf16 eager (single GPU, bucketed 25/100/1000 MB, torch DDP; 15 timed steps).
# b: bf16 again with the drift-robust methods: ddp-bench with paired steps (eager and compiled blocks),
#    shard-bench with 3 rounds of every variant.
# c: fp32 with the same methods.
# d: bf16 final: DDP with bf16 gradient all-reduce (paired), shard-bench with steps paired with a plain model.
# e: the paired FSDP and DDP measurements with each rank bound to its own physical cores (CS336_BIND_CPUS=1).
# f: plan d's DDP runs after the one-pass bf16 packing change.
# g: the copy-engine transport for BucketedDDP (GPU tests, scripts/device/ce_probe.py, paired ddp-bench bf16).
# h: #5 again with the ranks aligned before every timed step (ddp-bench timing "paired-aligned"), both transports.
# i: #8 again with the ranks aligned before every timed step (shard-bench timing "ends-synced-aligned").
# j: fp32 DDP with the aligned timing, both transports; the GPU tests of tests/test_ddp.py and tests/test_fsdp.py.
# k: #5 after BucketedDDP moved its bucket copies to a side stream: the GPU tests of tests/test_ddp.py, paired
#    ddp-bench bf16 (compiled blocks and eager; fp32 and bf16 gradient all-reduce), with nvidia-smi sampling the
#    SM clock, power and throttle reasons every 200 ms (log-smi.txt).
# l: #8 after FSDP's host-path rework (storage freed and refilled instead of saved-tensor hooks): the GPU tests of
#    tests/test_fsdp.py and tests/test_shard_bench.py, paired shard-bench bf16, and a second sample of plan k's
#    compiled bf16-gradient ddp-bench.
# m: closing check: every GPU test of the parallel code (ddp, fsdp, train, shard-bench, comm) and the paired fp32
#    shard-bench with the reworked FSDP.
# n: #5 with BucketedDDP's compute_dtype (bf16 copies of the Linear weights: gradients enter the buckets in bf16):
#    the GPU tests of tests/test_ddp.py, paired ddp-bench bf16 with bf16 gradient all-reduce, compiled blocks and
#    eager, bucket sizes 100 and 1000 MiB, PyTorch DDP (bf16 compression hook) in the same runs.
# o: a second sample of plan n over bucket sizes 500, 1000 and 2000 MiB (compiled blocks and eager).
# q: plan n's compiled and eager bf16-gradient runs with and without the bf16 weight copies, back to back on one
#    host, with the overhead also taken against the slower rank's no_sync() step (overhead_vs_slowest).
# r: plan q's compiled bf16-gradient run with NCCL capped at 4 and at 8 thread blocks per collective (fewer SMs
#    taken from backward; NCCL_MAX_CTAS), paired, overhead also against the slower rank.
# s: plan q's runs without copies again, with the no_sync() halves split into phases too (nocomm_fwd_bwd_ms).
# t: BucketedDDP's sm_carveout (matmuls leave N SMs free while buckets are in flight) with NCCL capped to the
#    same N thread blocks: its GPU test, paired compiled (N = 8, 16) and eager (N = 16) bf16-gradient runs.
# p: diagnostic (scripts/device/host_probe.py): the eager step before and after NCCL is initialised.
#
# Writes under $OUT: results.tgz (records and traces: untar at the repository root), logs.tgz,
# summary.txt, timeline PNGs.
set -u
PLAN=${1:?usage: x2.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t}
OUT=${OUT:-/tmp/x2-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/dist_env.sh"
R="$OUT/results"; T="$OUT/traces"; D="$OUT/diag"; mkdir -p "$R" "$T" "$D"
TR2="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
XL="--preset xl --context-length 512 --batch-size 4"
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
$PY -m pip install --no-deps --no-build-isolation -e . -q >"$OUT/log-pip.txt" 2>&1 || echo "pip install failed (PYTHONPATH used)"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee -a "$OUT/summary.txt"
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/summary.txt"

[ "$PLAN" = f ] && SKIP="shard-bench-bf16-paired ${SKIP:-}"
case "$PLAN" in
a)
  step 120 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py tests/test_fsdp.py tests/test_shard_bench.py \
    -p no:cacheprovider
  step 150 shard-bench-bf16 $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 10 --memory-steps 2 \
    --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  step 90 shard-diag-bf16 $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 3 --memory-steps 1 \
    --variants none fsdp --profile none fsdp --profile-cpu --trace-dir "$D" --no-save
  step 150 ddp-bench-bf16 $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 15 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 25 100 1000 --timeline-variants bucketed-25MB \
    --trace-dir "$T" --results-dir "$R"
  ;;
b)  # bf16 with the drift-robust methods: paired DDP steps, shard-bench rounds
  step 130 ddp-bench-bf16 $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 25 100 1000 --timeline-variants bucketed-100MB \
    --trace-dir "$T" --results-dir "$R"
  step 150 ddp-bench-bf16-compile $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 15 --compile \
    --variants none bucketed torch-ddp --bucket-sizes-mb 100 1000 --timeline-variants --results-dir "$R"
  step 280 shard-bench-bf16 $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 8 --memory-steps 2 \
    --rounds 3 --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  ;;
d|f)  # bf16 final: shard-bench with every variant's steps paired with a plain single-GPU model's in the same
    # process; DDP with bf16 gradient all-reduce (paired; eager and compiled blocks)
  step 45 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py -p no:cacheprovider
  step 270 shard-bench-bf16-paired $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 12 \
    --memory-steps 1 --pair-with-none --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  step 110 ddp-bench-bf16-bf16grads $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 100 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  step 120 ddp-bench-bf16-compile-bf16grads $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 15 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
e)  # each rank bound to its own physical cores (CS336_BIND_CPUS=1): the paired FSDP and DDP measurements again
  lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA)" | tee -a "$OUT/summary.txt"
  export CS336_BIND_CPUS=1
  step 230 shard-bench-bf16-paired-bound $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 10 \
    --memory-steps 1 --pair-with-none --profile --results-dir "$R"
  step 110 ddp-bench-bf16-bound $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --timeline-variants --no-profile --results-dir "$R"
  ;;
g)  # the copy-engine transport (symmetric memory): GPU tests, the GEMM-contention probe, paired ddp-bench bf16
    # (compiled blocks, then eager) with both transports side by side
  step 110 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py -k copy_engine -p no:cacheprovider
  step 60 ce-probe $TR2 scripts/device/ce_probe.py
  step 220 ddp-bench-bf16-compile-ce $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 15 --compile \
    --variants none bucketed torch-ddp --bucket-sizes-mb 100 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  step 160 ddp-bench-bf16-ce $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 15 \
    --variants none bucketed --bucket-sizes-mb 100 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
h)  # #5 with ranks aligned before every timed step (timing "paired-aligned"), both transports, bf16
  step 60 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py -k copy_engine -p no:cacheprovider
  step 200 ddp-bench-bf16-aligned $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  step 200 ddp-bench-bf16-compile-aligned $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 --compile \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
i)  # #8 with ranks aligned before every timed step (timing "ends-synced-aligned"): paired shard-bench bf16;
    # then a diagnostic: one profiled compiled DDP step (kernel time with and without communication; not saved)
  step 380 shard-bench-bf16-paired-aligned $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 10 \
    --memory-steps 1 --pair-with-none --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  step 100 ddp-diag-compile $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 4 --compile \
    --variants none bucketed --bucket-sizes-mb 1000 --timeline-variants bucketed-1000MB+compile --trace-dir "$D" \
    --no-save
  ;;
j)  # fp32 with the aligned timing (both transports); every GPU test of the parallel code
  step 150 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py tests/test_fsdp.py -p no:cacheprovider
  step 240 ddp-bench-fp32-aligned $TR2 $CLI ddp-bench $XL --precision fp32 --warmup 2 --steps 10 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
k)  # #5 after the side-stream change: GPU tests; paired bf16 ddp-bench, fp32 and bf16 gradient all-reduce
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 200 >"$OUT/log-smi.txt" 2>&1 & SMI=$!
  step 120 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py -p no:cacheprovider
  step 150 ddp-bench-bf16-compile-side $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 --compile \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --transports collective copy-engine \
    --timeline-variants --no-profile --results-dir "$R"
  step 110 ddp-bench-bf16-compile-bf16grads-side $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  step 110 ddp-bench-bf16-side $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --timeline-variants --no-profile --results-dir "$R"
  step 100 ddp-bench-bf16-bf16grads-side $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  kill "$SMI" 2>/dev/null
  ;;
l)  # #8 after the FSDP host-path rework: GPU tests, paired shard-bench bf16 (10 pairs), DDP second sample
  step 150 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_fsdp.py tests/test_shard_bench.py -p no:cacheprovider
  step 200 shard-bench-bf16-paired-aligned $TR2 $CLI shard-bench $XL --precision bf16 --warmup 2 --steps 10 \
    --memory-steps 1 --pair-with-none --profile fsdp torch-fsdp2 --trace-dir "$T" --results-dir "$R"
  step 110 ddp-bench-bf16-compile-bf16grads-side $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
m)  # closing check: the parallel code's GPU tests; paired fp32 shard-bench with the reworked FSDP
  step 220 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py tests/test_fsdp.py tests/test_train.py \
    tests/test_shard_bench.py tests/test_comm.py -p no:cacheprovider
  step 300 shard-bench-fp32-paired-aligned $TR2 $CLI shard-bench $XL --precision fp32 --warmup 2 --steps 6 \
    --memory-steps 1 --pair-with-none --results-dir "$R"
  ;;
n)  # #5 with bf16 Linear-weight copies (BucketedDDP compute_dtype): GPU tests, paired bf16 ddp-bench
  step 150 tests $PY -m pytest -q -m "gpu or multigpu" tests/test_ddp.py -p no:cacheprovider
  step 170 ddp-bench-bf16-compile-bf16weights $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 100 1000 --grad-comm-dtype bf16 \
    --compute-dtype bf16 --timeline-variants --no-profile --results-dir "$R"
  step 140 ddp-bench-bf16-bf16weights $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 100 1000 --grad-comm-dtype bf16 --compute-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
o)  # plan n again, bucket sizes 500 / 1000 / 2000 MiB
  step 200 ddp-bench-bf16-compile-bf16weights-sizes $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 500 1000 2000 --grad-comm-dtype bf16 \
    --compute-dtype bf16 --timeline-variants --no-profile --results-dir "$R"
  step 200 ddp-bench-bf16-bf16weights-sizes $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 500 1000 2000 --grad-comm-dtype bf16 --compute-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
q)  # with and without the bf16 weight copies on one host; overhead against the slower rank too
  for W in "" "--compute-dtype bf16"; do
    N=${W:+-bf16weights}
    step 130 ddp-bench-bf16-compile-bf16grads$N $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
      --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 $W \
      --timeline-variants --no-profile --results-dir "$R"
    step 120 ddp-bench-bf16-bf16grads$N $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
      --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 $W \
      --timeline-variants --no-profile --results-dir "$R"
  done
  ;;
r)  # NCCL CTA caps, compiled blocks, bf16 gradients, paired
  for ctas in 4 8; do
    step 130 ddp-bench-bf16-compile-bf16grads-ctas$ctas $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 \
      --steps 30 --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
      --nccl-max-ctas $ctas --timeline-variants --no-profile --results-dir "$R"
  done
  ;;
s)  # where the pairs differ: both halves split into phases
  step 130 ddp-bench-bf16-compile-bf16grads $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
    --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  step 120 ddp-bench-bf16-bf16grads $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --timeline-variants --no-profile --results-dir "$R"
  ;;
t)  # SM carveout for matmuls while buckets are in flight, NCCL capped to the same number of CTAs
  step 120 tests $PY -m pytest -q -m multigpu tests/test_ddp.py -k "carveout" -p no:cacheprovider
  for n in 8 16; do
    step 120 ddp-bench-bf16-compile-bf16grads-sm$n $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 30 \
      --compile --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
      --nccl-max-ctas $n --sm-carveout $n --timeline-variants --no-profile --results-dir "$R"
  done
  step 120 ddp-bench-bf16-bf16grads-sm16 $TR2 $CLI ddp-bench $XL --precision bf16 --warmup 3 --steps 20 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 1000 --grad-comm-dtype bf16 \
    --nccl-max-ctas 16 --sm-carveout 16 --timeline-variants --no-profile --results-dir "$R"
  ;;
p)  # diagnostic: the eager single-GPU step before / after NCCL is initialised (printed, not recorded)
  step 120 host-probe $TR2 scripts/device/host_probe.py
  ;;
c)  # fp32 with the same methods
  step 230 ddp-bench-fp32 $TR2 $CLI ddp-bench $XL --precision fp32 --warmup 2 --steps 8 \
    --variants none bucketed torch-ddp --bucket-sizes-mb 25 1000 --timeline-variants --results-dir "$R"
  step 300 shard-bench-fp32 $TR2 $CLI shard-bench $XL --precision fp32 --warmup 2 --steps 4 --memory-steps 1 \
    --rounds 2 --profile --results-dir "$R"
  ;;
esac

cd "$OUT" || exit 1
mv traces/*.png . 2>/dev/null
tar czf results.tgz results traces && rm -rf results traces
[ -d diag ] && tar czf diag.tgz diag && rm -rf diag
tar czf logs.tgz log-*.txt && rm -f log-*.txt
ls -la "$OUT"
