#!/usr/bin/env python3
"""Convert a Hugging Face Llama checkpoint (e.g. stories260K) to llama2.c files.

Usage:
    python3 tools/export_llama2c.py --model DIR --out OUTDIR [--golden GOLDEN.json]

Writes
  OUTDIR/<name>.bin   llama2.c "legacy" (version 0) model file, readable by
                      karpathy/llama2.c run.c
  OUTDIR/tok<V>.bin   llama2.c tokenizer file built from DIR/tokenizer.model

<name> is the model directory's basename (stories260K.bin for stories260K).

Legacy model file layout (all little-endian):
  7 x int32   dim, hidden_dim, n_layers, n_heads, n_kv_heads,
              vocab_size (negated when the classifier is NOT shared), seq_len
  float32     token_embedding [vocab, dim]
              rms_att   [n_layers, dim]
              wq        [n_layers, n_heads*hs, dim]      (Meta interleaved rope layout)
              wk        [n_layers, n_kv_heads*hs, dim]   (Meta interleaved rope layout)
              wv        [n_layers, n_kv_heads*hs, dim]
              wo        [n_layers, dim, n_heads*hs]
              rms_ffn   [n_layers, dim]
              w1        [n_layers, hidden, dim]   (HF gate_proj)
              w2        [n_layers, dim, hidden]   (HF down_proj)
              w3        [n_layers, hidden, dim]   (HF up_proj)
              rms_final [dim]
              freq_cis_real [seq_len, hs/2]   (cos(pos * theta^(-2i/hs)); run.c skips it)
              freq_cis_imag [seq_len, hs/2]   (sin, likewise)
              wcls      [vocab, dim]   only when not shared
Every matrix is stored like a torch Linear weight: [out_features, in_features].

HF checkpoints keep the q/k projection rows in the "rotate_half" order that
transformers' convert_llama_weights_to_hf.py produces from Meta's interleaved
order: within each head, Meta row 2*i+t (t in {0,1}) became HF row t*hs/2+i.
run.c rotates interleaved pairs, so the export undoes that permutation.

Tokenizer file layout:
  int32 max_token_length
  per token id 0..vocab-1:  float32 score, int32 byte length, UTF-8 bytes
Pieces are sentencepiece's with U+2581 replaced by ' '; BOS and EOS become
"\\n<s>\\n" and "\\n</s>\\n" (what llama2.c's tokenizer.py writes).

--golden checks the export with a numpy re-implementation of run.c's forward
pass, tokenizer encode and decode, read back from the written files: the
prefill logits and the greedy continuation must match the Hugging Face
reference (stories260K_golden.json from make_golden_fixtures.py).

Needs numpy and sentencepiece only (safetensors is parsed by hand).
"""

import argparse
import json
import os
import struct
import sys

import numpy as np


# ---------------------------------------------------------------- safetensors
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        dt = info["dtype"]
        if dt == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif dt in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"unsupported safetensors dtype {dt} for {name}")
        out[name] = arr.astype(np.float32).reshape(info["shape"])
    return out


# ------------------------------------------------------------------- weights
def hf_rows_to_meta(w, n_heads):
    """Undo convert_llama_weights_to_hf's permute on a q or k projection.

    HF order inside a head: [t=0 half (i=0..hs/2-1), t=1 half]; Meta order:
    pairs (i, t) interleaved. w has shape [n_heads*hs, in].
    """
    rows, cols = w.shape
    hs = rows // n_heads
    return (w.reshape(n_heads, 2, hs // 2, cols)
             .transpose(0, 2, 1, 3)
             .reshape(rows, cols))


def export_model(model_dir, out_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    sd = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    dim = cfg["hidden_size"]
    hidden = cfg["intermediate_size"]
    n_layers = cfg["num_hidden_layers"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_heads
    vocab = cfg["vocab_size"]
    seq_len = cfg["max_position_embeddings"]
    hs = cfg.get("head_dim") or dim // n_heads
    rp = cfg.get("rope_parameters") or {}
    theta = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rs = cfg.get("rope_scaling") or rp
    if rs and rs.get("rope_type", rs.get("type", "default")) != "default":
        raise SystemExit(f"rope scaling {rs} is not supported by llama2.c")
    if hs * n_heads != dim:
        raise SystemExit("llama2.c requires head_dim == dim / n_heads")
    if theta != 10000.0:
        print(f"warning: run.c hard-codes rope theta 10000, model uses {theta}", file=sys.stderr)
    eps = cfg.get("rms_norm_eps", 1e-5)
    if abs(eps - 1e-5) > 1e-12:
        print(f"warning: run.c hard-codes rms eps 1e-5, model uses {eps}", file=sys.stderr)
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("llama2.c has no biases")

    emb = sd["model.embed_tokens.weight"]
    lm_head = sd.get("lm_head.weight")
    shared = lm_head is None or (cfg.get("tie_word_embeddings", True) and
                                 np.array_equal(lm_head, emb))
    assert emb.shape == (vocab, dim), emb.shape

    def L(i, name):
        return sd[f"model.layers.{i}.{name}"]

    blocks = [emb]
    blocks += [L(i, "input_layernorm.weight") for i in range(n_layers)]
    blocks += [hf_rows_to_meta(L(i, "self_attn.q_proj.weight"), n_heads) for i in range(n_layers)]
    blocks += [hf_rows_to_meta(L(i, "self_attn.k_proj.weight"), n_kv) for i in range(n_layers)]
    blocks += [L(i, "self_attn.v_proj.weight") for i in range(n_layers)]
    blocks += [L(i, "self_attn.o_proj.weight") for i in range(n_layers)]
    blocks += [L(i, "post_attention_layernorm.weight") for i in range(n_layers)]
    blocks += [L(i, "mlp.gate_proj.weight") for i in range(n_layers)]
    blocks += [L(i, "mlp.down_proj.weight") for i in range(n_layers)]
    blocks += [L(i, "mlp.up_proj.weight") for i in range(n_layers)]
    blocks += [sd["model.norm.weight"]]
    inv = 1.0 / (theta ** (np.arange(0, hs, 2)[: hs // 2].astype(np.float32) / hs))
    ang = np.outer(np.arange(seq_len, dtype=np.float32), inv).astype(np.float32)
    blocks += [np.cos(ang), np.sin(ang)]
    if not shared:
        blocks += [lm_head]

    header = struct.pack("<7i", dim, hidden, n_layers, n_heads, n_kv,
                         vocab if shared else -vocab, seq_len)
    with open(out_path, "wb") as f:
        f.write(header)
        for b in blocks:
            f.write(np.ascontiguousarray(b, dtype="<f4").tobytes())
    print(f"wrote {out_path}: dim={dim} hidden={hidden} layers={n_layers} heads={n_heads} "
          f"kv_heads={n_kv} vocab={vocab} shared={shared} seq_len={seq_len} "
          f"({os.path.getsize(out_path)} bytes)")


def export_tokenizer(model_path, out_path):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = sp.get_piece_size()
    pieces = []
    for i in range(n):
        if i == sp.bos_id():
            t = "\n<s>\n"
        elif i == sp.eos_id():
            t = "\n</s>\n"
        else:
            t = sp.id_to_piece(i).replace("\u2581", " ")
        pieces.append((sp.get_score(i), t.encode("utf-8")))
    max_len = max(len(b) for _, b in pieces)
    with open(out_path, "wb") as f:
        f.write(struct.pack("<i", max_len))
        for score, b in pieces:
            f.write(struct.pack("<fi", score, len(b)))
            f.write(b)
    print(f"wrote {out_path}: {n} tokens, max_token_length {max_len} "
          f"({os.path.getsize(out_path)} bytes)")
    return n


# ------------------------------------------------- run.c re-implementation
def load_l2c(path):
    raw = open(path, "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    w = np.frombuffer(raw, dtype="<f4", offset=28)
    p = 0

    def take(*shape):
        nonlocal p
        n = int(np.prod(shape))
        a = w[p:p + n].reshape(shape)
        p += n
        return a

    W = dict(emb=take(vocab, dim), rms_att=take(n_layers, dim),
             wq=take(n_layers, n_heads * hs, dim), wk=take(n_layers, n_kv * hs, dim),
             wv=take(n_layers, n_kv * hs, dim), wo=take(n_layers, dim, n_heads * hs),
             rms_ffn=take(n_layers, dim), w1=take(n_layers, hidden, dim),
             w2=take(n_layers, dim, hidden), w3=take(n_layers, hidden, dim),
             rms_final=take(dim))
    take(seq_len, hs // 2)
    take(seq_len, hs // 2)
    W["wcls"] = W["emb"] if shared else take(vocab, dim)
    assert p == w.size, (p, w.size)
    C = dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv,
             vocab=vocab, seq_len=seq_len, hs=hs)
    return C, W


class RunC:
    """numpy transcription of run.c's forward() (fp32, one token at a time)."""

    def __init__(self, C, W):
        self.C, self.W = C, W
        kv_dim = C["n_kv"] * C["hs"]
        self.kc = np.zeros((C["n_layers"], C["seq_len"], kv_dim), np.float32)
        self.vc = np.zeros_like(self.kc)

    @staticmethod
    def rms(x, g):
        return (g * (x / np.sqrt(np.mean(x * x) + np.float32(1e-5)))).astype(np.float32)

    def rope(self, v, pos):
        hs = self.C["hs"]
        i = np.arange(0, v.size, 2)
        freq = 1.0 / np.power(np.float32(10000.0), (i % hs).astype(np.float32) / hs)
        ang = (pos * freq).astype(np.float32)
        c, s = np.cos(ang), np.sin(ang)
        v0, v1 = v[0::2].copy(), v[1::2].copy()
        out = np.empty_like(v)
        out[0::2] = v0 * c - v1 * s
        out[1::2] = v0 * s + v1 * c
        return out

    def forward(self, tok, pos):
        C, W = self.C, self.W
        hs, nh, nkv = C["hs"], C["n_heads"], C["n_kv"]
        x = W["emb"][tok].astype(np.float32).copy()
        for l in range(C["n_layers"]):
            xb = self.rms(x, W["rms_att"][l])
            q = self.rope(W["wq"][l] @ xb, pos)
            k = self.rope(W["wk"][l] @ xb, pos)
            self.kc[l, pos] = k
            self.vc[l, pos] = W["wv"][l] @ xb
            att_out = np.empty(nh * hs, np.float32)
            for h in range(nh):
                kvh = h // (nh // nkv)
                qh = q[h * hs:(h + 1) * hs]
                K = self.kc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                V = self.vc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                sc = (K @ qh) / np.sqrt(np.float32(hs))
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                att_out[h * hs:(h + 1) * hs] = sc @ V
            x = x + W["wo"][l] @ att_out
            xb = self.rms(x, W["rms_ffn"][l])
            h1 = W["w1"][l] @ xb
            h3 = W["w3"][l] @ xb
            x = x + W["w2"][l] @ ((h1 / (1.0 + np.exp(-h1))) * h3)
        x = self.rms(x, W["rms_final"])
        return W["wcls"] @ x


def load_tok(path, vocab):
    raw = open(path, "rb").read()
    (max_len,) = struct.unpack("<i", raw[:4])
    p = 4
    toks, scores = [], []
    for _ in range(vocab):
        s, n = struct.unpack("<fi", raw[p:p + 8])
        p += 8
        toks.append(raw[p:p + n])
        p += n
        scores.append(s)
    assert p == len(raw), (p, len(raw))
    return toks, scores, max_len


def runc_encode(toks, scores, text, bos=True):
    """run.c encode(): dummy prefix, per-codepoint lookup, byte fallback, best-score merges."""
    lookup = {t: i for i, t in enumerate(toks)}
    ids = [1] if bos else []
    if text:
        ids.append(lookup[b" "])
    data = text.encode("utf-8")
    i = 0
    while i < len(data):
        j = i + 1
        while j < len(data) and (data[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        cp = data[i:j]
        if cp in lookup:
            ids.append(lookup[cp])
        else:
            ids.extend(b + 3 for b in cp)
        i = j
    while True:  # like run.c, the BOS token takes part in the pair search
        best, best_i, best_id = -1e10, -1, -1
        for k in range(len(ids) - 1):
            m = toks[ids[k]] + toks[ids[k + 1]]
            if m in lookup and scores[lookup[m]] > best:
                best, best_i, best_id = scores[lookup[m]], k, lookup[m]
        if best_i < 0:
            break
        ids[best_i:best_i + 2] = [best_id]
    return ids


def runc_decode(toks, prev, tok):
    piece = toks[tok]
    if prev == 1 and piece.startswith(b" "):
        piece = piece[1:]
    if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
        try:
            piece = bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece


def verify(bin_path, tok_path, golden_path):
    C, W = load_l2c(bin_path)
    toks, scores, _ = load_tok(tok_path, C["vocab"])
    with open(golden_path) as f:
        g = json.load(f)
    ok = True
    for case in [g] + g.get("more_cases", []):
        ids = runc_encode(toks, scores, case["prompt"])
        if ids != case["prompt_ids"]:
            print(f"encode mismatch for {case['prompt']!r}: run.c-style {ids} vs {case['prompt_ids']}")
            ok = False
        m = RunC(C, W)
        seq = list(case["prompt_ids"])
        logits = None
        for pos, t in enumerate(seq):
            logits = m.forward(t, pos)
        d = float(np.max(np.abs(logits - np.asarray(case["prefill_logits"], np.float32))))
        out = []
        for _ in range(len(case["output_ids"])):
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if len(seq) + len(out) > C["seq_len"]:
                break
            logits = m.forward(nxt, len(seq) + len(out) - 1)
        n_same = 0
        for a, b in zip(out, case["output_ids"]):
            if a != b:
                break
            n_same += 1
        text = b"".join(runc_decode(toks, p, t) for p, t in
                        zip([seq[-1]] + out[:-1], out)).decode("utf-8", "replace")
        good = d < 1e-3 and n_same == len(case["output_ids"])
        ok &= good
        print(f"[verify] {case['prompt']!r}: prefill max|dlogit| {d:.2e}, greedy agrees on "
              f"{n_same}/{len(case['output_ids'])} tokens {'OK' if good else 'MISMATCH'}; "
              f"run.c-style text: {text[:120]!r}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default=None, help="basename of the model .bin (default: model dir name)")
    ap.add_argument("--golden", default=None, help="stories260K_golden.json to verify against")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    name = args.name or os.path.basename(os.path.normpath(args.model))
    bin_path = os.path.join(args.out, name + ".bin")
    export_model(args.model, bin_path)
    sp_path = os.path.join(args.model, "tokenizer.model")
    n = export_tokenizer(sp_path, os.path.join(args.out, "tmp_tok.bin"))
    tok_path = os.path.join(args.out, f"tok{n}.bin")
    os.replace(os.path.join(args.out, "tmp_tok.bin"), tok_path)
    if args.golden:
        if not verify(bin_path, tok_path, args.golden):
            sys.exit("verification against the HF golden FAILED")
        print("verification against the HF golden passed")


if __name__ == "__main__":
    main()
