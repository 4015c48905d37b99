#!/usr/bin/env bash
# The GPU tests of agentrl_ray on one bare GPU machine (H100/H200, no package registry), in one command from the
# root of a checkout holding the kit packed by tests/gpu/kit/pack.sh in .gpu/ (README.md beside this file):
#     bash .gpu/run.sh                                   -> results under $OUT (default /tmp/gpu_out)
# 0. checks SHA256SUMS, unpacks the carried packages into $SITE and the project (git HEAD, PROJECT_COMMIT) into
#    $PROJ, puts the prebuilt built-in model under $AGENTRL_CACHE, prints versions (and where each package is
#    imported from: the carried site must win over the image's own) and nvidia-smi           -> $OUT/setup.log
# 1. from $PROJ: python -m pytest $TESTS -v -s -rA -p no:cacheprovider --timeout=$T_TEST, cut at $T_ALL seconds
#    -> $OUT/pytest.log, $OUT/gpu_e2e.jsonl (every GPU_E2E_JSON line), $OUT/runs/ (the runs' metrics and configs),
#       $OUT/ray_logs/ (the tails of Ray's non-empty logs, on failure only)
# 1b. with BENCH set: that shell command from $PROJ, in the same environment (OUT exported), cut at T_BENCH seconds
#    -> $OUT/bench.log (e.g. BENCH='$PY benchmarks/run.py learner --out $OUT/lt.json'; OUT, PY exported)
# 2. `ray stop --force`, then the GPU's remaining processes; a summary (also $OUT/summary.log).
# Exit status 0 only when pytest passed (exit 0).
# Time on an H100/H200: set-up ~30 s, tests ~4-6 min (cut at T_ALL=420 s), clean-up ~10 s.
# Environment overrides (defaults are for the GPU machine):
#   PY (python3), SITE (/tmp/agentrl_site), PROJ (/tmp/agentrl_project), AGENTRL_CACHE (/tmp/agentrl_cache),
#   OUT (/tmp/gpu_out), T_ALL (420: pytest as a whole, seconds), T_TEST (240: per test, pytest-timeout),
#   TESTS (the pytest selection; default "tests/gpu/test_gpu_e2e.py tests/gpu/test_gpu_learner.py -m gpu"; "none":
#   no pytest, the exit status is BENCH's),
#   RAY_STOP (0: no `ray stop --force` afterwards, for a machine shared with other Ray users), BENCH (none),
#   T_BENCH (300), PACK_OUT (1: everything under $OUT packed into $OUT/results.tgz at the end; 0: left as files).
set -u
T0=$(date +%s)
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)   # the carried kit folder
PY=${PY:-python3}
SITE=${SITE:-/tmp/agentrl_site}
PROJ=${PROJ:-/tmp/agentrl_project}
OUT=${OUT:-/tmp/gpu_out}
T_ALL=${T_ALL:-420}
T_TEST=${T_TEST:-240}
TESTS=${TESTS:-tests/gpu/test_gpu_e2e.py tests/gpu/test_gpu_learner.py -m gpu}
export AGENTRL_CACHE=${AGENTRL_CACHE:-/tmp/agentrl_cache}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0 RAY_DEDUP_LOGS=0
# The carried site first, then the project: both ahead of the image's site-packages (Ray's workers inherit it).
export PYTHONPATH="$SITE:$PROJ${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OUT PY
log() { echo "[run.sh $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
for d in "$SITE" "$PROJ"; do
  case "$d" in /|/tmp|/tmp/|"$HOME"|"$HOME"/|"") echo "run.sh: refusing to replace the folder '$d'" >&2; exit 2;; esac
done

# ---------------------------------------------------------------------------------------------- 0. set-up
{
log "kit $B -> site $SITE, project $PROJ, model cache $AGENTRL_CACHE, results $OUT"
if (cd "$B" && sha256sum --quiet -c SHA256SUMS); then log "SHA256SUMS: all carried files match"
else log "WARNING: a carried file does not match SHA256SUMS (see above)"; fi
rm -rf "$SITE" "$PROJ"
mkdir -p "$SITE" "$PROJ" "$AGENTRL_CACHE/models"
if ! tar -xJf "$B/site.tar.xz" -C "$SITE" 2>/dev/null; then
  log "tar -xJ failed (no xz?): unpacking with Python's tarfile"
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$B/site.tar.xz" "$SITE" \
    || log "ERROR: could not unpack site.tar.xz"
fi
if [ -f "$B/project.tar.gz" ]; then
  tar -xzf "$B/project.tar.gz" -C "$PROJ" || log "ERROR: could not unpack project.tar.gz"
else  # the device tool sends the checkout the kit sits in: the project is the folder around it, the kit excluded
  tar -C "$B/.." --exclude="./$(basename "$B")" -cf - . | tar -xf - -C "$PROJ" || log "ERROR: could not copy $B/.."
fi
cp -r "$B"/agentrl_cache/models/. "$AGENTRL_CACHE/models/" 2>/dev/null || log "no prebuilt built-in model carried"
log "unpacked: site $(du -sm "$SITE" | cut -f1) MiB, project $(du -sm "$PROJ" | cut -f1) MiB"
log "project commit: $(head -2 "$B/PROJECT_COMMIT" 2>/dev/null | tr '\n' ' ')"
grep -q '^NOTE' "$B/PROJECT_COMMIT" 2>/dev/null && log "$(grep '^NOTE' "$B/PROJECT_COMMIT")"
log "PYTHONPATH=$PYTHONPATH"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi || log "nvidia-smi failed"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
else
  log "no nvidia-smi here (a CPU dry run?)"
fi
echo "cpus $(nproc)"; free -g | head -2; df -h /tmp | tail -1
# Versions and where each package comes from; the bitsandbytes library loaded; the built-in model under the name
# the carried code computes (copied there if the carried folder was built under another name).
timeout 90 "$PY" - "$SITE" <<'EOF' || log "WARNING: the version check failed (see above)"
import importlib, importlib.metadata as md, os, shutil, sys
from pathlib import Path
site = os.path.realpath(sys.argv[1])
print("python", sys.version.replace("\n", " "), sys.executable)
import torch
cuda = torch.cuda.is_available()
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", cuda,
      torch.cuda.get_device_name(0) if cuda else "-",
      "capability", torch.cuda.get_device_capability(0) if cuda else "-")
print("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST"))
carried = {p.name.split("-")[0].lower().replace("_", "-") for p in Path(site).glob("*.dist-info")}
wrong = []
for mod, dist in [("transformers", "transformers"), ("peft", "peft"), ("accelerate", "accelerate"),
                  ("tokenizers", "tokenizers"), ("safetensors", "safetensors"), ("huggingface_hub", "huggingface-hub"),
                  ("numpy", "numpy"), ("pydantic", "pydantic"), ("ray", "ray"), ("deepspeed", "deepspeed"),
                  ("bitsandbytes", "bitsandbytes"), ("docstring_parser", "docstring-parser"),
                  ("cloudpickle", "cloudpickle"), ("yaml", "pyyaml"), ("pytest", "pytest"),
                  ("pytest_timeout", "pytest-timeout")]:
    try:
        m = importlib.import_module(mod)
        where = os.path.realpath(m.__file__)
        origin = "carried" if where.startswith(site + os.sep) else "image"
        if dist in carried and origin != "carried":
            wrong.append(mod)
        print(f"{mod:18s} {md.version(dist):14s} {origin:8s} {os.path.dirname(where)}")
    except Exception as e:
        print(f"{mod:18s} IMPORT FAILED: {type(e).__name__}: {e}")
if wrong:
    print("WARNING: carried but imported from the image:", wrong)
try:
    from bitsandbytes.cextension import lib
    print("bitsandbytes native library:", type(lib).__name__, getattr(getattr(lib, "_lib", None), "_name", None))
except Exception as e:
    print("bitsandbytes native library: FAILED", type(e).__name__, e)
# The built-in model under the name the carried code computes: its own ensure_builtin_model(), with the build step
# (minutes) replaced by a copy of the carried folder, which only runs if that name differs from the carried one.
mod = None
for name in ("agentrl_ray.builtin.model", "agentrl_ray.builtin_model"):  # the second: before the package by role
    try:
        mod = importlib.import_module(name)
        break
    except ImportError as e:
        err = e
if mod is None:
    print("built-in model: cannot import the project's model module:", err)
else:
    models = Path(os.environ["AGENTRL_CACHE"]) / "models"
    name = getattr(mod, "NAME", "tiny-calculator")
    prebuilt = sorted(p for p in models.glob(f"{name}-*") if (p / "config.json").is_file())

    def build_from_carried(out_dir, *args, **kwargs):
        if not prebuilt:
            raise RuntimeError("no built-in model was carried")
        shutil.copytree(prebuilt[0], out_dir, dirs_exist_ok=True)
        print(f"built-in model: carried as {prebuilt[0].name}, this code names it otherwise: copied")

    mod.build = build_from_carried
    try:
        print("built-in model:", mod.ensure_builtin_model())
    except Exception as e:
        print(f"built-in model: NOT ready ({type(e).__name__}: {e}); the tests build it first (minutes)")
EOF
} 2>&1 | tee "$OUT/setup.log"

# ---------------------------------------------------------------------------------------------- 1. the tests
BASETEMP=$(mktemp -d /tmp/agentrl_pytest.XXXXXX)
if [ "$TESTS" = none ]; then  # a benchmark-only run (BENCH): the device time goes to the benchmark
  log "TESTS=none: no pytest" | tee "$OUT/pytest.log"
  RC=0
else
log "pytest $TESTS (cut at ${T_ALL}s, ${T_TEST}s per test)" | tee "$OUT/pytest.log"
# shellcheck disable=SC2086  # TESTS: words on purpose
(
  cd "$PROJ" && exec timeout -k 15 "$T_ALL" "$PY" -m pytest $TESTS -v -s -rA -p no:cacheprovider \
    --timeout="$T_TEST" --basetemp="$BASETEMP/t"
) 2>&1 | timeout $((T_ALL + 40)) tee -a "$OUT/pytest.log"
RC=${PIPESTATUS[0]}
fi
{ [ "$RC" = 124 ] || [ "$RC" = 137 ]; } && log "pytest was cut at ${T_ALL}s" | tee -a "$OUT/pytest.log"
log "pytest exit code $RC" | tee -a "$OUT/pytest.log"
grep -a 'GPU_E2E_JSON ' "$OUT/pytest.log" | sed 's/.*GPU_E2E_JSON //' > "$OUT/gpu_e2e.jsonl"
# The runs' own records (metrics.jsonl, config.json, summaries: small files only).
if [ -d "$BASETEMP/t" ]; then
  mkdir -p "$OUT/runs"
  (cd "$BASETEMP/t" && find . -path '*checkpoint_*' -prune -o -type f \( -name '*.jsonl' -o -name '*.json' \) \
    -size -2M -print0 | xargs -0 -r cp --parents -t "$OUT/runs") 2>/dev/null || true
fi
if [ "$RC" != 0 ] && [ -d /tmp/ray/session_latest/logs ]; then  # what Ray's processes said, for a failure
  mkdir -p "$OUT/ray_logs"
  find /tmp/ray/session_latest/logs -maxdepth 1 -type f \( -name '*.err' -o -name '*.out' -o -name '*.log' \) \
    -size +0 | while read -r f; do tail -n 200 "$f" > "$OUT/ray_logs/$(basename "$f")"; done
fi

# ---------------------------------------------------------------------------------------------- 1b. a benchmark
if [ -n "${BENCH:-}" ]; then
  log "BENCH (cut at ${T_BENCH:-300}s): $BENCH" | tee "$OUT/bench.log"
  (cd "$PROJ" && exec timeout -k 15 "${T_BENCH:-300}" bash -c "$BENCH") 2>&1 | tee -a "$OUT/bench.log"
  BRC=${PIPESTATUS[0]}
  log "BENCH exit code $BRC" | tee -a "$OUT/bench.log"
  [ "$TESTS" = none ] && RC=$BRC  # a benchmark-only run's status is the benchmark's
fi

# ---------------------------------------------------------------------------------------------- 2. clean-up
# A cut pytest can leave Ray's processes (and a GPU worker) behind. `ray stop --force` ends every Ray process of
# the machine: right on the bare GPU machine, not on a shared one (RAY_STOP=0).
if [ "${RAY_STOP:-1}" != 0 ]; then
  timeout 30 "$PY" -c "import ray.scripts.scripts as s; s.main()" stop --force >/dev/null 2>&1 || true
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv \
  2>/dev/null | tee -a "$OUT/pytest.log"
rm -rf "$BASETEMP"

# ---------------------------------------------------------------------------------------------- summary
{
log "SUMMARY pytest exit $RC ($([ "$RC" = 0 ] && echo passed || echo FAILED)), total $(( $(date +%s) - T0 ))s"
# pytest's short summary (-rA): one line per test, then its closing line.
grep -aE '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' "$OUT/pytest.log" | cut -c1-200
grep -aE '^=+ .*(passed|failed|error|skipped|deselected|no tests ran).* =+$|Timeout >' "$OUT/pytest.log" | tail -3
[ -s "$OUT/gpu_e2e.jsonl" ] && { echo "GPU_E2E_JSON lines ($OUT/gpu_e2e.jsonl):"; cut -c1-400 "$OUT/gpu_e2e.jsonl"; }
echo "results in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
} 2>&1 | tee "$OUT/summary.log"
# The device tool brings back at most 8 files of $OUT (and the next command's $OUT starts empty): with PACK_OUT=1
# (the default) everything goes into one archive, $OUT/results.tgz, beside summary.log; the files themselves move
# to $OUT.files/ on the machine.
if [ "${PACK_OUT:-1}" = 1 ] && tar -czf "/tmp/agentrl_results.$$.tgz" -C "$OUT" .; then
  rm -rf "$OUT.files" && mkdir -p "$OUT.files" && mv "$OUT"/* "$OUT.files"/
  mv "/tmp/agentrl_results.$$.tgz" "$OUT/results.tgz" && cp "$OUT.files/summary.log" "$OUT/"
  echo "packed into $OUT/results.tgz ($(du -k "$OUT/results.tgz" | cut -f1) KiB): tar -xzf results.tgz"
fi
[ "$RC" = 0 ]
