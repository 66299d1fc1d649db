#!/usr/bin/env python3
"""Reference tokenizations for Tessera's tokenizer golden tests.

Runs where Hugging Face `tokenizers`, `transformers` and `sentencepiece` are installed (the GPU
machine); needs no network.

  python3 tools/make_tokenizer_goldens.py --corpus tests/fixtures/tokenizer/corpus.jsonl \
      --qwen3 DIR --llama2 DIR --demo DIR --out OUTDIR

Writes OUTDIR/<name>.jsonl, one line per corpus text: {"text", "ids", "decoded"} where ids are
the reference encoding without special tokens and decoded is the reference decode of those ids.
  qwen3         tokenizers.Tokenizer.from_file(qwen3/tokenizer.json)     (real byte-level BPE)
  llama2_sp     sentencepiece on llama2/tokenizer.model                   (real SentencePiece)
  demo_sp       sentencepiece on the demo checkpoint's tokenizer.model
  llama2_hf     transformers' conversion of llama2/tokenizer.model to tokenizer.json
                (Metaspace/byte-fallback BPE, as Llama 2 and Mistral ship it), saved to
                OUTDIR/llama2_hf/ and run through `tokenizers`
  llama3_style  a small byte-level BPE trained by `tokenizers` on the corpus with the Llama 3
                pre-tokenizer regex and ignore_merges, saved to OUTDIR/llama3_style/
  metaspace     a small BPE with a Metaspace pre-tokenizer (prepend_scheme "first"), byte
                fallback and added special tokens, saved to OUTDIR/metaspace/
Every reference is checked against transformers' AutoTokenizer where one loads.
"""

import argparse
import json
import os
import shutil
import sys

import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def write_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def with_hf(tok, corpus):
    rows = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        rows.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    return rows


def with_sp(model_path, corpus):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    return [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in corpus]


def check_against_transformers(folder, rows, name):
    """transformers' AutoTokenizer must agree with the reference ids (it wraps the same code)."""
    try:
        auto = transformers.AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # A folder without tokenizer_config.json may not load: say so.
        print(f"{name}: AutoTokenizer did not load ({e}); reference is tokenizers alone")
        return
    mismatches = sum(auto.encode(r["text"], add_special_tokens=False) != r["ids"] for r in rows)
    print(f"{name}: transformers AutoTokenizer agrees on {len(rows) - mismatches}/{len(rows)}")


def train_llama3_style(corpus, out_dir):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    tok.train_from_iterator(corpus * 3, trainer)
    tok.add_special_tokens(["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok


def train_metaspace(corpus, out_dir):
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"] + alphabet,
                                  limit_alphabet=120)
    tok.train_from_iterator(corpus * 3, trainer)
    tok.add_special_tokens(["[INST]", "[/INST]"])
    tok.add_tokens([tokenizers.AddedToken("<tool>", lstrip=True, rstrip=True)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--qwen3", required=True)
    ap.add_argument("--llama2", required=True)
    ap.add_argument("--demo", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    corpus = read_corpus(a.corpus)
    os.makedirs(a.out, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, "
          f"sentencepiece {spm.__version__}, {len(corpus)} texts")

    qwen3 = Tokenizer.from_file(os.path.join(a.qwen3, "tokenizer.json"))
    rows = with_hf(qwen3, corpus)
    check_against_transformers(a.qwen3, rows, "qwen3")
    write_lines(os.path.join(a.out, "qwen3.jsonl"), rows)

    write_lines(os.path.join(a.out, "llama2_sp.jsonl"),
                with_sp(os.path.join(a.llama2, "tokenizer.model"), corpus))
    write_lines(os.path.join(a.out, "demo_sp.jsonl"),
                with_sp(os.path.join(a.demo, "tokenizer.model"), corpus))

    # transformers' own conversion of the SentencePiece model to a tokenizer.json: load the
    # folder as a Llama tokenizer, as from_pretrained would for a Hub model without one.
    llama_dir = os.path.join(a.out, "llama2_hf")
    try:
        src = os.path.join(a.out, "llama2_src")
        os.makedirs(src, exist_ok=True)
        shutil.copy(os.path.join(a.llama2, "tokenizer.model"), src)
        with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                       "unk_token": "<unk>", "add_bos_token": True, "legacy": False}, f)
        auto = transformers.AutoTokenizer.from_pretrained(src)
        auto.save_pretrained(llama_dir)
        converted = Tokenizer.from_file(os.path.join(llama_dir, "tokenizer.json"))
        if converted.get_vocab_size() < 32000:
            raise RuntimeError(f"converted vocabulary has {converted.get_vocab_size()} entries")
        rows = with_hf(converted, corpus)
        check_against_transformers(llama_dir, rows, "llama2_hf")
        write_lines(os.path.join(a.out, "llama2_hf.jsonl"), rows)
        for name in os.listdir(llama_dir):  # Keep only what the test reads.
            if name not in ("tokenizer.json", "tokenizer_config.json"):
                os.remove(os.path.join(llama_dir, name))
        shutil.rmtree(src)
    except Exception as e:  # Reported, and the other references still get written.
        print(f"llama2_hf: conversion failed: {e!r}")
        shutil.rmtree(llama_dir, ignore_errors=True)

    tok = train_llama3_style(corpus, os.path.join(a.out, "llama3_style"))
    write_lines(os.path.join(a.out, "llama3_style.jsonl"), with_hf(tok, corpus))
    tok = train_metaspace(corpus, os.path.join(a.out, "metaspace"))
    write_lines(os.path.join(a.out, "metaspace.jsonl"), with_hf(tok, corpus))

    for name in ("qwen3", "llama2_hf", "llama3_style", "metaspace"):
        path = os.path.join(a.out, name + ".jsonl")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            bad = [json.loads(l)["text"][:40] for l in f if json.loads(l)["decoded"] != json.loads(l)["text"]]
        print(f"{name}: decode(encode(text)) != text for {len(bad)} texts {bad[:5]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
