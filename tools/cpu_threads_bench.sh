#!/usr/bin/env bash
# CPU decode time per step of the tiny Qwen3 (real 151,936-row vocabulary,
# hidden 64, 2 layers) under the default threading and under explicit
# OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / OMP_WAIT_POLICY settings, at short
# and long contexts, batch 1 and 8. Prints a Markdown table: the median
# ms/step of each setting over ROUNDS rounds, the best setting and the ratio
# default / best (issue 14 asks for <= 1.3 everywhere).
#
#   tools/cpu_threads_bench.sh [ROUNDS=5]
#
# Self-contained: builds //launch:tessera (the default configuration, as
# bazel-bin/launch/tessera) unless SKIP_BUILD=1, and writes the tiny Qwen3
# with tools/make_tiny_qwen3.py into out/tiny-qwen3 (git-ignored) unless it
# is there. Settings are interleaved within each round (every setting of a
# case runs once per round, the order rotating), so a burst of load from
# elsewhere hits all of them alike; the 1-minute load average is printed with
# every round. Environment: CONTEXTS="16 1000 2000", BATCHES="1 8",
# OUTPUT_LEN=64, MODEL=DIR (skip the model build), BIN=PATH (another tessera
# binary, e.g. an older build to compare), SETTINGS="default omp1 ..." (a
# subset of the names below; default must be one).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
CONTEXTS=${CONTEXTS:-16 1000 2000}
BATCHES=${BATCHES:-1 8}
OUTPUT_LEN=${OUTPUT_LEN:-64}
if [[ -z "${MODEL:-}" ]]; then
  MODEL=out/tiny-qwen3
  [[ -f $MODEL/model.safetensors ]] || python3 tools/make_tiny_qwen3.py "$MODEL" >/dev/null
fi
if [[ -z "${BIN:-}" ]]; then
  [[ -n "${SKIP_BUILD:-}" ]] || bazel build //launch:tessera >/dev/null 2>&1
  BIN=bazel-bin/launch/tessera
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Name and environment of each setting. "default" clears every variable the
# libraries read, so the shell running the script cannot leak into it.
NAMES=(default omp1 omp2 blas1 omp1_blas1 omp1_blas2 omp2_blas1 passive active)
declare -A ENVS=(
  [default]=""
  [omp1]="OMP_NUM_THREADS=1"
  [omp2]="OMP_NUM_THREADS=2"
  [blas1]="OPENBLAS_NUM_THREADS=1"
  [omp1_blas1]="OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
  [omp1_blas2]="OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=2"
  [omp2_blas1]="OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1"
  [passive]="OMP_WAIT_POLICY=passive"
  [active]="OMP_WAIT_POLICY=active"
)
[[ -z "${SETTINGS:-}" ]] || read -r -a NAMES <<<"$SETTINGS"
CLEAR=(-u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS
  -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_PROC_BIND -u OMP_DYNAMIC)

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
  "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- kernels launch runtime || echo +dirty)," \
  "$(date -u +%Y-%m-%dT%H:%MZ)"
echo "command: tessera bench --model $MODEL --batch-size B --input-len I --output-len $OUTPUT_LEN --iterations 1 --json"
for ((round = 0; round < ROUNDS; ++round)); do
  echo "round $((round + 1))/$ROUNDS: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  for b in $BATCHES; do
    for i in $CONTEXTS; do
      n=${#NAMES[@]}
      for ((k = 0; k < n; ++k)); do
        name=${NAMES[(k + round) % n]}
        # shellcheck disable=SC2086
        out=$(env "${CLEAR[@]}" ${ENVS[$name]} "$BIN" bench --model "$MODEL" \
          --batch-size "$b" --input-len "$i" --output-len "$OUTPUT_LEN" \
          --iterations 1 --json 2>"$TMP/err") || {
          echo "bench failed ($name, batch $b, input $i):" >&2
          cat "$TMP/err" >&2
          exit 1
        }
        echo "$b $i $name $(cut -d' ' -f1 /proc/loadavg) $out" >>"$TMP/runs"
      done
    done
  done
done

python3 - "$TMP/runs" "$OUTPUT_LEN" "${NAMES[*]}" <<'EOF'
import json, statistics, sys
runs, output_len, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ms = {}
loads = []
for line in open(runs):
    b, i, name, load, js = line.split(" ", 4)
    j = json.loads(js)
    ms.setdefault((int(b), int(i)), {}).setdefault(name, []).append(
        j["decode_seconds"] * 1e3 / (output_len - 1))
    loads.append(float(load))
print("load average (1 min) during the runs: min %.2f, median %.2f, max %.2f"
      % (min(loads), statistics.median(loads), max(loads)))
print()
print("decode ms/step, median of %d rounds" % len(next(iter(ms.values()))["default"]))
print()
print("| batch | context | " + " | ".join(names) + " | best | default / best |")
print("|" + "---|" * (len(names) + 4))
worst = 0.0
for (b, i) in sorted(ms):
    med = {n: statistics.median(v) for n, v in ms[(b, i)].items()}
    best = min(med, key=med.get)
    ratio = med["default"] / med[best]
    worst = max(worst, ratio)
    print("| %d | %d | " % (b, i) + " | ".join("%.2f" % med[n] for n in names)
          + " | %s | %.2f |" % (best, ratio))
print()
print("worst default / best: %.2f" % worst)
EOF
