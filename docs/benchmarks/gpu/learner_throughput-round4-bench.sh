#!/usr/bin/env bash
# Issue 33's GPU learner measurements, round 4, run from the project's root by .gpu/run.sh's BENCH:
#   TESTS=tests/gpu/test_gpu_learner.py::test_shared_prefix_on_cuda_gives_the_unpacked_log_probs_and_gradients \
#   BENCH="bash docs/benchmarks/gpu/learner_throughput-round4-bench.sh" bash .gpu/run.sh
# Each baseline runs in the same call as its lever (timings compare only on one card).
# DRY=1: the same commands at the tiny shape on a CPU (the logic only).
set -u
T0=$(date +%s)
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}
BUDGET=${BUDGET:-380}   # seconds: no command starts after this
if [ "${DRY:-0}" = 1 ]; then A="--device cpu --warmup 1 --steps 1 --seq 256"; S05=tiny; S15=tiny; W=""
else A="--device cuda"; S05=0.5b; S15=1.5b; W="--warmup 2"; fi
. "$(dirname "${BASH_SOURCE[0]}")/bench_step.sh"  # step NAME MAX_SECONDS ARGS...
# 1. the decoder stack compiled as one graph against each layer compiled (0.5B full fine-tune, 1 x 16, dynamic
#    shapes as a run compiles)
step lt05-stack 170 --shape $S05 --variants full.compile.mb16.stack,full.compile.mb16 --steps 4
# 2. the shared prefix on CUDA: 2 micro-batches of 8 (one group each) with 512-token prompts, off/on alternating
step lt05-share512 100 --shape $S05 --variants full.compile.share --prompt-len 512 --steps 2 --paired-share 3
# 3. the 1.5B full fine-tune: stack against layers
step lt15-stack 150 --shape $S15 --variants full.compile.mb16.stack,full.compile.mb16 --steps 3
# 4. the 0.5B LoRA step with the stack compiled (against step 1's full one)
step lt05-lora-stack 120 --shape $S05 --variants lora.compile.mb16.stack --steps 3
echo "[bench +$(( $(date +%s) - T0 ))s] done"
