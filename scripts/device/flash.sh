#!/usr/bin/env bash
# One device call for FlashAttention-2 (issue 18), results under $OUT:
#   CS336_GIT_COMMIT=<commit> bash scripts/device/flash.sh [tests] [floor] [host] [tune] [shapes] [lb] [sweep] [features]
#     [wsbwd] [wsncu] [wsfwdncu] [lean] [power] [sustained] [packed] [wslazy]
# tests: the GPU tests; floor: tiny-call timing and profile; host: host time per layer and the single-kernel
# backward's length sweep (scripts/device/flash_host.py); tune: tile sweep (pins the winners into
# cs336_systems/attention/flash_tune_h100.json, copied to $OUT); shapes: issue 18's shapes with every peer (this
# GPU model's flash_auto table replaced or added in a copy of the committed auto_choice.json, $OUT/auto_choice.json);
# lb: the 2025 leaderboard harness (compiled apply); sweep: the handout's sweep (bf16, d 64/128);
# features: issue 21's shapes (grouped-query heads, a window, packed documents) against FlexAttention and SDPA
# (FEATURES_ARGS, e.g. "--feature gqa"); wsbwd: the warp-specialised Gluon backward's variants (WSBWD_ONLY names
# them) checked against fp64 and timed in interleaved rounds (WSBWD_ARGS: default lb2025, d128_4k, noncausal_2k and
# gqa, 7 rounds); wsncu: Nsight Compute's per-instruction stall samples of that kernel at noncausal_2k, as CSV;
# wsfwdncu: Nsight Compute's sections of the forward at noncausal_2k (NCU_SHAPE), ours (stall samples as CSV) and
# cuDNN's;
# lean: the kernels with and without the barriers ptx_release removes: their GPU tests, the forwards' A/B
# (fwd_variant_ab.py --variants lean; LEAN_SHAPES) and the warp-specialised backward's (wsbwd's check and timing);
# power: the forward back to back at the power cap, ours at its planned and forced tiles (POWER_TILES) beside cuDNN's
# (attention_power.py: calls a second, watts, energy a call), then the same tiles in bursts with their numerics
# (fwd_variant_ab.py) at POWER_SHAPE (xl_2048); sustained: the shapes run with each implementation also timed back to
# back at the power cap (flash-bench --sustained-seconds; SUSTAINED_SHAPES); packed: the one-warpgroup forward with
# P's packed conversions and l's per-thread parts (PACK_P, LEAN_L): the GPU test, fwd_variant_ab.py --variants packed
# (PACKED_SHAPES) and the power cap; wslazy: the same three for the warp-specialised forward's skipped rescales
# (LAZY_RESCALE; WSLAZY_SHAPES; the one-warpgroup forward's steps, fwd43 and lazyc, are in
# experiments/flash_fwd_lazy_rescale/).
# CS336_GIT_COMMIT: the commit the records name (the tree here is a copy).
# Each step runs under its own limit (step.sh: LIMIT_<step>=seconds, SKIP="step ...").
set -u
OUT=${OUT:-/tmp/flash-out}; mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PIN=cs336_systems/attention/flash_tune_h100.json
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee -a "$OUT/summary.txt"
for s in "$@"; do
  case $s in
    tests) step 420 tests bash scripts/device/flash_tests.sh ;;  # 232 s without the hopper shard (session 44)
    floor) step 60 floor python3 scripts/device/flash_floor.py ${FLOOR_ARGS:-} ;;
    host) step 150 host python3 scripts/device/flash_host.py --single ;;
    tune) step 280 tune python3 scripts/device/flash_tune.py --out "$OUT/tune.json" --pin "$PIN" ${TUNE_ARGS:-}
          cp "$PIN" "$OUT/flash_tune_h100.json" ;;
    shapes) cp cs336_systems/attention/auto_choice.json "$OUT/auto_choice.json"  # this GPU's table joins the others
            step 420 shapes python3 -m cs336_systems flash-bench --only shapes --impl triton sdpa_cudnn sdpa_flash flex \
              ${SHAPES_ARGS:-} --auto-table "$OUT/auto_choice.json" --results-dir "$OUT/results" ;;
    lb) step 120 lb python3 -m cs336_systems flash-bench --only leaderboard --impl ${LB_IMPLS:-triton sdpa_cudnn sdpa_flash flex} \
          --lb-shape leaderboard --lb-rep-ms 1000 --results-dir "$OUT/results" ;;
    sweep) step 200 sweep python3 -m cs336_systems flash-bench --only sweep --impl triton sdpa_cudnn --dtype bf16 \
             --head-dim 64 128 --seq-len 1024 4096 16384 --results-dir "$OUT/results" ;;
    features) step 540 features python3 -m cs336_systems flash-bench --only features ${FEATURES_ARGS:-} \
                --results-dir "$OUT/results" ;;
    wsbwd) step 420 wsbwd python3 scripts/device/gluon_bwd_check.py --only ${WSBWD_ONLY:-$(python3 -c \
             "from cs336_systems.attention import flash_hopper_bwd as h; print(*[v.name() for v in h.VARIANTS if v.warp_specialize])")} \
             ${WSBWD_ARGS:---rounds 7 --time-shapes 1 3 4 5} --no-triton ;;
    sustained) step 480 sustained python3 -m cs336_systems flash-bench --only shapes --impl triton sdpa_cudnn sdpa_flash \
                 flex --shape ${SUSTAINED_SHAPES:-xl_2048 lb2025 noncausal_2k d128_4k} --sustained-seconds 2 \
                 --results-dir "$OUT/results" ;;
    power) step 300 power python3 scripts/device/attention_power.py --shape ${POWER_SHAPE:-xl_2048} --rounds 3 \
             --tiles ${POWER_TILES:-64,64,4,3,p 128,64,8,2,p 128,128,4,3,ws,p}
           step 240 fwd-tiles python3 scripts/device/fwd_variant_ab.py --shapes ${POWER_SHAPE:-xl_2048} --rounds 5 \
             --out "$OUT" ;;
    packed) mkdir -p "$OUT/packed"  # the one-warpgroup forward's PACK_P and LEAN_L: bits, bursts, power cap
            step 240 packed-tests python3 -m pytest -m gpu tests/test_flash_hopper.py -q -p no:cacheprovider -rf -k leaner
            step 240 packed-fwd python3 scripts/device/fwd_variant_ab.py --variants packed --rounds 5 --out "$OUT/packed" \
              --shapes ${PACKED_SHAPES:-xl_2048 xl_512 small_512 floor}
            step 150 packed-power python3 scripts/device/attention_power.py --shape xl_2048 --rounds 3 \
              --tiles 64,64,4,3,p,pack0,leanl0 64,64,4,3,p,leanl0 64,64,4,3,p ;;
    wslazy) mkdir -p "$OUT/wslazy"  # the warp-specialised forward's LAZY_RESCALE: numerics, bursts, power cap
            step 180 wslazy-tests python3 -m pytest -m gpu tests/test_flash_hopper.py -q -p no:cacheprovider -rf \
              -k ws_lazy_rescale
            step 200 wslazy-fwd python3 scripts/device/fwd_variant_ab.py --variants wslazy --rounds 5 \
              --out "$OUT/wslazy" --shapes ${WSLAZY_SHAPES:-noncausal_2k lb2026 d128_4k lb2025}
            step 120 wslazy-power python3 scripts/device/attention_power.py --shape noncausal_2k --rounds 3 \
              --tiles 128,128,4,2,ws,p 128,128,4,2,ws,p,lazy4
            step 120 wslazy-power-lb python3 scripts/device/attention_power.py --shape lb2025 --rounds 3 \
              --tiles 128,128,4,3,ws,p 128,128,4,3,ws,p,lazy4 ;;
    lean) step 240 lean-tests python3 -m pytest -m gpu tests/test_flash_hopper.py -q -p no:cacheprovider -rf -k lean
          step 300 lean-fwd python3 scripts/device/fwd_variant_ab.py --variants lean --rounds 3 --out "$OUT" \
            --shapes ${LEAN_SHAPES:-noncausal_2k lb2026 d128_4k xl_2048 xl_512 small_512 lb2025}
          step 360 lean-bwd python3 scripts/device/gluon_bwd_check.py --rounds 5 --time-shapes 0 1 3 4 5 --no-triton \
            --only $(python3 -c "from cs336_systems.attention import flash_hopper_bwd as h
print(*[v.name() for v in h.VARIANTS if v.warp_specialize and (v.lean or h.Variant(**{**vars(v), 'lean': True}) in h.VARIANTS)])") ;;
    wsncu) step 200 wsncu ncu --kernel-name regex:hopper_bwd_ws --launch-skip 2 --launch-count 1 --section SourceCounters \
             --section WarpStateStats --section SpeedOfLight --import-source no -f -o "$OUT/ncu-wsbwd" \
             python3 scripts/device/ncu_attention.py --shape noncausal_2k --impl triton --backward --calls 3
           ncu --import "$OUT/ncu-wsbwd.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu-wsbwd-sass.csv.gz"
           ncu --import "$OUT/ncu-wsbwd.ncu-rep" --page details > "$OUT/ncu-wsbwd-details.txt" 2>&1
           rm -f "$OUT/ncu-wsbwd.ncu-rep" ;;
    wsfwdncu) for impl in triton sdpa_cudnn; do  # the forward at NCU_SHAPE, ours (with SASS stall samples) and cuDNN
             step 200 "wsfwdncu-$impl" ncu --kernel-name regex:'hopper_fwd|cudnn|fprop|sdpa' --launch-skip 2 \
               --launch-count 1 --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
               --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy \
               --section MemoryWorkloadAnalysis --section SourceCounters --import-source no -f -o "$OUT/ncu-fwd-$impl" \
               python3 scripts/device/ncu_attention.py --shape ${NCU_SHAPE:-noncausal_2k} --impl $impl --calls 4
             ncu --import "$OUT/ncu-fwd-$impl.ncu-rep" --page details > "$OUT/ncu-fwd-$impl-details.txt" 2>&1
             [ $impl = triton ] && ncu --import "$OUT/ncu-fwd-$impl.ncu-rep" --page source --csv --print-source sass \
               2>&1 | gzip > "$OUT/ncu-fwd-$impl-sass.csv.gz"
             rm -f "$OUT/ncu-fwd-$impl.ncu-rep"
           done ;;
  esac
done
(cd "$OUT" && tar czf results.tgz results && rm -rf results && tar czf logs.tgz log-*.txt && rm -f log-*.txt)
