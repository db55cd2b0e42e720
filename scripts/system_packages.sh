#!/usr/bin/env bash
# Debian packages nbdist needs: the Fashion-MNIST IDX files (nbdist.datasets reads them offline)
# a C++ toolchain with CMake for the Horovod build, and Chromium for the browser test of the
# dashboard (Playwright drives it; it never downloads a browser), and for real clusters: iproute2
# (the lab network of namespaces in the tests), Slurm with munge, and Open MPI (engines started
# by sbatch or mpiexec; mpi4py loads Open MPI's library). Idempotent; skips politely without apt-get.
set -euo pipefail
need=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
[ -x /usr/lib/chromium/chromium ] || need+=(chromium)
command -v ip >/dev/null && command -v tc >/dev/null || need+=(iproute2)
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
command -v mpiexec >/dev/null || need+=(openmpi-bin)
[ -f /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || need+=(libopenmpi-dev)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "nbdist: please install these Debian packages yourself: ${need[*]}" >&2
  echo "        (sudo apt-get install ${need[*]}); or set NBDIST_DATA to a folder with the Fashion-MNIST IDX files." >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}"
