#!/usr/bin/env python3
"""Writes "the tiny Qwen3": a random-weight Qwen3 checkpoint with small dims
but the real vocabulary (151,936 embedding rows) and the real tokenizer.

    python3 tools/make_tiny_qwen3.py OUT_DIR [--hidden 64] [--layers 2]

OUT_DIR gets config.json, generation_config.json, model.safetensors (f32, tied
embeddings, about 40 MB at hidden 64) and the tokenizer files copied from
--tokenizer (default ../shared/tokenizers/qwen3, relative to the repository
root). Standard library only (no numpy or torch): the weights come from a
seeded xorshift generator, so the same arguments always write the same bytes.
The numbers it makes are meaningless; the model is for timing (the embedding
and LM head cost what a real Qwen3 vocabulary costs) and for serving tests.
Put OUT_DIR somewhere git ignores (e.g. out/); it is not committed.
"""

import argparse
import array
import json
import os
import shutil
import struct
import sys

VOCAB = 151936  # Embedding rows of every Qwen3 checkpoint.
TOKENIZER_IDS = 151669  # Ids the tokenizer defines (the rest is padding).


def uniform(count, bound, state):
    """`count` floats in [-bound, bound) from a 64-bit xorshift (state[0])."""
    out = array.array("f", bytes(4 * count))
    x = state[0]
    mask = (1 << 64) - 1
    scale = 2.0 * bound / float(1 << 24)
    for i in range(count):
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        out[i] = (x >> 40) * scale - bound
    state[0] = x
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--intermediate", type=int, default=192)
    p.add_argument("--max-positions", type=int, default=40960)
    p.add_argument("--seed", type=int, default=1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--tokenizer",
                   default=os.path.join(root, "..", "shared", "tokenizers", "qwen3"))
    a = p.parse_args()

    h, d = a.hidden, a.head_dim
    shapes = {"model.embed_tokens.weight": [VOCAB, h], "model.norm.weight": [h]}
    for i in range(a.layers):
        pre = "model.layers.%d." % i
        shapes.update({
            pre + "input_layernorm.weight": [h],
            pre + "post_attention_layernorm.weight": [h],
            pre + "self_attn.q_proj.weight": [a.heads * d, h],
            pre + "self_attn.k_proj.weight": [a.kv_heads * d, h],
            pre + "self_attn.v_proj.weight": [a.kv_heads * d, h],
            pre + "self_attn.o_proj.weight": [h, a.heads * d],
            pre + "self_attn.q_norm.weight": [d],
            pre + "self_attn.k_norm.weight": [d],
            pre + "mlp.gate_proj.weight": [a.intermediate, h],
            pre + "mlp.up_proj.weight": [a.intermediate, h],
            pre + "mlp.down_proj.weight": [h, a.intermediate],
        })
    names = sorted(shapes)
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for n in names:
        count = 1
        for s in shapes[n]:
            count *= s
        header[n] = {"dtype": "F32", "shape": shapes[n],
                     "data_offsets": [offset, offset + 4 * count]}
        offset += 4 * count
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    os.makedirs(a.out, exist_ok=True)
    state = [((a.seed * 0x2545F4914F6CDD1D) ^ 0x9E3779B97F4A7C15) & ((1 << 64) - 1) or 1]
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for n in names:
            count = 1
            for s in shapes[n]:
                count *= s
            if n.endswith("norm.weight"):
                values = uniform(count, 0.2, state)
                for i in range(count):
                    values[i] += 1.0
            else:
                values = uniform(count, 1.0 / shapes[n][-1] ** 0.5, state)
            if n == "model.embed_tokens.weight":
                # Rows past the tokenizer's ids are padding, as in real
                # Qwen3 checkpoints; zero rows give logit 0, so greedy
                # decoding never picks them.
                for i in range(TOKENIZER_IDS * h, count):
                    values[i] = 0.0
            if sys.byteorder != "little":
                values.byteswap()
            values.tofile(f)

    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": d,
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": a.intermediate,
        "max_position_embeddings": a.max_positions,
        "max_window_layers": a.layers,
        "model_type": "qwen3",
        "num_attention_heads": a.heads,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": [151645, 151643]}, f,
                  indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
        os.chmod(os.path.join(a.out, name), 0o644)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
