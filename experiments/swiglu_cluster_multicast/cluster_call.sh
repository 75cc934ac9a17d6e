export PYTHONPATH=$PWD CS336_GIT_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p $OUT/results
timeout 120 python3 experiments/swiglu_cluster_multicast/swiglu_cluster_grid.py 132 2>&1 | grep -v Warning | tee $OUT/log-grid.txt | tail -8
python3 - <<'PY' && CS336_SWIGLU_CLUSTER=2 timeout 420 python3 -m cs336_systems bench --problem training_step --results-dir $OUT/results --precision bf16 --warmup 12 --impl peer ours --preset xl --context-length 2048 --steps 20 > $OUT/log-peer-c2.txt 2>&1; tail -25 $OUT/log-peer-c2.txt | cut -c1-250
import re, sys
t = {l.split()[0] + l.split()[1]: float(l.split(" ms")[0].split()[-1]) for l in open(__import__("os").environ["OUT"] + "/log-grid.txt") if re.match(r"^(fwd|bwd) c", l)}
print(t)
sys.exit(0 if t.get("fwdc2", 9) < t.get("fwdc1", 0) or t.get("bwdc2", 9) < t.get("bwdc1", 0) else 1)
PY
tar -czf $OUT/results.tgz -C $OUT/results .
