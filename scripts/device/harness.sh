#!/usr/bin/env bash
# The GPU run of issue #4 (benchmarking / profiling harness): installs the project, runs the GPU tests
# of the harness, then every sweep, writing records under $OUT/results (tarred into $OUT/results.tgz).
# Each step may fail without stopping the rest. Usage (device tool): bash scripts/device/harness.sh [a|b|c|d|e|smoke]
set -u
PLAN=${1:-smoke}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
pip install --no-deps --no-build-isolation -e . -q >/tmp/pip.log 2>&1 || echo "pip install failed (PYTHONPATH used)"
R="$OUT/results"; T="$OUT/traces"; L="$R/logs"; mkdir -p "$R" "$T" "$L"
CLI="python3 -m cs336_systems"
step() {  # step <seconds> <name> <command...>
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  echo "=== $name"
  timeout "$limit" "$@" >"$L/$name.txt" 2>&1; local rc=$?
  tail -n 25 "$L/$name.txt" | grep -v '^USDT' | cut -c1-220
  echo "=== $name rc=$rc $((SECONDS - t0))s"
  tar czf "$OUT/results.tgz" -C "$OUT" results  # refreshed after every step: survives a kill at the time limit
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
python3 -c "import cs336_systems, torch; from cs336_basics.attention import available_attention_backends as a; print(torch.__version__, a())"
case "$PLAN" in
a)  # end-to-end sweeps, warm-up study, checkpointing, memory, profile (about 8 minutes)
  step 60 tests python3 -m pytest -q -m gpu tests/test_bench.py tests/test_profiling.py -p no:cacheprovider
  step 30 precision $CLI precision --results-dir "$R"
  step 130 bench-sweep $CLI bench --preset all --mode forward forward-backward train-step --precision fp32 bf16 \
    --warmup 5 --steps 10 --problem benchmarking_script --results-dir "$R"
  step 60 warmup-study $CLI bench --preset small --mode train-step --warmup-study --steps 10 --results-dir "$R"
  step 100 checkpoint $CLI bench --preset xl --context-length 2048 --precision fp32 --mode train-step \
    --checkpoint none 1 2 3 4 6 8 nested --warmup 1 --steps 2 --problem gradient_checkpointing --results-dir "$R"
  step 80 memory $CLI memory --preset 2.7B --context-length 128 256 512 --results-dir "$R" --snapshot-dir "$T"
  step 50 profile $CLI profile --preset small --context-length 512 --steps 3 --results-dir "$R" --trace-dir "$T"
  ;;
b)  # the remaining sweeps in one call (the device time left allowed one): about 9 minutes
  step 110 bench-sweep $CLI bench --preset all --mode forward train-step --precision fp32 bf16 \
    --warmup 5 --steps 10 --problem benchmarking_script --results-dir "$R"
  step 105 mfu $CLI bench --preset xl --precision bf16 --compile yes --attention sdpa --optimizer ours torch-fused \
    --warmup 5 --steps 10 --problem mfu_target --results-dir "$R"
  step 90 checkpoint $CLI bench --preset xl --context-length 2048 --precision fp32 --mode train-step \
    --checkpoint none 1 2 4 nested --warmup 1 --steps 2 --problem gradient_checkpointing --results-dir "$R"
  step 60 mfu-flash $CLI bench --preset xl --precision bf16 --compile yes --attention flash_triton \
    --optimizer torch-fused --warmup 5 --steps 10 --problem mfu_target --results-dir "$R"
  step 135 attention $CLI attention-bench --results-dir "$R"
  step 40 compile $CLI bench --preset small --mode forward train-step --precision bf16 --compile both \
    --warmup 5 --steps 10 --problem torch_compile --results-dir "$R"
  ;;
c)  # what run b could not finish: the MFU target with regional compilation, compiled attention (about 4 minutes)
  step 110 mfu $CLI bench --preset xl --precision bf16 --compile yes --compile-scope blocks --attention sdpa \
    --optimizer torch-fused ours --warmup 5 --steps 10 --problem mfu_target --results-dir "$R"
  step 40 mfu-eager $CLI bench --preset xl --precision bf16 --attention flash_triton sdpa --optimizer torch-fused \
    --warmup 5 --steps 10 --problem mfu_target --results-dir "$R"
  step 80 attention-compiled $CLI attention-bench --compile yes --reps 20 --results-dir "$R"
  ;;
d)  # issue #4 gaps, part 1 (about 8 minutes): profile at two sizes x three contexts, the compiled small
    # train step, eager attention at d=128 x 16,384, memory of 2.7B after the leak fix
  step 170 profile $CLI profile --preset small medium --context-length 256 512 1024 --steps 3 \
    --results-dir "$R" --trace-dir "$T"
  step 150 compile $CLI bench --preset small --mode forward train-step --precision bf16 --compile both \
    --warmup 5 --steps 10 --problem torch_compile --results-dir "$R"
  step 60 attention-d128 $CLI attention-bench --compile no --head-dim 128 --seq-len 16384 --results-dir "$R"
  step 110 memory $CLI memory --preset 2.7B --context-length 128 256 512 --results-dir "$R" --snapshot-dir "$T"
  ;;
e)  # issue #4 gaps, part 2 (about 8 minutes): the compiled attention grid at 100 passes; the FlexAttention
    # sweep of flash_benchmarking re-run after the recompile-limit fix
  step 60 attention-d128 $CLI attention-bench --compile no --head-dim 128 --seq-len 16384 --results-dir "$R"
  step 200 attention-compiled $CLI attention-bench --compile yes --reps 100 --results-dir "$R"
  step 260 flex-sweep $CLI flash-bench --only sweep --impl flex --dtype bf16 --head-dim 64 128 \
    --seq-len 1024 2048 4096 8192 16384 32768 65536 --results-dir "$R"
  ;;
*)  # smoke
  step 120 tests python3 -m pytest -q -m gpu tests/test_bench.py tests/test_profiling.py -x -p no:cacheprovider
  step 120 bench-smoke $CLI bench --preset small --mode forward train-step --precision fp32 bf16 \
    --warmup 2 --steps 3 --results-dir "$R"
  ;;
esac
cd "$OUT" && rm -rf results
# Keep what comes back under the limits (8 files, 16 MiB each): one memory_viz pickle per mode, gzipped.
find traces -name '*.pickle' ! -name '*ctx512-*-fp32.pickle' -delete
find traces -name 'trace-*' ! -name 'trace-small-ctx512-*' -delete  # one size's Chrome traces come back
gzip -f traces/*.pickle 2>/dev/null
tar czf traces.tgz traces && rm -rf traces
ls -la "$OUT"
