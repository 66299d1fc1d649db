#!/usr/bin/env bash
# Issue 19's MoE row of docs/PERFORMANCE.md, on the GPU machine (carry .carry/gpu): a
# Qwen3-30B-A3B-shaped random bf16 model (48 layers, hidden 2048, 128 experts, top 8, expert
# intermediate 768) run by `tessera bench --random-weights` at batch 1 and 64, and by
# transformers on random weights of the same config (the values do not change the timing), with
# the card's copy bandwidth, so decode tok/s can be read against the bytes a step must move
# (active parameters only; printed by the python part). One JSON line per row in $OUT/moe.jsonl.
#   BIN=.carry/gpu/bin OUT=/tmp/moe bash tools/gpu_moe_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.carry/gpu/bin}
OUT=${OUT:-/tmp/gpu_moe}
mkdir -p "$OUT"
W=$(mktemp -d)
mkdir -p "$W/qwen3-30b-a3b"
cat >"$W/qwen3-30b-a3b/config.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
 "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
 "vocab_size": 151936, "tie_word_embeddings": false, "max_position_embeddings": 40960,
 "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
 "initializer_range": 0.02, "torch_dtype": "bfloat16", "bos_token_id": 151643,
 "eos_token_id": 151645}
JSON
row() {  # label, bench flags...
  local label="$1"
  shift
  if timeout "${ROW_TIMEOUT:-200}" "$BIN/tessera" bench --model "$W/qwen3-30b-a3b" --random-weights \
    --device cuda --max-model-len 4096 --json "$@" >"$W/row.json" 2>"$W/row.err"; then
    python3 - "$label" "$W/row.json" "$*" >>"$OUT/moe.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
r.update(label=sys.argv[1], engine="tessera", flags=sys.argv[3])
print(json.dumps(r))
PY
    tail -1 "$OUT/moe.jsonl" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["label"], "decode tok/s", round(r["decode_tokens_per_s"]), "step p50 ms", r.get("decode_step_ms_p50"), "weights", r.get("memory",{}).get("weights_bytes"))'
  else
    echo "FAIL: $label"; tail -5 "$W/row.err"
  fi
  grep -E "^\[tessera\] (model|KV|decode CUDA)" "$W/row.err" | head -3
}
row tessera-b1 --batch-size 1 --input-len 32 --output-len 256 --iterations 3 --max-num-seqs 1
row tessera-b64 --batch-size 64 --input-len 128 --output-len 256 --iterations 2 --max-num-seqs 64
if [ "${HF:-1}" = 1 ]; then
  PYTHONUNBUFFERED=1 timeout "${HF_TIMEOUT:-240}" python3 - "$W/qwen3-30b-a3b/config.json" \
    >>"$OUT/moe.jsonl" 2>"$OUT/hf.err" <<'PY'
import json, math, sys, time, torch
from transformers import AutoConfig, AutoModelForCausalLM
dev = "cuda"
def row(**k): print(json.dumps(k), flush=True)
x = torch.empty(4 * 1024**3, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); bw = 2 * 4 * 1024**3 / ((time.perf_counter() - t) / 10); del x, y
row(metric="d2d_copy_TBps", value=round(bw / 1e12, 3))
c = json.load(open(sys.argv[1]))
H, L, E, k, I = c["hidden_size"], c["num_hidden_layers"], c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
D, nh, nkv, V = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
attn = H * nh * D * 2 + H * nkv * D * 2
per_layer_active = attn + H * E + k * 3 * H * I
def step_bytes(batch):  # bf16 weights a decode step must read: active experts only
    distinct = E * (1 - (1 - 1 / E) ** (batch * k))
    return 2 * (L * (attn + H * E + distinct * 3 * H * I) + V * H)
for b in (1, 64):
    row(metric="roof", batch=b, step_bytes=round(step_bytes(b)), roof_tokens_per_s=round(b * bw / step_bytes(b)))
cfg = AutoConfig.from_pretrained(sys.argv[1].rsplit("/", 1)[0])
t = time.perf_counter()
with torch.device(dev):
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
row(metric="hf_build_s", value=round(time.perf_counter() - t, 1), experts_impl=str(getattr(cfg, "_experts_implementation", None)))
def gen(b, i, o):
    ids = torch.randint(0, V, (b, i), device=dev)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=o, min_new_tokens=o, do_sample=False)
    torch.cuda.synchronize(); return time.perf_counter() - t
gen(1, 8, 4)
for b, i, o in ((1, 32, 64), (64, 128, 32)):
    t1 = gen(b, i, 1); tn = gen(b, i, o)
    row(engine="transformers", batch=b, input_len=i, output_len=o, decode_tokens_per_s=round(b * (o - 1) / (tn - t1), 1),
        decode_step_ms=round((tn - t1) / (o - 1) * 1e3, 3))
PY
  tail -6 "$OUT/moe.jsonl"; tail -3 "$OUT/hf.err"
fi
rm -rf "$W"
