# Shared by tools/gpu_roof_bench.sh, tools/gpu_fp8_bench.sh and tools/gpu_structured_bench.sh (sourced, on the GPU machine):
# the benchmark shapes as config.json files under $W, and row(), which runs one
# `tessera bench --random-weights --device cuda --json` and appends its JSON line (label, shape,
# flags and wall time added) to $ROWS. Needs BIN, W, ROWS and late() from the caller.
bench_configs() {
  mkdir -p "$W/llama-8b" "$W/qwen3-0.6b" "$W/qwen3-8b"
cat >"$W/qwen3-8b/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
 "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": false,
 "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
 "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "bfloat16",
 "bos_token_id": 151643, "eos_token_id": 151645}
JSON
cat >"$W/llama-8b/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
 "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
 "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "bfloat16",
 "bos_token_id": 128000, "eos_token_id": 128001}
JSON
cat >"$W/qwen3-0.6b/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
 "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": true,
 "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
 "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "bfloat16",
 "bos_token_id": 151643, "eos_token_id": 151645}
JSON

}

row() {  # label, model, max context, bench flags...
  local label="$1" model="$2" ctx="$3"
  shift 3
  late "$label" && return
  local t0=$(date +%s.%N)
  if timeout 240 "$BIN/tessera" bench --model "$W/$model" --random-weights --device cuda \
    --max-model-len "$ctx" --json "$@" >"$W/row.json" 2>"$W/row.err"; then
    python3 - "$label" "$model" "$W/row.json" "$t0" "$*" "$W/row.err" >>"$ROWS" <<'PY'
import json, sys, time
r = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
r.update(label=sys.argv[1], shape=sys.argv[2], flags=sys.argv[5], wall_s=round(time.time() - float(sys.argv[4]), 1))
# The startup summary's model and KV lines (weights' form and bytes, KV capacity in tokens).
r["summary"] = [l.strip() for l in open(sys.argv[6], errors="replace")
                if l.startswith("[tessera] model:") or l.startswith("[tessera] KV cache:")]
print(json.dumps(r))
PY
    tail -1 "$ROWS"
  else
    echo "FAIL: $label"; tail -5 "$W/row.err"
    echo "{\"label\": \"$label\", \"error\": $(tail -3 "$W/row.err" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" >>"$ROWS"
  fi
}
