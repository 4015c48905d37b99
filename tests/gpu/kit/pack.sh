#!/usr/bin/env bash
# Packs the GPU kit (see README.md beside this file). Run here, on the CPU machine with the project's .venv:
#     bash tests/gpu/kit/pack.sh [PYVER=3.12] [OUTDIR=.gpu]        (or: make gpu-kit)
# PYVER: the GPU machine's Python minor version (3.12 there; 3.11 for the dry run on this machine).
# OUTDIR (default: .gpu at the checkout's root, git-ignored) receives:
#   site.tar.xz      the packages the GPU image lacks, at the versions of our .venv, unpacked into one folder
#   project.tar.gz   only with PROJECT_ARCHIVE=1: `git archive HEAD` of the project, for a machine the checkout does
#                    not travel to (the device tool sends the checkout itself, and run.sh then copies the folder
#                    around the kit); PROJECT_COMMIT names the commit either way
#   agentrl_cache/   the built-in tiny model, prebuilt (building it there would cost minutes)
#   run.sh           what runs there: bash .gpu/run.sh
#   VERSIONS, SHA256SUMS
# and fails if the whole folder is over LIMIT_MIB (64: what one device command may carry).
# Environment: VENV_PY (the interpreter whose package versions are pinned; default .venv/bin/python), WHEELS (where
# downloaded/built wheels are kept between runs; default .cache/gpu_kit/wheels-cpXY), XZ_ARGS (see below),
# LIMIT_MIB, PROJECT_ONLY (1: keep the folder's site.tar.xz and VERSIONS, re-pack the project, model and run.sh:
# seconds instead of minutes, after a commit).
set -euo pipefail
PYVER=${1:-3.12}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
OUTDIR=${2:-$ROOT/.gpu}
VENV_PY=${VENV_PY:-$ROOT/.venv/bin/python}
TAG=cp${PYVER/./}
WHEELS=${WHEELS:-$ROOT/.cache/gpu_kit/wheels-$TAG}
# One xz block with a 256 MiB dictionary: Ray's raylet, gcs_server and _raylet.so (118 MB) share most of their
# statically linked code, which a dictionary that spans them all stores once (-9e's 64 MiB does not: +7 MiB).
# ~3 GB of memory to pack, 256 MiB to unpack.
XZ_ARGS=${XZ_ARGS:--T1 --lzma2=preset=9e,dict=256MiB}
LIMIT_MIB=${LIMIT_MIB:-64}
log() { echo "[pack.sh $(date +%H:%M:%S)] $*"; }
# pip through the venv, without the warnings about this machine's configured local indexes that are absent.
pip_() { timeout 600 "$VENV_PY" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a dir' || true; }; }

# What the GPU image (torch, transformers, peft, accelerate, pytest, numpy, safetensors, huggingface_hub,
# tokenizers and their own dependencies) lacks for tests/gpu/test_gpu_e2e.py and test_gpu_learner.py, as
# distribution names; each is pinned to the version our .venv has.
PKGS=(
  # Ray (core, Train) and what it imports; Ray Train imports pandas and pyarrow (pyarrow.fs: its storage) at the top
  ray click filelock jsonschema jsonschema-specifications referencing rpds-py attrs msgpack protobuf pyyaml
  packaging requests urllib3 idna certifi charset-normalizer pandas python-dateutil six tzdata pyarrow
  # pydantic (Ray Train's and DeepSpeed's configs)
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  # DeepSpeed (ZeRO-2 learner; the wheel is built here from its sdist, no ops) and its dependencies
  deepspeed hjson einops ninja py-cpuinfo psutil
  # QLoRA's NF4 kernels
  bitsandbytes
  # the project's pins, newer than the image's (transformers >= 5.19)
  transformers peft
  # the project's own
  docstring-parser cloudpickle
  # the test runner's per-test timeout
  pytest-timeout
)
# SKIP_PKGS: distributions left out of the site (space-separated), e.g. SKIP_PKGS=bitsandbytes (-6.5 MiB packed) when
# the checkout has grown and the kit would pass the limit: the QLoRA case of test_gpu_learner.py then fails for want
# of it, so select the tests to run without it (TESTS=...).
if [ -n "${SKIP_PKGS:-}" ]; then
  KEEP=()
  for pkg in "${PKGS[@]}"; do [[ " $SKIP_PKGS " == *" $pkg "* ]] || KEEP+=("$pkg"); done
  PKGS=("${KEEP[@]}")
  echo "[pack.sh] SKIP_PKGS: leaving out $SKIP_PKGS"
fi
# Platform tags of a manylinux x86_64 machine (pip does not widen manylinux_2_X tags by itself).
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
TARGET=(--python-version "$PYVER" --implementation cp "${PLAT[@]}")

mkdir -p "$OUTDIR" "$WHEELS"
OUTDIR=$(cd "$OUTDIR" && pwd)
WHEELS=$(cd "$WHEELS" && pwd)
# A previous kit is replaced; any other non-empty folder is left alone.
if [ -n "$(ls -A "$OUTDIR")" ] && [ ! -e "$OUTDIR/SHA256SUMS" ] && [ ! -e "$OUTDIR/site.tar.xz" ]; then
  echo "pack.sh: $OUTDIR is not empty and holds no previous kit: refusing to write there" >&2; exit 2
fi
if [ "${PROJECT_ONLY:-0}" = 1 ]; then
  [ -s "$OUTDIR/site.tar.xz" ] && [ -s "$OUTDIR/VERSIONS" ] || { echo "pack.sh: PROJECT_ONLY=1 needs a packed kit" >&2; exit 2; }
  log "PROJECT_ONLY=1: keeping $OUTDIR/site.tar.xz ($(head -1 "$OUTDIR/VERSIONS"))"
else
rm -rf "$OUTDIR"/site.tar.xz "$OUTDIR"/VERSIONS
fi
rm -rf "$OUTDIR"/project.tar.gz "$OUTDIR"/agentrl_cache "$OUTDIR"/run.sh \
  "$OUTDIR"/SHA256SUMS "$OUTDIR"/PROJECT_COMMIT "$OUTDIR"/README.md

if [ "${PROJECT_ONLY:-0}" != 1 ]; then
# ---------------------------------------------------------------------------------------------- 1. wheels
PINS=$("$VENV_PY" - "${PKGS[@]}" <<'EOF'
import importlib.metadata as m, sys
missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={m.version(name)}")
    except m.PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed in the venv (nothing to pin to): {missing}")
EOF
)
log "target cp$PYVER manylinux x86_64; pins from $VENV_PY:"
echo "$PINS" | tr '\n' ' '; echo
DS_PIN=$(echo "$PINS" | grep '^deepspeed==')
DS_VER=${DS_PIN#deepspeed==}
# DeepSpeed ships only an sdist: build a wheel here (pure Python without DS_BUILD_OPS). No build isolation: an
# isolated build would install a (multi-GB, CUDA) torch just to run setup.py.
if ! ls "$WHEELS"/deepspeed-"$DS_VER"-*.whl >/dev/null 2>&1; then
  log "building the DeepSpeed $DS_VER wheel from its sdist (no ops)"
  DS_BUILD_OPS=0 && export DS_BUILD_OPS
  pip_ wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$DS_PIN"
fi
log "downloading the other wheels into $WHEELS (kept between runs)"
# shellcheck disable=SC2046
pip_ download -q --no-deps --only-binary=:all: "${TARGET[@]}" -d "$WHEELS" \
  $(echo "$PINS" | grep -v '^deepspeed==')

# ---------------------------------------------------------------------------------------------- 2. the site
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SITE=$WORK/site
log "unpacking into one site folder (no deps, no .pyc)"
# The pins as requirements against the wheel folder: exactly these versions, an error if one is missing.
# shellcheck disable=SC2046
pip_ install -q --no-index --find-links "$WHEELS" --no-deps --no-compile --no-cache-dir \
  --only-binary=:all: "${TARGET[@]}" --target "$SITE" $PINS
du -sm "$SITE" | awk '{print "  site before trimming: " $1 " MiB"}'
# Ray: Java jars (cross-language workers), RLlib, Serve, LLM serving, the dashboard's web client, examples.
rm -rf "$SITE"/ray/jars "$SITE"/ray/rllib "$SITE"/ray/serve "$SITE"/ray/llm "$SITE"/ray/dashboard/client \
  "$SITE"/ray/train/examples "$SITE"/ray/tune/examples "$SITE"/ray/data/examples
# bitsandbytes: its CPU library and the CUDA 13.x ones (torch 2.11.0+cu130 there loads libbitsandbytes_cuda130).
[ ! -d "$SITE"/bitsandbytes ] || find "$SITE"/bitsandbytes -maxdepth 1 -name 'libbitsandbytes_*' ! -name 'libbitsandbytes_cpu.so' \
  ! -name 'libbitsandbytes_cuda130.so' ! -name 'libbitsandbytes_cuda132.so' -delete
# pyarrow (Ray Train needs pyarrow.fs and the core library; it asks for pyarrow.fs.S3FileSystem on every checkpoint,
# so S3 stays): not Flight, GCS/Azure/HDFS, ORC, its C++ tests, headers and Cython sources; of each libarrow_python*
# only the soname file the loader asks for (a wheel holds no symlinks: pip wrote .so, .so.N and .so.N.M.P as copies).
A=$SITE/pyarrow
rm -rf "$A"/include "$A"/tests "$A"/src "$SITE"/pandas/tests
rm -f "$A"/libarrow_flight.so* "$A"/libarrow_python_flight.so* "$A"/_flight.*.so "$A"/_gcsfs.*.so "$A"/_azurefs.*.so \
  "$A"/_hdfs.*.so "$A"/_orc.*.so "$A"/_dataset_orc.*.so "$A"/_pyarrow_cpp_tests.*.so "$A"/libarrow_python*.so \
  "$A"/libarrow_python*.so.*.*.*
find "$A" \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.cc' \) -delete
# Symbol tables (the dynamic symbols stay: `strip --strip-unneeded`): a quarter of Ray's and Arrow's binaries, ~10 MiB
# packed; only crash backtraces lose names. Not bitsandbytes' CUDA libraries (their kernels; little to gain).
# STRIP=0 skips it. strip refuses non-ELF files (scripts with the x bit) and leaves them as they are.
if [ "${STRIP:-1}" != 0 ] && command -v strip >/dev/null; then
  find "$SITE" -path "$SITE/bitsandbytes" -prune -o -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) \
    -print0 | xargs -0 -r -n 50 strip --strip-unneeded 2>/dev/null || true
fi
# Console scripts carry this machine's interpreter path: nothing calls them there (ray stop: python -c).
rm -rf "$SITE"/bin
find "$SITE" -name __pycache__ -type d -prune -exec rm -rf {} +
du -sm "$SITE" | awk '{print "  site after trimming:  " $1 " MiB"}'
(cd "$SITE" && du -sm -- * | sort -rn | head -8 | awk '{printf "    %5s MiB  %s\n", $1, $2}')
log "packing site.tar.xz (xz $XZ_ARGS)"
# shellcheck disable=SC2086  # XZ_ARGS: words on purpose
tar -C "$SITE" --sort=name --owner=0 --group=0 -cf - . | xz $XZ_ARGS > "$OUTDIR/site.tar.xz"
"$VENV_PY" - "$WHEELS" "$PYVER" "$VENV_PY" $PINS > "$OUTDIR/VERSIONS" <<'EOF'
import sys, time
from pathlib import Path
from packaging.utils import canonicalize_name, parse_wheel_filename
wheels, pyver, venv_py, pins = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"# packed {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} for cp{pyver} manylinux x86_64; pins: {venv_py}")
found = {}
for w in sorted(wheels.glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(w.name)
    found.setdefault((name, str(version)), []).append(w.name)
for pin in pins:
    name, version = pin.split("==")
    print(f"{pin:36s} {' '.join(found.get((canonicalize_name(name), version), ['?']))}")
EOF
if grep -q ' ?$' "$OUTDIR/VERSIONS"; then
  echo "pack.sh: no wheel for cp$PYVER in $WHEELS for:" >&2; grep ' ?$' "$OUTDIR/VERSIONS" >&2; exit 1
fi

fi

# ---------------------------------------------------------------------------------------------- 3. the project
cd "$ROOT"
COMMIT=$(git rev-parse HEAD)
log "project: $COMMIT"
if [ "${PROJECT_ARCHIVE:-0}" = 1 ]; then
  git archive --format=tar.gz HEAD -- . ':(exclude)docs/benchmarks' ':(exclude)benchmarks/results' \
    ':(exclude)*.png' > "$OUTDIR/project.tar.gz"
fi
{
  echo "$COMMIT"
  git log -1 --format='%ci %s' HEAD
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "NOTE: the checkout had uncommitted changes at packing time:"
    git status --porcelain --untracked-files=no
  fi
} > "$OUTDIR/PROJECT_COMMIT"

# ---------------------------------------------------------------------------------------------- 4. the model
# The folder the current code names (built here first if missing: a few minutes on CPU).
log "the built-in tiny model"
MODEL=$(cd "$ROOT" && AGENTRL_CACHE=${AGENTRL_CACHE:-$ROOT/.cache/agentrl_ray} PYTHONPATH="$ROOT" \
  timeout 900 "$VENV_PY" -c '
try:
    from agentrl_ray.builtin.model import ensure_builtin_model
except ImportError:  # before the package by role
    from agentrl_ray.builtin_model import ensure_builtin_model
print(ensure_builtin_model())' | tail -1)
mkdir -p "$OUTDIR/agentrl_cache/models"
case "$(realpath "$MODEL")/" in
  "$(realpath "$ROOT")"/*) echo "  $(basename "$MODEL"): shipped in the package (travels with the checkout)";;
  *) cp -r "$MODEL" "$OUTDIR/agentrl_cache/models/"; echo "  $(basename "$MODEL") ($(du -sh "$MODEL" | cut -f1))";;
esac

# ---------------------------------------------------------------------------------------------- 5. run.sh, sums
cp "$HERE/run.sh" "$HERE/README.md" "$OUTDIR/"
(cd "$OUTDIR" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
log "kit in $OUTDIR:"
(cd "$OUTDIR" && du -sk -- * | awk '{printf "  %8.2f MiB  %s\n", $1 / 1024, $2}')
# What travels with one command: the kit and the checkout's tracked files (untracked ones too, unless ignored).
TOTAL_BYTES=$({ find "$OUTDIR" -type f -printf '%s\n'; git -C "$ROOT" ls-files -z --cached --others \
  --exclude-standard | xargs -0 -r stat -c '%s' 2>/dev/null; } | awk '{s += $1} END {print s}')
echo "  total with the checkout: $(awk -v b="$TOTAL_BYTES" 'BEGIN {printf "%.2f", b / 1048576}') MiB" \
  "($(find "$OUTDIR" -type f | wc -l) files in the kit), limit $LIMIT_MIB MiB"
if [ "$TOTAL_BYTES" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "pack.sh: the kit and the checkout are over $LIMIT_MIB MiB: they cannot travel with one device command" \
    "(SKIP_PKGS=bitsandbytes saves ~6.5 MiB, see the top of this file)" >&2
  exit 1
fi
log "done: send it with the device tool's carry [\"$(basename "$OUTDIR")\"], run: bash $(basename "$OUTDIR")/run.sh"
