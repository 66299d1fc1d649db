#!/usr/bin/env python3
"""Write transformers' min_new_tokens references for Tessera's golden fixtures.

Usage:
    python3 tools/make_min_tokens_golden.py --golden tests/fixtures/golden \
        [--fixtures qwen3 llama] [--out DIR] [--tessera BIN --device cuda]

For each fixture, and each golden case (tests/fixtures/golden/<name>/golden.json),
a token that greedy decoding produces early (output_ids[1]) is made an end of
sequence (eos_token_id = [that token, the config's EOS]), so that without
min_new_tokens the sequence ends after two tokens. transformers then decodes
greedily (float32, eager attention, on the CPU) with min_new_tokens =
MIN_NEW_TOKENS: its MinNewTokensLengthLogitsProcessor sets the EOS logits to
-inf while fewer than that many tokens are generated. The tokens are written to
<out>/<name>/min_tokens.json:

    {"min_new_tokens": 8, "max_new_tokens": 20, "min_top2_gap": ...,
     "cases": [{"prompt_ids", "stop_token_id", "eos_token_id",
                "output_ids", "finish_reason", "output_ids_without_min"}]}

In Tessera the extra EOS is a stop_token_id (the config's EOS stays EOS), and
GenerationRequest::min_tokens masks both, as vLLM's min_tokens does.

min_top2_gap: the smallest gap between the best and second-best processed
logit over every greedy step (the masked ids excluded), so a near-tie that
float rounding could flip is visible.

With --tessera, the binary is also run on every case (`generate --min-tokens
... --stop-token-ids ...`, --device as given, float32) and its output_ids are
compared with transformers'; a mismatch exits 1.
"""

import argparse
import json
import os
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

MIN_NEW_TOKENS = 8
MAX_NEW_TOKENS = 20


def load_model(path):
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", torch_dtype=torch.float32)
    return model.float().eval()


@torch.no_grad()
def greedy(model, prompt_ids, eos_ids, min_new_tokens):
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_ids,
        pad_token_id=eos_ids[0],
        output_scores=True,
        return_dict_in_generate=True,
    )
    if min_new_tokens > 0:
        kwargs["min_new_tokens"] = min_new_tokens
    out = model.generate(**kwargs)
    ids = out.sequences[0, len(prompt_ids):].tolist()
    gap = float("inf")
    for scores in out.scores:  # processed: the masked ids are -inf
        s = scores[0]
        finite = s[torch.isfinite(s)]
        if finite.numel() >= 2:
            top2 = torch.topk(finite, 2).values
            gap = min(gap, float(top2[0] - top2[1]))
    finish = "stop" if ids and ids[-1] in eos_ids else "length"
    return ids, finish, gap


def run_tessera(binary, device, model_dir, case):
    cmd = [binary, "generate", "--model", model_dir,
           "--prompt-ids", ",".join(map(str, case["prompt_ids"])),
           "--max-tokens", str(MAX_NEW_TOKENS),
           "--min-tokens", str(MIN_NEW_TOKENS),
           "--stop-token-ids", str(case["stop_token_id"]),
           "--temperature", "0", "--output", "json", "--device", device]
    if device == "cuda":
        cmd += ["--dtype", "float32"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        return None, res.stderr.strip().splitlines()[-1:]
    line = json.loads(res.stdout.strip().splitlines()[-1])
    return line, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", required=True)
    ap.add_argument("--fixtures", nargs="+", default=["qwen3", "llama"])
    ap.add_argument("--out", default=None, help="default: --golden")
    ap.add_argument("--tessera", default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    out_root = args.out or args.golden
    torch.manual_seed(0)
    mismatches = 0
    for name in args.fixtures:
        src = os.path.join(args.golden, name)
        golden = json.load(open(os.path.join(src, "golden.json")))
        config = json.load(open(os.path.join(src, "config.json")))
        eos = config["eos_token_id"]
        eos = eos if isinstance(eos, list) else [eos]
        model = load_model(src)
        cases = []
        min_gap = float("inf")
        for c in golden["cases"]:
            ref = c["output_ids"]
            stop = next(t for t in ref[1:] if t not in eos)
            eos_ids = [stop] + [e for e in eos if e != stop]
            without, _, _ = greedy(model, c["prompt_ids"], eos_ids, 0)
            ids, finish, gap = greedy(model, c["prompt_ids"], eos_ids,
                                      MIN_NEW_TOKENS)
            min_gap = min(min_gap, gap)
            case = {"prompt_ids": c["prompt_ids"], "stop_token_id": stop,
                    "eos_token_id": eos_ids, "output_ids": ids,
                    "finish_reason": finish,
                    "output_ids_without_min": without}
            print(f"{name} prompt {len(c['prompt_ids'])}: stop {stop}, "
                  f"without {len(without)} tokens, with {len(ids)} ({finish}), "
                  f"gap {gap:.4g}", flush=True)
            if args.tessera:
                line, err = run_tessera(args.tessera, args.device, src, case)
                if line is None or line["output_ids"] != ids or \
                        line["finish_reason"] != finish:
                    mismatches += 1
                    print(f"  MISMATCH tessera {args.device}: "
                          f"{err or line}", flush=True)
                else:
                    print(f"  tessera {args.device}: match", flush=True)
            cases.append(case)
        result = {"name": name,
                  "transformers_version": transformers.__version__,
                  "torch_version": torch.__version__,
                  "min_new_tokens": MIN_NEW_TOKENS,
                  "max_new_tokens": MAX_NEW_TOKENS,
                  "min_top2_gap": float(f"{min_gap:.7g}"),
                  "cases": cases}
        dst = os.path.join(out_root, name)
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(dst, "min_tokens.json"), "w") as f:
            json.dump(result, f, separators=(",", ":"))
            f.write("\n")
    if mismatches:
        print(f"{mismatches} tessera mismatches", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
