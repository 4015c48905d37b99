#!/usr/bin/env bash
# Issue 33's GPU learner measurements, round 5 (prepared on a CPU; not yet run on a GPU), from the project's root
# by .gpu/run.sh's BENCH:
#   TESTS=tests/unit/test_linear_fusion.py BENCH="bash docs/benchmarks/gpu/learner_throughput-round5-bench.sh" \
#   bash .gpu/run.sh
# The two levers built in round 11 of docs/benchmarks.md, each against its baseline in the same process group:
# the fusion of a compiled layer's linears that share an input (off by default; `fuse` turns it on) and
# learner.compile_buckets (`bucket`: fixed-shape graphs for a run's changing lengths). Lengths are ragged as a run's
# are (--min-len: each sequence 900-1,024 tokens). Every variant has --variant-timeout: a slow compilation stops
# its variant, not the round.
# DRY=1: the same commands at the tiny shape on a CPU (the logic only).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/bench_step.sh"  # step NAME MAX_SECONDS ARGS...; T0, PY and OUT if unset
BUDGET=${BUDGET:-560}   # seconds: no command starts after this
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
