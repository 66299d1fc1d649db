#!/usr/bin/env bash
# CPU throughput of N concurrent demo requests (one `tessera generate
# --prompts-file`, the scheduler batching them) against the same requests run
# one at a time (--max-num-seqs 1), in one process each, greedy, EOS ignored
# so both runs generate exactly N x MAX_TOKENS tokens.
#   tools/bench_batching_cpu.sh [N=64] [MAX_TOKENS=128]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-64}
MAX_TOKENS=${2:-128}
MODEL=${MODEL:-../shared/models/stories260K}
bazel build -c opt //launch:tessera >/dev/null 2>&1
BIN=bazel-bin/launch/tessera
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
openings=("Once upon a time" "Lily and Ben" "The cat" "One day" "Tom had a red ball"
  "The sun was shining" "A little bird" "Mom said")
for ((i = 0; i < N; i++)); do
  printf '{"prompt": "%s, %d"}\n' "${openings[i % ${#openings[@]}]}" "$i"
done >"$TMP/prompts.jsonl"
run() {
  "$BIN" generate --model "$MODEL" --prompts-file "$TMP/prompts.jsonl" \
    --max-tokens "$MAX_TOKENS" --ignore-eos --temperature 0 --output json \
    --stats-json "$TMP/stats.json" "$@" 2>"$TMP/err" >"$TMP/out"
  grep "prompts:" "$TMP/err" | sed 's/^\[tessera\] //'
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("  scheduler", s["scheduler"], "prefix_cache", s["prefix_cache"])' "$TMP/stats.json"
}
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== $N concurrent requests (default engine: --max-num-seqs 256, 2048 tokens/step)"
run
cp "$TMP/out" "$TMP/out.batched"
echo "== the same $N requests one at a time (--max-num-seqs 1)"
run --max-num-seqs 1
if cmp -s "$TMP/out" "$TMP/out.batched"; then
  echo "outputs: identical"
else
  echo "outputs: DIFFER" && exit 1
fi
