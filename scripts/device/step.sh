# Sourced by the device scripts: `step <seconds> <name> <command...>` runs one step under its own time
# limit, logs to $OUT/log-<name>.txt and appends its tail and exit code to $OUT/summary.txt; a failing
# step does not stop the script. SKIP="name ..." skips steps; LIMIT_<name with - as _>=seconds overrides
# a limit (e.g. LIMIT_ddp_bench_bf16=120).
step() {
  local limit=$1 name=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "=== $name skipped (SKIP)" | tee -a "$OUT/summary.txt"; return;; esac
  local var="LIMIT_${name//-/_}"; limit=${!var:-$limit}
  local t0=$SECONDS
  echo "=== $name $(date +%T)"
  timeout -k 10 "$limit" "$@" >"$OUT/log-$name.txt" 2>&1; local rc=$?
  grep -v -e '^USDT' -e 'SyncActivityProfiler' -e 'Warning' "$OUT/log-$name.txt" | tail -n 40 | cut -c1-260 \
    | tee -a "$OUT/summary.txt"
  echo "=== $name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
}
