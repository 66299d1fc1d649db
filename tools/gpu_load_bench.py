"""Time to ready and peak host memory of `tessera serve` on a Llama-3-8B-shaped bf16 checkpoint.

Runs on the GPU machine (its python3 has torch and transformers). Writes the checkpoint once with
save_pretrained (random weights, 16 GB of bf16 safetensors), reads it once so the page cache is
warm, then for each tessera binary given: starts `tessera serve --device cuda`, samples the
process's /proc status every 10 ms (RssAnon, RssFile, VmHWM) until GET /health answers 200, sends
one completion to show it serves, and stops it. Prints one JSON line per run. Usage:
  python3 tools/gpu_load_bench.py WORKDIR NAME=BINARY [NAME=BINARY ...] [-- extra serve flags]
"""
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


def write_checkpoint(path):
    if os.path.exists(os.path.join(path, "config.json")):
        return
    import torch
    import transformers
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    print(json.dumps({"checkpoint": path, "written_s": round(time.time() - t0, 1)}), flush=True)


def warm(path):
    t0 = time.time()
    total = 0
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            while True:
                chunk = f.read(1 << 26)
                if not chunk:
                    break
                total += len(chunk)
    print(json.dumps({"warm_read_bytes": total, "warm_read_s": round(time.time() - t0, 1)}),
          flush=True)


def status_kib(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return 0


def run(name, binary, model, port, extra):
    cmd = [binary, "serve", "--model", model, "--device", "cuda", "--port", str(port),
           "--host", "127.0.0.1"] + extra
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = {}
    ready = None
    last_probe = 0.0
    while proc.poll() is None and time.time() - t0 < 300:
        for k, v in status_kib(proc.pid).items():
            peak[k] = max(peak.get(k, 0), v)
        now = time.time()
        if now - last_probe > 0.05:
            last_probe = now
            if health(port) == 200:
                ready = now - t0
                break
        time.sleep(0.01)
    row = {"run": name, "binary": binary, "command": " ".join(cmd)}
    if ready is None:
        proc.kill()
        row["error"] = (proc.stderr.read() or "")[-2000:]
        print(json.dumps(row), flush=True)
        return
    at_ready = status_kib(proc.pid)
    body = json.dumps({"model": os.path.basename(model), "prompt": [1, 2, 3], "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            served = json.loads(r.read())["usage"]["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - report whatever went wrong
        served = f"error: {e}"
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    row.update({
        "ready_s": round(ready, 2),
        "peak_rss_anon_mib": round(peak.get("RssAnon", 0) / 1024, 1),
        "peak_rss_file_mib": round(peak.get("RssFile", 0) / 1024, 1),
        "vm_hwm_mib_at_ready": round(at_ready.get("VmHWM", 0) / 1024, 1),
        "rss_anon_mib_at_ready": round(at_ready.get("RssAnon", 0) / 1024, 1),
        "completion_tokens": served,
        "log_tail": [l for l in err.splitlines() if "[tessera]" in l][-6:],
    })
    print(json.dumps(row), flush=True)


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    work, runs = args[0], args[1:]
    model = os.path.join(work, "llama3_8b_shape_bf16")
    write_checkpoint(model)
    warm(model)
    for i, spec in enumerate(runs):
        name, _, binary = spec.partition("=")
        run(name, binary, model, 18700 + i, extra)


if __name__ == "__main__":
    main()
