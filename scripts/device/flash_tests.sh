#!/usr/bin/env bash
# The GPU flash tests in three pytest processes at once (Triton compiles on the CPU, one kernel at a time
# per process; the GPU work is small), the feature tests in a fourth and the Gluon kernels' switch tests
# (tests/test_flash_hopper.py) in a fifth: prints each shard's summary; exit code 1 if any shard failed.
set -u
shards=("low_precision and fp16" "low_precision and bf16" "not low_precision")
pids=()
# a time limit (step.sh's timeout) stops the shards too: left running, they would compile and launch beside the
# next step's timings
trap 'kill "${pids[@]}" 2>/dev/null; exit 124' TERM INT
for i in 0 1 2; do
  python3 -m pytest -m gpu tests/test_flash_attention.py -q -p no:cacheprovider -rf -k "${shards[$i]}" \
    >"/tmp/flash-tests-$i.txt" 2>&1 &
  pids+=($!)
done
shards+=("features")
python3 -m pytest -m gpu tests/test_flash_kernel_features.py tests/test_model_flash_features.py -q \
  -p no:cacheprovider -rf >"/tmp/flash-tests-3.txt" 2>&1 &
pids+=($!)
shards+=("hopper")
python3 -m pytest -m gpu tests/test_flash_hopper.py -q -p no:cacheprovider -rf >"/tmp/flash-tests-4.txt" 2>&1 &
pids+=($!)
rc=0
for i in 0 1 2 3 4; do
  wait "${pids[$i]}" || rc=1
  echo "--- shard: ${shards[$i]}"; grep -E "passed|failed|FAILED|Error" "/tmp/flash-tests-$i.txt" | tail -15
done
exit $rc
