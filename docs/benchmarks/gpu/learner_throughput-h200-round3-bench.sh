#!/usr/bin/env bash
# Issue 33's GPU learner measurements (round 7), run from the project's root by .gpu/run.sh's BENCH.
# DRY=1: the same commands at the tiny shape on a CPU (the logic only).
set -u
T0=$(date +%s)
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}
BUDGET=${BUDGET:-440}   # seconds: no command starts after this
if [ "${DRY:-0}" = 1 ]; then A="--device cpu --warmup 1 --steps 1"; S05=tiny; S15=tiny; else A="--device cuda"; S05=0.5b; S15=1.5b; fi
. "$(dirname "${BASH_SOURCE[0]}")/bench_step.sh"  # step NAME MAX_SECONDS ARGS...
# 1. the 0.5B full fine-tune as a run gets it (compiled, one micro-batch of 16): its profile with the GPU's busy
#    share, and the head's kept probabilities against recomputed, alternating in one process
step lt05-full $((150)) --shape $S05 --variants full.compile.mb16 --profile 12 --paired-keep 3 --warmup 2 --steps 5
# 2. the 1.5B full fine-tune, the same
step lt15-full $((170)) --shape $S15 --variants full.compile.mb16 --profile 12 --paired-keep 2 --warmup 2 --steps 4
# 3. the 0.5B LoRA step, the same (for the LoRA / full ratio)
step lt05-lora $((150)) --shape $S05 --variants lora.compile.mb16 --profile 12 --paired-keep 2 --warmup 2 --steps 5
# 4. fixed-shape compilation, then CUDA graphs on top of it (0.5B full)
step lt05-static $((120)) --shape $S05 --variants full.compile.mb16.static,full.compile.mb16.cudagraphs --profile 12 --warmup 2 --steps 5
echo "[bench +$(( $(date +%s) - T0 ))s] done"
