#!/usr/bin/env bash
# The roofline rows of docs/PERFORMANCE.md, on the GPU machine (carry .carry/gpu, made by
# tools/gpu_build.sh): `tessera bench --random-weights` on the Llama-3-8B and Qwen3-0.6B shapes
# of ../shared/bench/hf_baseline.py (the same configs, written here as config.json alone), the
# card's copy bandwidth and the decode-shaped products (gemm_bench), the kernel benchmarks, and,
# with LLAMACPP=DIR (a copy of ../shared/bench/llamacpp), llama.cpp on the same card; with
# HF=FILE (a copy of ../shared/bench/hf_baseline.py), transformers too. One JSON line per row in
# $OUT/roof.jsonl; logs beside it. DEADLINE (epoch seconds) skips what would start after it;
# GEMM_FILTER narrows gemm_bench (a Google Benchmark filter).
set -uo pipefail
[ -d .carry/gpu/lib ] || tar -C .carry/gpu -xJf .carry/gpu/lib.tar.xz
export LD_LIBRARY_PATH=$PWD/.carry/gpu/lib:${LD_LIBRARY_PATH:-}
BIN=.carry/gpu/bin
OUT=${OUT:-/tmp/gpu_roof}
mkdir -p "$OUT"
ROWS=$OUT/roof.jsonl
: >"$ROWS"
W=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader

source "$(dirname "$0")/bench_rows.sh"
bench_configs

DEADLINE=${DEADLINE:-$(($(date +%s) + 3600))}
late() { [ "$(date +%s)" -ge "$DEADLINE" ] && echo "SKIPPED (deadline): $1" && return 0; return 1; }
if [ -x "$BIN/gemm_bench" ]; then
  timeout 90 "$BIN/gemm_bench" --benchmark_min_time=0.1 --benchmark_filter="${GEMM_FILTER:-.}" --benchmark_counters_tabular=true \
    >"$OUT/gemm_bench.txt" 2>&1 || echo "gemm_bench failed"
  grep -E "Copy|Skinny|Cublas" "$OUT/gemm_bench.txt"
fi
if [ -x "$BIN/decode_attention_bench" ]; then
  timeout 60 "$BIN/decode_attention_bench" >"$OUT/decode_attention_bench.txt" 2>&1
  tail -15 "$OUT/decode_attention_bench.txt"
fi

row b1-8b llama-8b 4096 --batch-size 1 --input-len 32 --output-len 256 --iterations 3 --max-num-seqs 1
row b1-qwen3 qwen3-0.6b 4096 --batch-size 1 --input-len 32 --output-len 256 --iterations 3 --max-num-seqs 1
row b64-512-8b llama-8b 1024 --batch-size 64 --input-len 512 --output-len 256 --iterations 2 --max-num-seqs 64
row prefill-8x4096-8b llama-8b 4160 --batch-size 8 --input-len 4096 --output-len 1 --iterations 2 --max-num-seqs 8
row b1-8b-nographs llama-8b 4096 --batch-size 1 --input-len 32 --output-len 128 --iterations 2 --max-num-seqs 1 --no-graphs
row b1-qwen3-nographs qwen3-0.6b 4096 --batch-size 1 --input-len 32 --output-len 128 --iterations 2 --max-num-seqs 1 --no-graphs
row p01-8b llama-8b 4352 --batch-size 64 --input-len 4096 --output-len 256 --iterations 1 --max-num-seqs 64

if [ -n "${LLAMACPP:-}" ] && [ -d "$LLAMACPP" ] && ! late llamacpp; then
  OUT=$OUT/llamacpp LLAMACPP_DTYPES=bf16 LLAMACPP_NPL=1,64 LLAMACPP_REPS=2 timeout 200 \
    bash "$LLAMACPP/run_h200.sh" >"$OUT/llamacpp.log" 2>&1
  cat "$OUT/llamacpp/summary.md" 2>/dev/null | head -30
fi
if [ -n "${HF:-}" ] && [ -f "$HF" ] && ! late hf; then
  PYTHONUNBUFFERED=1 timeout "${HF_TIMEOUT:-300}" python3 "$HF" ${HF_MODELS:-llama-8b} \
    >"$OUT/hf.jsonl" 2>"$OUT/hf.err"
  cat "$OUT/hf.jsonl"
fi
rm -rf "$W"
