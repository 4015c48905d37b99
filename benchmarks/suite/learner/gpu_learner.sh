#!/usr/bin/env bash
# The GPU learner's open targets (docs/history/learner_speed.md, "Round 5"), measured with the learner_throughput mode
# in one command under a time budget; prepared on a CPU, not yet run on a GPU. From the project's root:
#   python benchmarks/run.py learner --mode gpu_learner         # on a GPU machine with the project installed
#   TESTS=tests/gpu/test_gpu_learner.py::test_fused_linears_and_compile_buckets_on_cuda_give_the_eager_log_probs_and_gradients \
#   BENCH='$PY benchmarks/run.py learner --mode gpu_learner' bash .gpu/run.sh   # with the GPU kit (tests/gpu/kit/README.md)
#   DRY=1 python benchmarks/run.py learner --mode gpu_learner   # the same commands at the tiny shape on a CPU (the logic)
# The two levers of round 11 of docs/history/benchmarks.md, each against its baseline in the same process group: the fusion
# of a compiled layer's linears that share an input (off by default; `fuse` turns it on) and learner.compile_buckets
# (`bucket`: fixed-shape graphs for a run's changing lengths). Lengths are ragged as a run's are (--min-len: each
# sequence 900-1,024 tokens). Every variant has --variant-timeout: a slow compilation stops its variant, not the
# round. Each step writes $OUT/NAME.json and .log and prints its result lines, the GPU, its matmul rate and any
# paired measurements. Environment: OUT (/tmp/gpu_out), PY (python3), BUDGET (560 s: no command starts after it).
# Earlier rounds' scripts (GPU rounds 3 and 4): docs/history/benchmark_scripts.md.
set -u
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,14p' "$0" | cut -c3-; exit 0; fi
T0=$(date +%s)
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
# step NAME MAX_SECONDS ARGS...: learner_throughput $A $W ARGS, cut at MAX_SECONDS or at what is left of BUDGET
# (skipped under 45 s)
step() {
  local name=$1 lim=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 45 ]; then echo "[bench +$(( $(date +%s) - T0 ))s] SKIP $name (${left}s left)"; return; fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "[bench +$(( $(date +%s) - T0 ))s] START $name (cut at ${lim}s)"
  # shellcheck disable=SC2086  # A and W: words on purpose
  timeout -k 10 "$lim" "$PY" benchmarks/learner.py --mode learner_throughput $A ${W:-} "$@" --out "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[bench +$(( $(date +%s) - T0 ))s] END $name rc $rc"
  [ "$rc" != 0 ] && tail -25 "$OUT/$name.log"
  grep -E "tok/s|FAILED" "$OUT/$name.log" | cut -c1-300
  "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d.get("gpu"), d.get("matmul_tflops"),
    [{k: v for k, v in r.items() if k.startswith("paired_")} for r in d["results"]])' "$OUT/$name.json" 2>/dev/null
}
VT="--variant-timeout 110"
case "${DRY:-0}" in
  1) A="--device cpu --warmup 1 --steps 1 --seq 256 --min-len 200"; S05=tiny; S15=tiny; W="" ;;
  *) A="--device cuda --min-len 900"; S05=0.5b; S15=1.5b; W="--warmup 2" ;;
esac
# 1. 0.5B full fine-tune, 1 x 16: as a run compiles today (round 3's 28.6%), fused, bucketed, both
step lt05-full 400 --shape $S05 --variants \
    full.compile.mb16,full.compile.mb16.fuse,full.compile.mb16.bucket,full.compile.mb16.fuse.bucket --steps 4 $VT
# 2. 0.5B LoRA: unfused against fused (the LoRA/full ratio: 0.84x in round 3)
step lt05-lora 220 --shape $S05 --variants lora.compile.mb16,lora.compile.mb16.fuse --steps 4 $VT
# 3. 1.5B full fine-tune: as a run compiles, and with both levers (44.6% MFU for a fixed shape in round 3; 45% the
#    target)
step lt15-full 230 --shape $S15 --variants full.compile.mb16,full.compile.mb16.fuse.bucket --steps 3 $VT
echo "[bench +$(( $(date +%s) - T0 ))s] done"
