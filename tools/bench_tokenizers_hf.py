#!/usr/bin/env python3
"""Encode throughput of Hugging Face `tokenizers` on a text file, one thread, one line at a time.

  TOKENIZERS_PARALLELISM=false python3 tools/bench_tokenizers_hf.py TOKENIZER_DIR CORPUS.txt

The same file and the same per-line loop as Tessera's tokenizer_benchmark, so the two MB/s
figures compare like with like. Prints the median of 5 timed passes after a warm-up.
"""

import os
import statistics
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import Tokenizer  # noqa: E402


def main():
    tok = Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
    with open(sys.argv[2], encoding="utf-8") as f:
        lines = f.read().split("\n")
    total_bytes = sum(len(line.encode("utf-8")) for line in lines)
    for line in lines:  # Warm-up: the word cache fills as it would in a server.
        tok.encode(line, add_special_tokens=False)
    times = []
    tokens = 0
    for _ in range(5):
        start = time.perf_counter()
        tokens = sum(len(tok.encode(line, add_special_tokens=False).ids) for line in lines)
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    print(f"hf_tokenizers encode per line: {total_bytes / t / 1e6:.2f} MB/s, "
          f"{tokens / t / 1e6:.3f} Mtokens/s ({total_bytes} bytes, {len(lines)} lines, {tokens} tokens, "
          f"median {t * 1e3:.2f} ms)")
    # encode_batch on one Rayon thread: the same work without a Python call per line.
    times = []
    for _ in range(5):
        start = time.perf_counter()
        tok.encode_batch(lines, add_special_tokens=False)
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    print(f"hf_tokenizers encode_batch (1 thread): {total_bytes / t / 1e6:.2f} MB/s "
          f"(median {t * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
