#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (tessera serve, vLLM, ...).

Keeps CONCURRENCY streaming /v1/completions requests in flight until REQUESTS have
finished, and prints request throughput, output tokens/s, time to first token and time per
output token (p50/p99) from the real token counts (each request asks for usage in its
stream). Standard library only.

  tools/loadgen.py --url http://127.0.0.1:8000 --model stories260K --concurrency 8 \\
      --requests 64 --max-tokens 128 [--prompt TEXT] [--json]
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def one_request(url, body):
    """Returns (ttft_s, total_s, completion_tokens) for one streamed completion."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    # Only the first event's arrival and the last (usage) event are needed, so
    # the client parses as little as it can: it shares the machine's CPUs.
    ttft = None
    body = []
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        if ttft is None:
            ttft = time.perf_counter() - start
        body.append(chunk)
    total = time.perf_counter() - start
    events = b"".join(body).split(b"\n\n")
    tokens = None
    for event in reversed(events):
        if event.startswith(b"data: {"):
            data = json.loads(event[6:])
            if data.get("usage"):
                tokens = data["usage"]["completion_tokens"]
            break
    conn.close()
    if tokens is None:
        raise RuntimeError("the stream carried no usage")
    return ttft if ttft is not None else total, total, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()
    body = {"model": a.model, "prompt": a.prompt, "max_tokens": a.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    results, errors = [], []
    lock = threading.Lock()
    remaining = [a.requests]

    def worker():
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            try:
                r = one_request(a.url, body)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    tokens = sum(r[2] for r in results)
    ttft = [r[0] for r in results]
    tpot = [(r[1] - r[0]) / (r[2] - 1) for r in results if r[2] > 1]
    summary = {
        "concurrency": a.concurrency, "requests": len(results), "errors": len(errors),
        "seconds": elapsed, "requests_per_s": len(results) / elapsed,
        "output_tokens": tokens, "output_tokens_per_s": tokens / elapsed,
        "ttft_p50_ms": percentile(ttft, 0.5) * 1e3, "ttft_p99_ms": percentile(ttft, 0.99) * 1e3,
        "tpot_p50_ms": percentile(tpot, 0.5) * 1e3, "tpot_p99_ms": percentile(tpot, 0.99) * 1e3,
    }
    if a.json:
        print(json.dumps(summary))
    else:
        print(f"concurrency {a.concurrency}: {len(results)} requests in {elapsed:.2f} s "
              f"({summary['requests_per_s']:.2f} req/s), {tokens} output tokens "
              f"({summary['output_tokens_per_s']:.1f} tok/s); TTFT p50 "
              f"{summary['ttft_p50_ms']:.2f} ms p99 {summary['ttft_p99_ms']:.2f} ms; "
              f"TPOT p50 {summary['tpot_p50_ms']:.3f} ms p99 {summary['tpot_p99_ms']:.3f} ms")
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
