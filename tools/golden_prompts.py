#!/usr/bin/env python3
"""Writes a golden fixture's cases as a `--prompts-file` and the output_ids it must give.

Usage: golden_prompts.py FIXTURE_DIR OUT_DIR
  OUT_DIR/prompts.jsonl  one {"prompt_ids": [...]} line per case of FIXTURE_DIR/golden.json
  OUT_DIR/want           one '"output_ids":[...]' line per case (what `generate --output json`
                         prints, so a grep of its output compares with cmp)
For Phi-3 with LongRoPE the expected ids are transformers' no-cache tokens where the fixture
has them (tests/testing/golden_cases.h says why). Used by tests/mpi_generate_test.sh and
tools/gpu_check.sh.
"""
import json
import sys


def main():
    d, out = sys.argv[1], sys.argv[2]
    golden = json.load(open(d + "/golden.json"))
    config = json.load(open(d + "/config.json"))
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    phi3_longrope = config.get("model_type") == "phi3" and \
        rope.get("rope_type", rope.get("type")) in ("longrope", "su", "yarn")
    with open(out + "/prompts.jsonl", "w") as p, open(out + "/want", "w") as w:
        for c in golden["cases"]:
            p.write(json.dumps({"prompt_ids": c["prompt_ids"]}, separators=(",", ":")) + "\n")
            key = ("nocache_output_ids"
                   if phi3_longrope and "nocache_output_ids" in c else "output_ids")
            w.write('"output_ids":' + json.dumps(c[key], separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
