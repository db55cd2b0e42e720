#!/usr/bin/env bash
# Build Horovod (TensorFlow + Gloo, CPU only) from its PyPI sdist once, cache the wheel, install it.
# Usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR      (the Makefile's `make horovod` step)
# Idempotent: same key installed -> nothing to do (<1 s); cached wheel -> pip install (seconds);
# otherwise a ~6 minute build on 2 cores. The key is Horovod x TensorFlow x Python version,
# because the extension links against one TensorFlow's C++ ABI.
set -euo pipefail

HVD_VERSION=0.28.1
PY=${1:?usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR}
CACHE_ROOT=${2:?usage: build_horovod.sh PYTHON WHEEL_CACHE_DIR}
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
KEY="hvd${HVD_VERSION}-tf${TF_VERSION}-${PY_TAG}"
CACHE="$CACHE_ROOT/$KEY"
LOG="$CACHE/build.log"

step() {  # step DESCRIPTION CMD...: run CMD with output to the log; on failure show its tail
  say "$1"; shift
  if ! "$@" >>"$LOG" 2>&1; then
    echo "---- last 40 lines of $LOG ----" >&2; tail -n 40 "$LOG" >&2
    fail "'$*' failed (full log: $LOG). Fix the cause and rerun; rm -rf '$CACHE' to start clean."
  fi
}

# Key of the installed horovod (TF version from its metadata.json, written at build time), or "".
installed_key() {
  "$PY" - <<'EOF' 2>/dev/null || true
import json, os, sys, horovod  # the bare package is cheap: it does not import TensorFlow
meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))
print(f"hvd{horovod.__version__}-tf{meta['tensorflow']}-cp{sys.version_info[0]}{sys.version_info[1]}")
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

  # xla_mpi_ops.cc is GPU-only content but includes XLA headers the tensorflow-cpu wheel lacks:
  # drop it from the TensorFlow source list (patched in $WORK, never in the repo).
  sed -i '/xla_mpi_ops\.cc/d' "$SRC/horovod/tensorflow/CMakeLists.txt"
  ! grep -q xla_mpi_ops "$SRC/horovod/tensorflow/CMakeLists.txt" || fail "could not patch out xla_mpi_ops.cc"

  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo
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
