# The `step` of the GPU learner benchmark scripts beside this file (sourced: `. "$(dirname "${BASH_SOURCE[0]}")/bench_step.sh"`).
# step NAME MAX_SECONDS ARGS...: benchmarks/learner_throughput.py $A $W ARGS, cut at MAX_SECONDS or at what is left
# of BUDGET seconds since T0 (skipped under 45 s), into $OUT/NAME.json and .log; prints its result lines, the GPU,
# its matmul rate and any paired measurements. Reads PY, OUT, BUDGET, T0, A and W (W may be unset); sourcing sets
# T0 (now), PY (python3) and OUT (/tmp/gpu_out) where they are unset.
T0=${T0:-$(date +%s)}
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
step() {
  local name=$1 lim=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 45 ]; then echo "[bench +$(( $(date +%s) - T0 ))s] SKIP $name (${left}s left)"; return; fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "[bench +$(( $(date +%s) - T0 ))s] START $name (cut at ${lim}s)"
  # shellcheck disable=SC2086  # A and W: words on purpose
  timeout -k 10 "$lim" "$PY" benchmarks/learner_throughput.py $A ${W:-} "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[bench +$(( $(date +%s) - T0 ))s] END $name rc $rc"
  [ "$rc" != 0 ] && tail -25 "$OUT/$name.log"
  grep -E "tok/s|FAILED" "$OUT/$name.log" | cut -c1-300
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d.get("gpu"), d.get("matmul_tflops"),
    [{k: v for k, v in r.items() if k.startswith("paired_")} for r in d["results"]])' "$OUT/$name.json" 2>/dev/null
}
