#!/bin/bash
# Runs on the GPU machine: Tessera's tokenizer_benchmark (carried in .carry/bench with the
# shared libraries the machine lacks) and Hugging Face tokenizers on the same corpus, one
# thread each, one after the other on the same CPU. Carry .carry/bench and .carry/gold.
set -uo pipefail
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1
corpus=tests/fixtures/tokenizer/bench_corpus.txt
lscpu | grep -E "Model name|^CPU\(s\)"
for tok in .carry/gold/qwen3 tests/fixtures/tokenizer/llama3_style; do
  echo "== $tok"
  LD_LIBRARY_PATH=.carry/bench/lib TESSERA_TOKENIZER_DIR=$tok TESSERA_CORPUS=$corpus \
    taskset -c 2 .carry/bench/tokenizer_benchmark --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true 2>&1 | grep -vE "^\*\*\*|^-+$"
  taskset -c 2 python3 tools/bench_tokenizers_hf.py "$tok" "$corpus"
done
