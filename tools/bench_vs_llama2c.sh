#!/usr/bin/env bash
# Reproduces the CPU comparison in docs/PERFORMANCE.md: tessera against
# Karpathy's llama2.c run.c on the stories260K checkpoint, greedy, 256 positions.
#
# Usage:
#   tools/bench_vs_llama2c.sh LLAMA2C_DIR [MODEL_DIR] [RUNS]
#
#   LLAMA2C_DIR  a folder holding llama2.c's run.c (fetched by you; it is not
#                part of this repository) and the exported model files
#                stories260K.bin and tok512.bin (tools/export_llama2c.py).
#                Override the file names with LLAMA2C_MODEL / LLAMA2C_TOK.
#   MODEL_DIR    the Hugging Face folder tessera reads
#                (default ../shared/models/stories260K)
#   RUNS         interleaved rounds for the engine-reported rates (default 9;
#                medians reported). Whole-process times: hyperfine, 3 rounds of
#                10 runs per command, interleaved (else date +%s%N, 30 runs).
#
# run.c is compiled into a temporary folder like its Makefile's targets:
#   runfast: gcc -Ofast -o run run.c -lm
#   runomp:  gcc -Ofast -fopenmp -march=native -o runomp run.c -lm
# Set SKIP_BUILD=1 to reuse an existing bazel-bin/launch/tessera, or
# TESSERA=/path/to/tessera to measure that binary (no build).
# Other work on the machine skews the numbers: the load average is printed.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'
  exit 2
fi
L2C_DIR=$(cd "$1" && pwd)
MODEL_DIR=${2:-../shared/models/stories260K}
RUNS=${3:-9}
L2C_MODEL=${LLAMA2C_MODEL:-$L2C_DIR/stories260K.bin}
L2C_TOK=${LLAMA2C_TOK:-$L2C_DIR/tok512.bin}
PROMPT="Once upon a time"
STEPS=256                        # positions incl. BOS and prompt (run.c -n)
PROMPT_LEN=5                     # BOS + 4 prompt tokens with this tokenizer
GEN=$((STEPS - PROMPT_LEN + 1))  # tessera tokens that use the same 256 positions

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
for f in "$L2C_DIR/run.c" "$L2C_MODEL" "$L2C_TOK"; do
  [[ -f $f ]] || { echo "missing $f" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "needs python3 (for medians)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- builds -------------------------------------------------------------------
gcc -Ofast -o "$WORK/run" "$L2C_DIR/run.c" -lm
gcc -Ofast -fopenmp -march=native -o "$WORK/runomp" "$L2C_DIR/run.c" -lm
ORIGIN="given by TESSERA"
if [[ -z ${TESSERA:-} ]]; then
  ORIGIN="built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' plus local changes')"
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    bazel build //launch:tessera >/dev/null 2>&1 || bazel build //launch:tessera
  fi
  TESSERA=$REPO/bazel-bin/launch/tessera
fi
[[ -x $TESSERA ]] || { echo "no tessera binary at $TESSERA" >&2; exit 1; }

# --- helpers (all run under the environment in the global array E) -------------
ONE=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
DEF=(env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS)
E=("${ONE[@]}")

median() {
  python3 -c 'import sys,statistics as s; print("%.1f" % s.median(float(x) for x in sys.argv[1:]))' "$@"
}
tess_gen() {  # max_tokens
  "${E[@]}" "$TESSERA" generate --model "$MODEL_DIR" --prompt "$PROMPT" --temperature 0 \
    --max-tokens "$1"
}
l2c() {  # binary steps
  "${E[@]}" "$WORK/$1" "$L2C_MODEL" -z "$L2C_TOK" -t 0 -n "$2" -i "$PROMPT"
}
# One value from a file: the engines' own reports (parsed after the process
# ended, so no parser runs beside a measurement on this 2-CPU machine).
bench_field() {  # file key
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
gen_rate() { sed -n 's/.*, \([0-9.]*\) tokens\/s decode.*/\1/p' "$1"; }
l2c_rate() { sed -n 's/achieved tok\/s: //p' "$1"; }
ratio() { python3 -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$@"; }

# Median whole-process wall times in ms of several commands (each given as one
# string), measured interleaved: ROUNDS rounds of 10 runs of each command.
wall_ms() {
  local rounds=3
  if command -v hyperfine >/dev/null; then
    for r in $(seq "$rounds"); do
      "${E[@]}" hyperfine -N --warmup 2 --runs 10 --output=null \
        --export-json "$WORK/hf$r.json" "$@" >/dev/null 2>&1
    done
    python3 - "$rounds" "$WORK" <<'PY'
import json, statistics, sys
rounds, work = int(sys.argv[1]), sys.argv[2]
times = None
for r in range(1, rounds + 1):
    res = json.load(open(f"{work}/hf{r}.json"))["results"]
    times = times or [[] for _ in res]
    for i, x in enumerate(res):
        times[i] += x["times"]
print(" ".join("%.2f" % (statistics.median(t) * 1e3) for t in times))
PY
  else
    local n=$# i t0 t1
    local -a cmds=("$@") all=()
    for _ in $(seq $((rounds * 10))); do
      for ((i = 0; i < n; i++)); do
        t0=$(date +%s%N); eval "${E[*]} ${cmds[i]}" >/dev/null 2>&1; t1=$(date +%s%N)
        all+=("$i:$(( (t1 - t0) / 1000 ))")
      done
    done
    python3 - "$n" "${all[@]}" <<'PY'
import statistics, sys
n = int(sys.argv[1]); t = [[] for _ in range(n)]
for x in sys.argv[2:]:
    i, us = x.split(":"); t[int(i)].append(int(us))
print(" ".join("%.2f" % (statistics.median(v) / 1e3) for v in t))
PY
  fi
}
rate() {  # positions ms_short ms_full -> positions per second of the difference
  python3 -c 'import sys; n,a,b=map(float,sys.argv[1:]); print("%.0f" % (n/(b-a)*1e3))' "$@"
}

# --- correctness: same greedy text ---------------------------------------------
tess_gen "$GEN" >"$WORK/tessera.txt" 2>/dev/null
l2c run "$STEPS" >"$WORK/run.txt" 2>/dev/null
if cmp -s "$WORK/tessera.txt" "$WORK/run.txt"; then
  SAME="identical ($(wc -c <"$WORK/run.txt") bytes)"
else
  SAME="DIFFERENT"; diff "$WORK/tessera.txt" "$WORK/run.txt" >&2 || true
fi

# --- measurements ---------------------------------------------------------------
echo "date:    $(date +%F)"
echo "cpu:     $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)," \
     "family $(sed -n 's/^cpu family\s*: //p' /proc/cpuinfo | head -1)" \
     "model $(sed -n 's/^model\s*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs"
echo "gcc:     $(gcc -dumpfullversion); $(hyperfine --version 2>/dev/null || echo 'no hyperfine')"
echo "tessera: $TESSERA ($ORIGIN)"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) at start"
echo "greedy text, tessera --max-tokens $GEN vs run.c -n $STEPS: $SAME"
echo

for mode in single default; do
  if [[ $mode == single ]]; then E=("${ONE[@]}"); L2C=run; else E=("${DEF[@]}"); L2C=runomp; fi
  echo "== $mode-threaded (environment: ${E[*]}; llama2.c binary: $L2C)"
  # Engine-reported rates, interleaved over RUNS rounds; medians over rounds.
  b5=() b5p=() b128=() b128p=() g=() l=() l1=()
  for r in $(seq "$RUNS"); do
    "${E[@]}" "$TESSERA" bench --model "$MODEL_DIR" --batch-size 1 --input-len "$PROMPT_LEN" \
      --output-len "$GEN" --iterations 5 --json >"$WORK/b5.json"
    "${E[@]}" "$TESSERA" bench --model "$MODEL_DIR" --batch-size 1 --input-len 128 \
      --output-len 128 --iterations 5 --json >"$WORK/b128.json"
    tess_gen "$GEN" >/dev/null 2>"$WORK/gen.err"
    l2c "$L2C" "$STEPS" >/dev/null 2>"$WORK/l2c.err"
    b5+=("$(bench_field "$WORK/b5.json" decode_tokens_per_s)")
    b5p+=("$(bench_field "$WORK/b5.json" prefill_tokens_per_s)")
    b128+=("$(bench_field "$WORK/b128.json" decode_tokens_per_s)")
    b128p+=("$(bench_field "$WORK/b128.json" prefill_tokens_per_s)")
    g+=("$(gen_rate "$WORK/gen.err")")
    l+=("$(l2c_rate "$WORK/l2c.err")")
    if [[ $mode == single ]]; then
      l2c runomp "$STEPS" >/dev/null 2>"$WORK/l2c1.err"
      l1+=("$(l2c_rate "$WORK/l2c1.err")")
    fi
  done
  bd=$(median "${b5[@]}"); ld=$(median "${l[@]}")
  echo "tessera bench --input-len $PROMPT_LEN --output-len $GEN: decode $bd tok/s, prefill $(median "${b5p[@]}") tok/s"
  echo "tessera bench --input-len 128 --output-len 128: decode $(median "${b128[@]}") tok/s, prefill $(median "${b128p[@]}") tok/s"
  echo "tessera generate --max-tokens $GEN (its stderr decode rate): $(median "${g[@]}") tok/s"
  echo "llama2.c $L2C -n $STEPS (achieved tok/s): $ld tok/s"
  if [[ $mode == single ]]; then
    echo "llama2.c runomp -n $STEPS with OMP_NUM_THREADS=1 (achieved tok/s): $(median "${l1[@]}") tok/s"
  fi
  echo "ratio tessera bench decode / llama2.c achieved: $(ratio "$bd" "$ld")"
  # Whole processes. The prompt-only runs cover positions 0..4, so the
  # differences time exactly positions 5..255 in both engines.
  read -r tf ts lf ls <<<"$(wall_ms \
    "$(printf '%q ' "$TESSERA" generate --model "$MODEL_DIR" --prompt "$PROMPT" --temperature 0 --max-tokens "$GEN")" \
    "$(printf '%q ' "$TESSERA" generate --model "$MODEL_DIR" --prompt "$PROMPT" --temperature 0 --max-tokens 1)" \
    "$(printf '%q ' "$WORK/$L2C" "$L2C_MODEL" -z "$L2C_TOK" -t 0 -n "$STEPS" -i "$PROMPT")" \
    "$(printf '%q ' "$WORK/$L2C" "$L2C_MODEL" -z "$L2C_TOK" -t 0 -n "$PROMPT_LEN" -i "$PROMPT")")"
  tr_=$(rate $((STEPS - PROMPT_LEN)) "$ts" "$tf"); lr=$(rate $((STEPS - PROMPT_LEN)) "$ls" "$lf")
  echo "whole process, $STEPS positions: tessera $tf ms, llama2.c $lf ms (ratio llama2.c/tessera $(ratio "$lf" "$tf"))"
  echo "whole process, prompt only:     tessera $ts ms (--max-tokens 1), llama2.c $ls ms (-n $PROMPT_LEN)"
  echo "difference = the $((STEPS - PROMPT_LEN)) positions $PROMPT_LEN..$((STEPS - 1)):" \
       "tessera $tr_ tok/s, llama2.c $lr tok/s (ratio $(ratio "$tr_" "$lr"))"
  echo
done
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) at end"
