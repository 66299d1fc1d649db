#!/bin/bash
# Installs what Tessera needs on Debian 12 (as root), from Debian's archive only: nothing else is
# downloaded, ever (the build is offline).
#
#   bash tools/setup.sh          README command 1 (tools/demo.sh): what building and running
#                                Tessera needs: Bazel, gcc, MPI, protobuf, abseil, the tokenizer,
#                                server and metrics libraries, OpenBLAS.
#   bash tools/setup.sh --test   README command 2 (.ci/run): that, and what only the tests need:
#                                GoogleTest/GoogleMock, promtool, a one-node Slurm (slurmctld,
#                                slurmd, munge), clang-14 for the fuzzers, clang-format, python3
#                                with jsonschema, Node.js for the openai client, curl, bc, ...
#
# CUDA is neither installed nor needed: the CUDA backend is built where the toolkit is found
# ($TESSERA_CUDA_PATH, else $CUDA_PATH, else /usr/local/cuda; third_party/cuda_configure.bzl),
# and a build without it runs on the CPU, `--device cuda` saying it was built without CUDA. The
# note at the end says which build this machine gets.
#
# No daemon is enabled as a service. Some test packages ship one (prometheus, slurmctld, slurmd,
# munge) that Debian's maintainer scripts would start at once and enable at boot; the tests start
# their own instances when they need them. So packages are installed with a policy-rc.d that
# forbids starting any service (exit 101, as Docker images have it), and the units of the
# packages this run installed are then disabled (their links in /etc/systemd/system/*.wants/
# removed, and `systemctl disable` where systemd runs). An upgrade does not enable them again:
# the packages' postinst re-enables a unit only if deb-systemd-helper finds its links in place.
# Units of packages that were installed before this run are left as they are (someone may run
# them on purpose); the script names those that are enabled.
set -euo pipefail

usage() {
  echo "usage: tools/setup.sh [--test]" >&2
  exit 2
}
with_tests=0
case "${1:-}" in
  "") ;;
  --test) with_tests=1 ;;
  *) usage ;;
esac
(($# <= 1)) || usage

# Building and running (README command 1).
packages=(
  bazel-bootstrap bazel-rules-java bazel-rules-proto bazel-skylib
  build-essential
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  libsentencepiece-dev
  libpcre2-dev libutf8proc-dev
  libopenblas-dev
  nlohmann-json3-dev
  libcpp-httplib-dev
  prometheus-cpp-dev  # /metrics (runtime/serve)
  libbenchmark-dev    # the benchmark binaries (kernels/cpu, runtime/text), not only tests
)
# Only the tests (README command 2).
test_packages=(
  libgtest-dev libgmock-dev
  prometheus                           # promtool (metrics_promtool_test, serve_test)
  slurmctld slurmd slurm-client munge  # tests/slurm_test.sh starts its own one-node cluster
  clang-14 libclang-rt-14-dev          # tools/fuzz/run.sh: libFuzzer + ASan/UBSan (clang)
  clang-format
  python3 python3-jsonschema           # test scripts; JSON-schema validation of outputs
  nodejs                               # the official openai client (tests/serve_test.sh)
  curl bc procps iproute2              # the sh_tests' tools (iproute2: multihost_test's netns)
)
# The systemd units the test packages would enable (see the header).
daemon_units=(prometheus.service slurmctld.service slurmd.service munge.service)

if ((with_tests)); then packages+=("${test_packages[@]}"); fi

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done

policy=/usr/sbin/policy-rc.d
policy_backup=""
# Puts back the policy-rc.d that was there before (or none).
restore_policy() {
  if [[ -n "$policy_backup" ]]; then
    mv -f "$policy_backup" "$policy"
  else
    rm -f "$policy"
  fi
}

if ((${#missing[@]})); then
  echo "tools/setup.sh: installing ${missing[*]}"
  if [[ -e "$policy" ]]; then
    policy_backup=$(mktemp "$policy.tessera-XXXXXX")
    cp -p "$policy" "$policy_backup"
  fi
  trap restore_policy EXIT
  # invoke-rc.d and deb-systemd-invoke ask this before starting a service: 101 is "no".
  printf '#!/bin/sh\n# tools/setup.sh: no service starts while it installs packages.\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  restore_policy
  trap - EXIT
  # Disable the units of the packages just installed (they were enabled, not started).
  for unit in "${daemon_units[@]}"; do
    pkg=${unit%.service}
    [[ " ${missing[*]} " == *" $pkg "* ]] || continue
    # Where systemd runs (not in most containers) it is told; the links go either way.
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
      systemctl disable --now "$unit" >/dev/null 2>&1 || true
    fi
    rm -f /etc/systemd/system/*.wants/"$unit"
  done
fi

enabled=()
for unit in "${daemon_units[@]}"; do
  compgen -G "/etc/systemd/system/*.wants/$unit" >/dev/null && enabled+=("$unit")
done
if ((with_tests && ${#enabled[@]})); then
  echo "tools/setup.sh: note: ${enabled[*]} enabled as services before this setup; left as" \
    "they are (Tessera needs none: \`systemctl disable UNIT\`, or removing its link in" \
    "/etc/systemd/system/multi-user.target.wants/, turns one off)"
fi

# The CUDA toolkit the build will look for (third_party/cuda_configure.bzl): a note, never an
# error; without it the CPU backend alone is built.
cuda=${TESSERA_CUDA_PATH:-${CUDA_PATH:-/usr/local/cuda}}
if [[ -x "$cuda/bin/nvcc" ]]; then
  echo "tools/setup.sh: CUDA toolkit at $cuda: the CUDA backend (--device cuda) is built too"
else
  echo "tools/setup.sh: note: no CUDA toolkit at $cuda (no bin/nvcc): Tessera builds for the" \
    "CPU only; install CUDA 13 with cuBLAS and NCCL (or set TESSERA_CUDA_PATH) for --device cuda"
fi
