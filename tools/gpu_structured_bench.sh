#!/usr/bin/env bash
# The structured-output engine's decode overhead and schema compile time on the GPU machine
# (issue 18; docs/PERFORMANCE.md): `tessera bench --guided-json SCHEMA --compare-unconstrained`
# at batch 1 and 64 on random bf16 weights of the Qwen3-8B and Qwen3-0.6B shapes, with the
# Qwen3 tokenizer (its 151,669-token vocabulary is what the masks cover). Prints one summary
# line per run and leaves every run's JSON in $OUT.
#
#   BIN=.carry/gpu/bin TOKENIZER=.carry/gpu/qwen3_tokenizer bash tools/gpu_structured_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.carry/gpu/bin}
TOKENIZER=${TOKENIZER:-.carry/gpu/qwen3_tokenizer}
OUT=${OUT:-/tmp/structured_bench}
W=$(mktemp -d)
mkdir -p "$OUT"
source "$(dirname "$0")/bench_rows.sh"
bench_configs
run() {  # model, batch, schema
  local name="$1-b$2-$(basename "$3" .json)"
  if timeout 240 "$BIN/tessera" bench --model "$W/$1" --random-weights --tokenizer "$TOKENIZER" \
    --device cuda --max-model-len 4096 --batch-size "$2" --input-len 128 --output-len 256 \
    --iterations 5 --guided-json "$3" --compare-unconstrained --json \
    >"$OUT/$name.json" 2>"$OUT/$name.err"; then
    python3 - "$name" "$OUT/$name.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))["structured_output"]
u, c, r = s["unconstrained"], s["constrained"], s["ratio"]
print(f"{sys.argv[1]}: step p50 {u['decode_step_ms_p50']:.3f} -> {c['decode_step_ms_p50']:.3f} ms "
      f"(ratio {r['decode_step_p50']:.3f}, p99 ratio {r['decode_step_p99']:.3f}), decode tok/s "
      f"{u['decode_tokens_per_s']:.0f} -> {c['decode_tokens_per_s']:.0f} "
      f"(ratio {r['decode_tokens_per_s']:.3f}); compile {s['compile_ms']:.1f} ms cold, "
      f"{s['cached_compile_ms']:.3f} ms cached; tokens/request {c.get('output_tokens_per_request')}")
PY
  else
    echo "$name: FAILED"; tail -5 "$OUT/$name.err"
  fi
}
# ROWS="qwen3-0.6b:64:array_of_records ..." runs only those (model:batch:schema).
ROWS=${ROWS:-"qwen3-8b:1:array_of_records qwen3-8b:1:array_of_objects qwen3-8b:64:array_of_records
  qwen3-8b:64:array_of_objects qwen3-0.6b:1:array_of_records qwen3-0.6b:64:array_of_records"}
for r in $ROWS; do
  IFS=: read -r model batch schema <<<"$r"
  run "$model" "$batch" "tools/bench_schemas/$schema.json"
done
