#!/bin/bash
# Issue 19 device runs (one H100): `bash scripts/device/training_step.sh <plan>` from the repository root with
# $OUT set; records land in $OUT/results (tar: $OUT/results.tgz), logs in $OUT/log-*.txt, $OUT/summary.txt.
#   a: GPU tests of the fused pieces, fused-CE memory at the 8b vocabulary, small/512 settings vs the peer,
#      the small bf16 300-step loss check
#   b: GPU tests, small/512 with the fast settings (and torch's fused AdamW) vs the peer (bf16, batch 4, sdpa)
#   c: xl/512 vs the peer
#   d: xl/2048 vs the peer; selective activation checkpointing at xl/2048 (regional compilation)
#   e: `bench` with no settings flags (small/512, fast settings) vs the peer, 50 steps
#   f: GPU tests of the final code; xl/512 vs the peer again, 20 steps
#   g, h, i, j (session 12: both sides run the SDPA backend measured fastest, ours through flash_auto, the peer
#      pinned from the same table): g GPU tests and small/512; h xl/512; i xl/2048 (peers and ours, CUDA graph);
#      j xl/2048 ours with PyTorch's default SDPA dispatch, and train's defaults at xl/512
#   k, l, m (session 14: bf16 residual stream, RoPE in the projections' layout; bench's defaults): k GPU tests,
#      small/512 vs peer-graphs and the loss check; l xl/512 vs peer-graphs; m xl/2048 vs the peer, ours with
#      the fp32 and the bf16 residual stream; n the GPU train test and train's defaults at xl/512 (records)
#   o (session 15): Inductor options on our xl/2048 step (step_variants.py; VARIANTS="a b+c" picks them);
#   p GPU tests and xl/2048 with both RoPE kernels vs the peer; q small/512 and xl/512 with bench's defaults,
#      and small/512 without the CUDA graph with both RoPE kernels (host cost per call)
#   r (session 24): GPU tests, the optimizer step with split and whole fp32 masters, captured xl/2048 probes of
#      each; s xl/2048 against the peer with bench's defaults
#   t (session 25: ours without cuBLAS's workspace, the peer with PyTorch's default unless --cublas-workspace is
#      given): xl/2048 against the peer; GPU tests of bench and train
#   u (session 26): attention's kernel time by q/k/v/dO layout; the matmul peak cold, sustained and hot; small/512
#      and xl/512 (ours, bench's defaults) with and without cuBLAS's workspace, one process each
#   w (session 26): ours with flash_triton against sdpa at xl/512 and xl/2048 (bench's defaults otherwise)
#   x (session 28): xl/2048 against the peer in the GPU's steady state: 12 warm-up steps (ours: two eager, the
#      capture, then replays), 20 timed; nvidia-smi samples SM clock and power every 100 ms ($OUT/power.csv);
#   y (session 28): w's comparison at xl/2048 in the steady state (12 warm-up steps, 20 timed, sdpa first)
#   z (session 29): GPU tests of the fused SwiGLU feed-forward (cs336_systems.fused.swiglu);
#   f2 (session 29): ours with --ffn torch and fused at xl/2048 in the steady state (bench's defaults otherwise);
#   f3: xl/2048 against the peer with bench's defaults (the fused feed-forward there); f4: f2 at xl/512 and small/512
#   f5: f3, then f2 at xl/512 (one call)
#   (session 30, qk1 at ca239d7: GPU tests and --rope triton against fused at xl/2048; --rope fused is now
#      experiments/qk_rope_epilogue/)
#   pp (session 30): the SwiGLU backward's cooperative and ping-pong schedules timed alternately, the GPU tests of
#      the fused feed-forward, xl/2048 against the peer with bench's defaults (the ping-pong backward there)
#   pp2 (session 30): the GPU tests of the fused feed-forward, the captured step's kernels (graph_step_profile.py),
#      xl/2048 against the peer with bench's defaults
#   (session 31, qkv at 1f9c62b: the GPU tests of the packed projections and the fused feed-forward, then --qkv
#      separate against packed at xl/2048 in the steady state; --qkv packed is now experiments/packed_qkv_rope/)
#   gemm2 (session 31): the 1,600-column products in other forms (transposed, batched, packed) with and without
#      cuBLAS's workspace (at 3cd4fc5 also the captured step's kernels with --qkv packed)
#   host (session 31): the fused optimizer's GPU tests (the captured step among them), the captured step's
#      kernels and host share (graph_step_profile.py)
#   launch (session 31): a graph's time to its first node by node count; the captured step's kernels, host share
#      and time to its first node
#   frope (session 31): the GPU tests of RoPE with our attention as one op, then xl/2048 against the peer with
#      --rope triton and flash (dQ's inverse rotation in our attention's dQ postprocess)
#   peer: xl/2048 against the peer with bench's defaults (steady state)
#   ncu (session 32): the fused feed-forward's Gluon GEMMs and cuBLAS's of the same sizes under Nsight Compute
#      (SourceCounters: the top stall locations)
#   timing (session 33): xl/2048, the peer timed phase by phase (a synchronize between forward, backward and
#      optimizer) and by whole steps, ours by whole steps (one process each, bench's defaults otherwise)
#   timing512 (session 33): small/512 and xl/512 against both peers, whole steps (bench's defaults, steady state)
#   timing-graphs (session 33): xl/512 against the reduce-overhead peer (the faster there), whole steps
#   timing2048 (session 33): xl/2048 against both peers, whole steps (IMPLS="peer-graphs ours" the faster only)
#   swab (session 34): the fused feed-forward's kernel variants (s34_variants.patch, applied first) timed
#      alternately (experiments/swiglu_gemm_epilogues/variant_ab_s34.py), then two of them under Nsight Compute
#   s34 (session 34): the fused feed-forward's GPU tests, then xl/2048 against both peers (whole steps)
#   s35ab (session 35): the fused feed-forward's kernels with their epilogues cut down or in other forms
#      (s35_variants.patch, applied first), beside cuBLAS's products, timed alternately; VARIANTS=... picks them
#   (session 41, lean at a1f7752: the fused feed-forward's kernels with and without the barriers ptx_release drops;
#      no gain, now experiments/swiglu_gemm_epilogues/lean_s40.patch)
#   s36ncu (session 36): Nsight Compute's per-instruction (SASS) stall samples of the fused feed-forward's backward as
#      shipped, with a copy-only epilogue and with none (s35_variants.patch; NCU_VARIANTS=... picks them), as CSV
#   lt (session 33): cuBLASLt (TORCH_BLAS_PREFER_CUBLASLT=1, which honours PyTorch's SM carve-out) against cuBLAS:
#      the step's GEMM shapes and our xl/2048 step (Lt with its default workspace)
#   (session 51, gemm at 32f4af1: the tuned GEMMs' GPU tests, then xl/2048 with --gemm torch and tuned; no faster,
#      now experiments/tuned_gemm/, whose package.patch brings the plan back)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # scripts/device/*.py import the package from the tree
source scripts/device/step.sh
R=$OUT/results
mkdir -p "$R"
CLI="python3 -m cs336_systems"
B="bench --problem training_step --results-dir $R --precision bf16 --attention sdpa --compile yes --warmup 3"
G="bench --problem training_step --results-dir $R --precision bf16 --compile yes --compile-scope blocks \
--optimizer fused --loss fused --cuda-graph yes --warmup 3"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee -a "$OUT/summary.txt"
case "${1:-}" in
a)
  step 150 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_bench.py
  step 60 ce-memory python3 scripts/device/ce_memory.py "$R"
  step 150 small-blocks $CLI $B --impl peer ours --preset small --context-length 512 --compile-scope blocks \
    --optimizer torch-fused fused --loss unfused fused --steps 20
  step 90 small-model $CLI $B --preset small --context-length 512 --compile-scope model --optimizer fused \
    --loss unfused fused --steps 20
  step 120 loss-check python3 scripts/device/step_loss_check.py --preset small --precision bf16 --steps 300 \
    --results-dir "$R"
  ;;
b)
  step 120 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_bench.py
  step 150 small-512 $CLI $B --impl peer ours --preset small --context-length 512 --compile-scope model \
    --optimizer fused torch-fused --loss unfused --steps 20
  ;;
c)  # the peer's whole-model compile of xl takes about 200 s
  step 560 xl-512 $CLI $B --impl peer ours --preset xl --context-length 512 --compile-scope model \
    --optimizer fused --loss unfused --steps 10
  ;;
d)
  step 400 xl-2048 $CLI $B --impl peer ours --preset xl --context-length 2048 --compile-scope model \
    --optimizer fused --loss unfused --steps 10
  step 150 xl-2048-sac $CLI $B --preset xl --context-length 2048 --compile-scope blocks --optimizer fused \
    --loss unfused --activation-checkpointing selective --steps 6
  ;;
e)  # bench's defaults on CUDA (the fast settings, printed) against the peer, 50 measured steps
  step 300 small-default $CLI bench --problem training_step --results-dir $R --impl peer ours --precision bf16 \
    --warmup 5 --steps 50
  ;;
f)  # the final code: GPU tests, and xl/512 with the fast settings vs the peer again (20 measured steps)
  step 100 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_bench.py
  step 450 xl-512 $CLI $B --impl peer ours --preset xl --context-length 512 --compile-scope model \
    --optimizer fused --loss unfused --steps 20
  ;;
g)
  step 240 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench.py tests/test_flash_attention.py \
    -k "auto or cuda_graph or peer"
  step 330 small-512 $CLI $G --preset small --context-length 512 --impl peer peer-graphs ours \
    --attention flash_auto sdpa --steps 20
  ;;
h)  # the peers' whole-model compiles of xl take about 200 s each
  step 580 xl-512 $CLI $G --preset xl --context-length 512 --impl peer peer-graphs ours --attention flash_auto \
    --steps 10
  ;;
i)
  step 580 xl-2048 $CLI $G --preset xl --context-length 2048 --impl peer peer-graphs ours --attention flash_auto \
    --steps 10
  ;;
j)
  step 200 xl-2048-sdpa $CLI $G --preset xl --context-length 2048 --impl ours --attention sdpa --steps 10
  step 330 train-xl-512 $CLI train --preset xl --context-length 512 --steps 30 --precision bf16 \
    --checkpoint-dir /tmp/ck-s12 --log-every 5
  ;;
k)  # session 14 (bf16 residual stream, RoPE in the projections' layout): GPU tests, small/512, the loss check
  step 400 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_bench.py \
    tests/test_train.py tests/test_model_flash_features.py tests/test_flash_attention.py
  step 150 small-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer-graphs ours --steps 30
  step 150 loss-check python3 scripts/device/step_loss_check.py --preset small --precision bf16 --steps 300 \
    --results-dir "$R"
  ;;
l)
  step 580 xl-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer-graphs ours --preset xl --context-length 512 --steps 15
  ;;
m)  # ours with both residual dtypes, each in its own process beside the peer
  step 580 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer ours --preset xl --context-length 2048 --residual-dtype fp32 bf16 --steps 10
  ;;
n)  # train's defaults on CUDA (bf16 residual stream among them): the GPU train test, then xl/512 for 30 steps
  step 200 gpu-train python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_train.py -k fast_settings
  step 400 train-xl-512 $CLI train --preset xl --context-length 512 --steps 30 --precision bf16 \
    --checkpoint-dir /tmp/ck-s14 --log-every 5 --save --results-dir $R
  ;;
o)  # session 15: Inductor options probed on our captured xl/2048 step, one process each (step_variants.py);
    # the base variant also prints Inductor's generated code for the block (log-code.txt)
  P="python3 scripts/device/step_variants.py"
  TORCH_LOGS=output_code step 200 probe-base $P base
  grep -a "output_code\]" "$OUT/log-probe-base.txt" > "$OUT/log-code.txt"; sed -i '/output_code\]/d' "$OUT/log-probe-base.txt"
  for v in ${VARIANTS:-pdl coord split64 nomix}; do step 240 "probe-$v" $P "$v"; done
  grep -h '^{' "$OUT"/log-probe-*.txt | tee -a "$OUT/summary.txt"
  ;;
p)  # session 15 (RoPE's Triton kernel the CUDA default): GPU tests of the touched pieces, xl/2048 against the peer
    # with both RoPE kernels, each in its own process
  step 240 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_rope.py tests/test_bench.py \
    tests/test_train.py
  step 540 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer ours --preset xl --context-length 2048 --rope torch triton --steps 10
  ;;
q)  # session 15: small/512 and xl/512 with bench's defaults against the reduce-overhead peer
  step 150 small-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer-graphs ours --steps 30
  step 420 xl-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer-graphs ours --preset xl --context-length 512 --steps 15
  step 200 small-512-nograph $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl ours --cuda-graph no --rope torch triton --steps 30
  ;;
r)  # session 24 (FusedAdamW's split masters): GPU tests of the optimizer and train; the optimizer
    # step alone at xl with split and whole masters; the captured xl/2048 step with each, alternating, one process
    # per probe (step_variants.py)
  step 240 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_train.py
  step 120 adamw python3 scripts/device/adamw_bandwidth.py --preset xl --blocks 1024 --warps 4 8 --split yes no
  P="python3 scripts/device/step_variants.py"
  for i in 1 2; do for v in base whole-masters; do step 150 "probe-$v-$i" $P "$v"; done; done
  grep -h '^{' "$OUT"/log-probe-*.txt | tee -a "$OUT/summary.txt"
  ;;
s)  # session 24: xl/2048 against the peer with bench's defaults (split masters), the issue's record
  step 540 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer ours --preset xl --context-length 2048 --steps 10
  ;;
t)  # session 25: xl/2048 against the peer with bench's defaults (ours without cuBLAS's workspace, the peer with
    # PyTorch's default), then the GPU tests of bench and train
  step 420 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl peer ours --preset xl --context-length 2048 --steps 10
  step 150 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench.py tests/test_train.py
  ;;
u)
  step 150 layout python3 scripts/device/attention_layout_probe.py
  step 90 peak-states python3 scripts/device/matmul_peak_states.py
  for ws in default none; do for size in "small 512" "xl 512"; do set -- $size
    step 200 "$1-$2-ws-$ws" $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
      --impl ours --preset "$1" --context-length "$2" --cublas-workspace "$ws" --steps 15
  done; done
  ;;
w)
  step 560 attention $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 3 \
    --impl ours --preset xl --context-length 512 2048 --attention flash_triton sdpa --steps 10
  ;;
x)
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 \
    > "$OUT/power.csv" &
  smi=$!
  step 560 xl-2048-steady $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  kill $smi
  ;;
y)
  step 560 attention-steady $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ours --preset xl --context-length 2048 --attention sdpa flash_triton --steps 20
  ;;
z)
  step 300 tests-swiglu python3 -m pytest -q -m gpu tests/test_fused_swiglu.py -p no:cacheprovider
  ;;
f2)
  step 560 ffn-steady $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ours --preset xl --context-length 2048 --ffn torch fused --steps 20 --isolate
  ;;
f3)
  step 560 ffn-peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  ;;
f4)
  step 560 ffn-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ours --preset xl small --context-length 512 --ffn torch fused --steps 20 --isolate
  ;;
f5)
  step 330 ffn-peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  step 250 ffn-xl512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ours --preset xl --context-length 512 --ffn torch fused --steps 20 --isolate
  ;;
pp)
  step 120 bwd-ab python3 experiments/swiglu_gemm_epilogues/bwd_schedule_ab.py --out "$OUT"
  step 200 tests-swiglu python3 -m pytest -q -m gpu tests/test_fused_swiglu.py -p no:cacheprovider
  step 330 pp-peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  ;;
pp2)
  step 200 tests-swiglu python3 -m pytest -q -m gpu tests/test_fused_swiglu.py -p no:cacheprovider
  step 240 profile bash -c "cd scripts/device && python3 graph_step_profile.py --around memcpy --steps 1"
  step 330 pp2-peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  ;;
gemm2)
  step 90 gemm-none bash -c "cd scripts/device && CUBLAS_WORKSPACE_CONFIG=:0:0 python3 step_gemm_shapes.py --variants"
  step 90 gemm-default bash -c "cd scripts/device && python3 step_gemm_shapes.py --variants --out /tmp"
  ;;
host)
  step 120 tests-graph python3 -m pytest -q -m gpu tests/test_fused.py -p no:cacheprovider
  step 240 profile bash -c "cd scripts/device && python3 graph_step_profile.py --steps 1"
  ;;
launch)
  step 120 launch bash -c "cd scripts/device && python3 graph_launch_cost.py"
  step 240 profile bash -c "cd scripts/device && python3 graph_step_profile.py --steps 1"
  ;;
frope)
  step 150 tests-frope python3 -m pytest -q -m gpu tests/test_flash_rope.py -p no:cacheprovider
  step 450 frope-peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --rope triton flash --steps 20
  ;;
ncu)
  step 300 ncu-swiglu ncu --kernel-name regex:'swiglu|nvjet' --launch-skip 2 --launch-count 16 \
    --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SourceCounters \
    python3 scripts/device/ncu_swiglu.py
  ;;
peer)
  step 560 peer $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps 20
  ;;
timing)
  step 300 peer-phases $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer --preset xl --context-length 2048 --steps ${STEPS:-20} --timing phases
  step 560 peer-step $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer ours --preset xl --context-length 2048 --steps ${STEPS:-20} --timing step
  ;;
timing512)
  step 220 small-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer peer-graphs ours --steps ${STEPS:-30}
  step 360 xl-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer peer-graphs ours --preset xl --context-length 512 --steps ${STEPS:-20}
  ;;
timing-graphs)
  step 400 xl-512 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl peer-graphs ours --preset xl --context-length 512 --steps ${STEPS:-20}
  ;;
timing2048)
  step 590 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ${IMPLS:-peer peer-graphs ours} --preset xl --context-length 2048 --steps ${STEPS:-20}
  ;;
lt)
  step 60 lt-noworkspace env CUBLAS_WORKSPACE_CONFIG=:0:0 TORCH_BLAS_PREFER_CUBLASLT=1 python3 -c "import torch
a = torch.randn(8192, 1600, device='cuda', dtype=torch.bfloat16)
print('Lt without a workspace:', (a @ a[:1600].T).float().abs().mean().item())"
  step 90 shapes-cublas env CUBLAS_WORKSPACE_CONFIG=:0:0 python3 scripts/device/step_gemm_shapes.py
  step 90 shapes-lt env TORCH_BLAS_PREFER_CUBLASLT=1 python3 scripts/device/step_gemm_shapes.py
  step 200 step-cublas $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ours --preset xl --context-length 2048 --steps 20 --timing step
  step 200 step-lt env TORCH_BLAS_PREFER_CUBLASLT=1 $CLI bench --problem training_step --results-dir $R \
    --precision bf16 --warmup 12 --impl ours --preset xl --context-length 2048 --steps 20 --timing step \
    --cublas-workspace default
  ;;
s34)
  step 200 gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fused_swiglu.py
  step 590 xl-2048 $CLI bench --problem training_step --results-dir $R --precision bf16 --warmup 12 \
    --impl ${IMPLS:-peer peer-graphs ours} --preset xl --context-length 2048 --steps ${STEPS:-20}
  ;;
swab)  # the device's copy of the tree takes the variants' patch
  git apply experiments/swiglu_gemm_epilogues/s34_variants.patch || exit 1
  step 240 swiglu-ab python3 experiments/swiglu_gemm_epilogues/variant_ab_s34.py --rounds ${ROUNDS:-6} --out "$OUT" \
    ${VARIANTS:+--variants $VARIANTS}
  for v in ${NCU_VARIANTS:-bwd-shipped bwd-split}; do
    step 120 "ncu-$v" ncu --kernel-name regex:swiglu_bwd --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
      python3 experiments/swiglu_gemm_epilogues/variant_ab_s34.py --only "$v" --calls 4
  done
  ;;
s35ab|s36ab)  # the device's copy of the tree takes that session's variants' patch (s36's is a superset of s35's)
  git apply "experiments/swiglu_gemm_epilogues/${1%ab}_variants.patch" || exit 1
  step 300 swiglu-ab python3 experiments/swiglu_gemm_epilogues/variant_ab_s35.py --rounds ${ROUNDS:-6} --out "$OUT" \
    ${VARIANTS:+--variants $VARIANTS}
  ;;
s36ncu)  # the device's copy of the tree takes the variants' patch; per-instruction stall samples, exported as CSV
  git apply experiments/swiglu_gemm_epilogues/s35_variants.patch || exit 1
  for v in ${NCU_VARIANTS:-bwd-shipped bwd-copy bwd-products}; do
    step 150 "ncu-$v" ncu --kernel-name regex:swiglu_bwd --launch-skip 2 --launch-count 1 --section SourceCounters \
      --section WarpStateStats --section SpeedOfLight --import-source no -f -o "$OUT/ncu-$v" \
      python3 experiments/swiglu_gemm_epilogues/variant_ab_s35.py --only "$v" --calls 4
    ncu --import "$OUT/ncu-$v.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$v-sass.csv" 2>&1
    ncu --import "$OUT/ncu-$v.ncu-rep" --page details > "$OUT/ncu-$v-details.txt" 2>&1
  done
  ;;
*) echo "usage: $0 a|b|...|x|y|z|f2|f3|f4|f5|pp|pp2|gemm2|host|launch|frope|peer|ncu|timing|timing512|timing-graphs|timing2048|lt|swab|s34|s35ab|s36ab|s36ncu (see the header)"; exit 2;;
esac
tar -czf "$OUT/results.tgz" -C "$R" . && echo "records: $(find "$R" -name '*.jsonl' | wc -l) files"
cat "$OUT/summary.txt" | grep -v '^\s*$' | tail -n 80
