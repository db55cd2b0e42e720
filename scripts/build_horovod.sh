#!/usr/bin/env bash
# Build Horovod for TensorFlow from its PyPI sdist once, cache the wheel, install it. Gloo does
# the CPU collectives; on a node with an NVIDIA GPU, the CUDA toolkit and NCCL, NCCL does the GPU
# ones (HOROVOD_GPU_OPERATIONS=NCCL).
# Usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR      (the Makefile's `make horovod` step)
#        build_horovod.sh --plan PYTHON              (print the key this node would build; no build)
# NBDIST_HOROVOD_OPS=gloo|nccl overrides the detection (gloo: a GPU node without NCCL).
# Idempotent: same key installed -> nothing to do (<1 s); cached wheel -> pip install (seconds);
# otherwise a ~6 minute build on 2 cores. The key is Horovod x nbdist's patch level x collectives
# x TensorFlow x Python version: the extension links against one TensorFlow's C++ ABI, and a
# wheel built before a patch, or without NCCL, must never be taken for a newer key.
set -euo pipefail

HVD_VERSION=0.28.1
# nbdist's patches to the sdist, applied in the build's temp dir (never committed). Bump the level
# when they change: it is in the cache key and in the wheel's horovod/metadata.json
# ("nbdist_build"), where nbdist.modes.sync.rank reads whether HOROVOD_GLOO_IFACE is honoured.
#   p1: the process-set Gloo context uses the global context's interface (HOROVOD_GLOO_IFACE)
#       instead of the address the host's name resolves to (127.0.0.1, or nothing, in many labs).
PATCH_LEVEL=p1
PLAN=0
if [ "${1:-}" = --plan ]; then PLAN=1; shift; fi
USAGE="usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR (or --plan PYTHON)"
PY=${1:?$USAGE}
CACHE_ROOT=${2:-}
[ "$PLAN" = 1 ] || [ -n "$CACHE_ROOT" ] || { echo "horovod: ERROR: no WHEEL_CACHE_DIR. $USAGE" >&2; exit 1; }
export TF_CPP_MIN_LOG_LEVEL=2   # keep TensorFlow's start-up chatter out of our output

say() { echo "horovod: $*"; }
fail() { echo "horovod: ERROR: $*" >&2; exit 1; }

"$PY" -c 'import sys' 2>/dev/null || fail "'$PY' is not a working Python interpreter"

# TF version from package metadata (no slow `import tensorflow`): tensorflow-cpu or tensorflow.
TF_VERSION=$("$PY" - <<'EOF'
import importlib.metadata as md
dists = md.packages_distributions().get("tensorflow") or []
print(md.version(dists[0]) if dists else "")
EOF
)
[ -n "$TF_VERSION" ] || fail "TensorFlow is not installed in $PY; install nbdist first (make install)"
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

# nccl when this node has an NVIDIA GPU (nvidia-smi lists one), nvcc and NCCL's header; gloo
# without a GPU. A GPU without the toolkit or NCCL is an error that says what to install.
nccl_header() {
  local d
  for d in "${HOROVOD_NCCL_INCLUDE:-}" "${HOROVOD_NCCL_HOME:+$HOROVOD_NCCL_HOME/include}" \
           "${CUDA_HOME:-/usr/local/cuda}/include" /usr/include /usr/local/include; do
    [ -n "$d" ] && [ -f "$d/nccl.h" ] && { echo "$d/nccl.h"; return 0; }
  done
  return 1
}
collectives() {
  case "${NBDIST_HOROVOD_OPS:-auto}" in
    gloo|nccl) echo "$NBDIST_HOROVOD_OPS"; return 0 ;;
    auto) ;;
    *) fail "NBDIST_HOROVOD_OPS must be gloo, nccl or unset (auto). Received: '$NBDIST_HOROVOD_OPS'" ;;
  esac
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [ "${gpus:-0}" = 0 ]; then echo gloo; return 0; fi
  command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] ||
    fail "this node has $gpus NVIDIA GPU(s) but no CUDA toolkit (nvcc not on PATH nor in \${CUDA_HOME:-/usr/local/cuda}/bin).
  Install the CUDA toolkit matching TensorFlow $TF_VERSION and set CUDA_HOME, or build without
  NCCL (GPU tensors then reduce through Gloo on the CPU): NBDIST_HOROVOD_OPS=gloo make horovod"
  nccl_header >/dev/null ||
    fail "this node has $gpus NVIDIA GPU(s) and nvcc, but no nccl.h (looked in HOROVOD_NCCL_INCLUDE,
  HOROVOD_NCCL_HOME/include, \$CUDA_HOME/include, /usr/include, /usr/local/include).
  Install NCCL (e.g. apt-get install libnccl-dev from NVIDIA's repository) or set HOROVOD_NCCL_HOME,
  or build without NCCL: NBDIST_HOROVOD_OPS=gloo make horovod"
  echo nccl
}
OPS=$(collectives)
KEY="hvd${HVD_VERSION}-nbdist${PATCH_LEVEL}-${OPS}-tf${TF_VERSION}-${PY_TAG}"
if [ "$PLAN" = 1 ]; then echo "$KEY"; exit 0; fi
CACHE="$CACHE_ROOT/$KEY"
LOG="$CACHE/build.log"

step() {  # step DESCRIPTION CMD...: run CMD with output to the log; on failure show its tail
  say "$1"; shift
  if ! "$@" >>"$LOG" 2>&1; then
    echo "---- last 40 lines of $LOG ----" >&2; tail -n 40 "$LOG" >&2
    fail "'$*' failed (full log: $LOG). Fix the cause and rerun; rm -rf '$CACHE' to start clean."
  fi
}

# Key of the installed horovod (TF version and nbdist's build from its metadata.json, written at
# build time; a wheel built without nbdist's patches has no "nbdist_build"), or "".
installed_key() {
  "$PY" - <<'EOF' 2>/dev/null || true
import json, os, sys, horovod  # the bare package is cheap: it does not import TensorFlow
meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))
build = meta.get("nbdist_build", "unpatched")
print(f"hvd{horovod.__version__}-nbdist{build}-tf{meta['tensorflow']}-cp{sys.version_info[0]}{sys.version_info[1]}")
EOF
}

# hvd.init() in a single process exercises the compiled op library and the Gloo controller.
# -X faulthandler: a crash in the C++ extension (exit 139) still shows where it happened.
verify() {
  local out rc=0
  out=$("$PY" -X faulthandler -c 'import horovod.tensorflow as hvd; hvd.init(); assert hvd.size() == 1, hvd.size(); print(hvd.size())' 2>&1) || rc=$?
  if [ "$rc" != 0 ]; then
    echo "$out" | sed "/^Extension modules:/d" | tail -n 20 >&2
    # Uninstall again so that a rerun cannot take the "already installed" fast path.
    "$PY" -m pip uninstall -q -y horovod >/dev/null 2>&1 || true
    fail "'import horovod.tensorflow as hvd; hvd.init()' failed (exit code $rc) in $PY, key $KEY;
  horovod was uninstalled again. To rebuild from scratch: rm -rf '$CACHE' and rerun this step."
  fi
}

# Fast path (every `make test`): skip the ~5 s hvd.init() check, it passed when this was installed.
if [ "$(installed_key)" = "$KEY" ]; then
  say "$KEY already installed in $PY; nothing to do"
  exit 0
fi

mkdir -p "$CACHE"
# Two concurrent `make` runs must not build into the same cache folder at once.
if command -v flock >/dev/null; then exec 9>"$CACHE/.lock"; flock 9; fi

wheel=$(find "$CACHE" -maxdepth 1 -name "horovod-$HVD_VERSION-*.whl" | head -n 1)
if [ -z "$wheel" ]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/nbdist-horovod.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  : >"$LOG"
  step "downloading horovod==$HVD_VERSION sdist" \
    "$PY" -m pip download --no-binary :all: --no-deps "horovod==$HVD_VERSION" -d "$WORK"
  tar -xzf "$WORK/horovod-$HVD_VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/horovod-$HVD_VERSION"

  say "patching the sdist ($PATCH_LEVEL, in $WORK)"
  "$PY" - "$SRC" "$PATCH_LEVEL-$OPS" <<'EOF' || fail "could not patch horovod $HVD_VERSION's sdist (see above)"
import pathlib, sys
src, build = pathlib.Path(sys.argv[1]), sys.argv[2]
def patch(path, old, new):
    """Replace `old` (which must occur exactly once) by `new` in src/path."""
    f = src / path
    text = f.read_text()
    if text.count(old) != 1:
        sys.exit(f"{path}: expected the text {old!r} once, found it {text.count(old)} times")
    f.write_text(text.replace(old, new))
# xla_mpi_ops.cc (XLA ops for MPI, unused here) includes XLA headers the TensorFlow wheels lack.
patch("horovod/tensorflow/CMakeLists.txt",
      'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n', "")
# p1: process sets (hvd.init() makes the global one) bind HOROVOD_GLOO_IFACE, as the global
# context does, not the address of the host's name.
patch("horovod/common/gloo/gloo_context.cc",
      "  attr device_attr;\n  device_attr.iface = gloo_iface_;\n  device_attr.ai_family = AF_UNSPEC;\n"
      "  auto dev = CreateDevice(device_attr);\n\n  global_ctx = global_context.ctx;",
      "  gloo_iface_ = global_context.gloo_iface_;  // nbdist p1\n"
      "  attr device_attr;\n  device_attr.iface = gloo_iface_;\n  device_attr.ai_family = AF_UNSPEC;\n"
      "  auto dev = CreateDevice(device_attr);\n\n  global_ctx = global_context.ctx;")
# The marker nbdist.modes.sync.rank reads from the installed horovod/metadata.json.
patch("CMakeLists.txt", '"\\"dummy\\": \\"none\\"\\n}"',
      f'"\\"nbdist_build\\": \\"{build}\\",\\n\\"dummy\\": \\"none\\"\\n}}"')
EOF

  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo
  if [ "$OPS" = nccl ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
    HOROVOD_NCCL_INCLUDE=$(dirname "$(nccl_header)"); export HOROVOD_NCCL_INCLUDE
    [ -z "${CUDA_HOME:-}" ] || export HOROVOD_CUDA_HOME="$CUDA_HOME"
  else
    unset HOROVOD_GPU_OPERATIONS   # one set in the caller's shell must not ask for CUDA here
  fi
  export MAKEFLAGS=-j2
  # Horovod's old cmake_minimum_required() is rejected by CMake >= 4 unless told otherwise.
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  # No build isolation: CMake imports this venv's TensorFlow to find its headers and ABI flags.
  step "building the wheel (about 6 minutes on 2 cores; log: $LOG)" \
    "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$WORK/dist" "$SRC"
  built=$(ls "$WORK"/dist/horovod-*.whl)
  mv "$built" "$CACHE/"   # only a finished wheel ever lands in the cache
  wheel="$CACHE/$(basename "$built")"
  say "cached $wheel"
else
  say "using cached wheel $wheel"
fi

# Reinstall explicitly: pip would keep an installed horovod==$HVD_VERSION built for another TF.
"$PY" -m pip uninstall -q -y horovod >/dev/null 2>&1 || true
step "installing $(basename "$wheel")" "$PY" -m pip install "$wheel"
verify
say "installed and verified $KEY (hvd.init() ok)"
