#!/usr/bin/env bash
# The fp8 rows of docs/PERFORMANCE.md (issue 20), on the GPU machine (carry .carry/gpu, made by
# tools/gpu_build.sh): the Llama-3-8B shape with random weights, bf16 and `--quantization fp8`
# side by side in one run (batch-1 decode, batch-64 decode, 128 in / 128 out at full load, P01:
# batch 64 × 4096 in × 256 out), the fp8 KV cache's capacity beside bf16's, and the fp8 and bf16
# products of gemm_bench. One JSON line per row in $OUT/fp8.jsonl. ROWS_ONLY="label ..." runs
# only those rows; DEADLINE (epoch seconds) skips what would start after it.
set -uo pipefail
[ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
[ -d .carry/gpu/bin ] || tar -C .carry/gpu -xJf .carry/gpu/bin.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
BIN=.carry/gpu/bin
OUT=${OUT:-/tmp/gpu_fp8}
mkdir -p "$OUT"
ROWS=$OUT/fp8.jsonl
: >"$ROWS"
W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
DEADLINE=${DEADLINE:-$(($(date +%s) + 3600))}
late() { [ "$(date +%s)" -ge "$DEADLINE" ] && echo "SKIPPED (deadline): $1" && return 0; return 1; }
source "$(dirname "$0")/bench_rows.sh"
bench_configs
want() { [ -z "${ROWS_ONLY:-}" ] || [[ " $ROWS_ONLY " == *" $1 "* ]]; }

if [ -x "$BIN/gemm_bench" ] && want gemm; then
  timeout 120 "$BIN/gemm_bench" --benchmark_min_time=0.05 \
    --benchmark_filter="${GEMM_FILTER:-Copy|Fp8|/1/|/64/|/4096/}" --benchmark_counters_tabular=true \
    >"$OUT/gemm_bench.txt" 2>&1 || echo "gemm_bench failed"
  grep -vE "^-|^Run|^\*\*\*" "$OUT/gemm_bench.txt" | head -60
fi
for q in bf16 fp8; do
  flags=()
  [ "$q" = fp8 ] && flags=(--quantization fp8)
  want "b1-$q" && row "b1-$q" llama-8b 4096 --batch-size 1 --input-len 32 --output-len 256 \
    --iterations 3 --max-num-seqs 1 "${flags[@]}"
  want "b64-$q" && row "b64-$q" llama-8b 1024 --batch-size 64 --input-len 512 --output-len 256 \
    --iterations 2 --max-num-seqs 64 "${flags[@]}"
  for b in 256 512; do
    want "c128-$b-$q" && row "c128-$b-$q" llama-8b 256 --batch-size "$b" --input-len 128 \
      --output-len 128 --iterations 2 --max-num-seqs "$b" --max-num-batched-tokens 8192 "${flags[@]}"
  done
  want "p01-$q" && row "p01-$q" llama-8b 4352 --batch-size 64 --input-len 4096 --output-len 256 \
    --iterations 1 --max-num-seqs 64 "${flags[@]}"
  # The KV cache's capacity (the startup summary's tokens) with the same bf16 weights: bf16
  # against fp8 entries.
  # --max-num-seqs 256 so that the pool is what the default fraction of free memory holds, not
  # capped at one context.
  want "kv-$q" && row "kv-$q" llama-8b 4096 --batch-size 1 --input-len 32 --output-len 8 \
    --iterations 1 --max-num-seqs 256 --kv-dtype "$([ "$q" = fp8 ] && echo fp8 || echo bfloat16)"
done
# fp8 weights and an fp8 KV cache together: batch-64 decode and P01.
want b64-fp8-kvfp8 && row b64-fp8-kvfp8 llama-8b 1024 --batch-size 64 --input-len 512 \
  --output-len 256 --iterations 2 --max-num-seqs 64 --quantization fp8 --kv-dtype fp8
want p01-fp8-kvfp8 && row p01-fp8-kvfp8 llama-8b 4352 --batch-size 64 --input-len 4096 \
  --output-len 256 --iterations 1 --max-num-seqs 64 --quantization fp8 --kv-dtype fp8
rm -rf "$W"
