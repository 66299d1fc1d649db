#!/bin/bash
# Load time, decode speed and control-plane cost of the demo checkpoint at -np 1, 2 and 4 on
# this machine (CPU, MPI). Prints the median of RUNS runs for each layout.
#   tools/bench_parallel_cpu.sh [MODEL_DIR] [RUNS]
set -u
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K}
runs=${2:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bin=bazel-bin/launch/tessera
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-22s %10s %12s %14s %14s %12s\n' layout load_s prefill_ms decode_tok/s plan_bytes bcast_us
for layout in "1" "2 --tp 2" "2 --pp 2" "4 --tp 2 --pp 2" "4 --tp 4"; do
  set -- $layout
  np=$1
  shift
  : >/tmp/bench_par.txt
  for _ in $(seq "$runs"); do
    timeout 120 mpirun -np "$np" --bind-to none "$bin" generate --model "$model" \
      --prompt "Once upon a time" --temperature 0 --max-tokens 200 --ignore-eos --output json \
      "$@" 2>&1 >/dev/null | tr '\n' ' ' >>/tmp/bench_par.txt
    echo >>/tmp/bench_par.txt
  done
  load=$(grep -o 'loaded in [0-9.]*' /tmp/bench_par.txt | awk '{print $3}' | median)
  prefill=$(grep -o 'prompt 5 tokens in [0-9.]*' /tmp/bench_par.txt | awk '{print $5}' | median)
  decode=$(grep -o '[0-9.]* tokens/s decode' /tmp/bench_par.txt | awk '{print $1}' | median)
  bytes=$(grep -o '[0-9.]* plan bytes' /tmp/bench_par.txt | awk '{print $1}' | median)
  bcast=$(grep -o 'broadcast [0-9.]* us' /tmp/bench_par.txt | awk '{print $2}' | median)
  printf '%-22s %10s %12s %14s %14s %12s\n' "-np $layout" "${load:--}" "$prefill" "$decode" \
    "${bytes:--}" "${bcast:--}"
done
