#!/bin/bash
# Runs on the GPU machine (which has transformers, tokenizers, sentencepiece): writes the
# tokenizer and chat-template goldens and the Hugging Face tokenizer speed figure into $OUT.
# Carry .carry/gold (copies of ../shared/tokenizers/{qwen3,llama2} and the demo tokenizer.model
# under .carry/gold/demo).
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
mkdir -p "$OUT/tok"
python3 tools/make_tokenizer_goldens.py --corpus tests/fixtures/tokenizer/corpus.jsonl \
  --qwen3 .carry/gold/qwen3 --llama2 .carry/gold/llama2 --demo .carry/gold/demo --out "$OUT/tok" \
  2>&1 | tee "$OUT/tok_log.txt"
python3 tools/make_chat_template_goldens.py --templates tests/fixtures/chat_templates \
  --out "$OUT/tok/goldens.json" 2>&1 | tee "$OUT/chat_log.txt"
python3 tools/bench_tokenizers_hf.py .carry/gold/qwen3 tests/fixtures/tokenizer/bench_corpus.txt \
  2>&1 | tee "$OUT/hf_bench.txt"
python3 tools/bench_tokenizers_hf.py "$OUT/tok/llama3_style" tests/fixtures/tokenizer/bench_corpus.txt \
  2>&1 | tee -a "$OUT/hf_bench.txt"
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/hf_bench.txt"
(cd "$OUT" && tar czf tok.tgz tok && rm -rf tok)
