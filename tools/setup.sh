#!/bin/bash
# Installs everything Tessera needs on Debian 12 (as root): Bazel and the system libraries that
# third_party/ wraps. Nothing else is downloaded, ever: the build is offline.
# CUDA 13 and NCCL are expected under /usr/local/cuda (only to compile the CUDA kernels).
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java bazel-rules-proto bazel-skylib
  build-essential
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev
  libpcre2-dev libutf8proc-dev
  libopenblas-dev
  nlohmann-json3-dev
  libcpp-httplib-dev
  prometheus-cpp-dev
  prometheus
  slurmctld slurmd slurm-client munge  # tests/slurm_test.sh starts its own one-node cluster
  clang-format
  clang-14 libclang-rt-14-dev  # tools/fuzz/run.sh: libFuzzer + ASan/UBSan (clang)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tools/setup.sh: installing ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "tools/setup.sh: /usr/local/cuda/bin/nvcc not found; the CUDA kernels need CUDA 13" >&2
  exit 1
fi
