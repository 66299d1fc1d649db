"""bf16 agreement with transformers on real-sized shapes (run on the GPU machine).

For a random-weight Qwen3-0.6B-shaped and a Llama-3-8B-shaped model (written here by
save_pretrained), transformers decodes 8 prompts x 128 tokens greedily in bf16. Tessera then
scores every prefix of those sequences (teacher forcing: prompt + the first j generated
tokens, one request each, all submitted together; the prefix cache makes each a short
prefill) with --device cuda in bf16, and the script counts how often Tessera's next token
equals transformers' token j. Usage:
  python3 tools/gpu_bf16_agreement.py TESSERA_BINARY WORKDIR [qwen3|llama3 ...]
"""
import json
import os
import subprocess
import sys
import time

import torch
import transformers

SHAPES = {
    "qwen3_0p6b_shape": transformers.Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151645),
    "llama3_8b_shape": transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001),
}
PROMPTS, NEW_TOKENS = 8, 128


def main():
    binary, work = sys.argv[1], sys.argv[2]
    names = [n for n in SHAPES if any(n.startswith(a) for a in sys.argv[3:])] or list(SHAPES)
    for name in names:
        config = SHAPES[name]
        torch.manual_seed(0)
        t0 = time.time()
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(
                config, torch_dtype=torch.bfloat16)
        model.eval()
        path = os.path.join(work, name)
        model.save_pretrained(path)
        print(f"{name}: built and saved in {time.time() - t0:.0f} s", flush=True)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(100, config.vocab_size - 100, (16 + 2 * i,),
                                 generator=gen).tolist() for i in range(PROMPTS)]
        sequences = []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p], device="cuda")
                out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                     min_new_tokens=NEW_TOKENS, pad_token_id=0)
                sequences.append(out[0, len(p):].tolist())
            # transformers bf16 against itself: one forward pass over each whole sequence
            # (teacher forcing, as tessera is scored) instead of token-by-token decoding.
            bf16_argmax = []
            for p, s in zip(prompts, sequences):
                ids = torch.tensor([p + s], device="cuda")
                logits = model(ids).logits[0, len(p) - 1:len(p) - 1 + NEW_TOKENS]
                bf16_argmax.extend(logits.argmax(-1).tolist())
            # The same model in fp32, teacher-forced along the bf16 sequences: its argmax
            # at each position (how far fp32 numerics alone move the greedy choice).
            model = model.float()
            fp32_argmax = []
            for p, s in zip(prompts, sequences):
                ids = torch.tensor([p + s], device="cuda")
                logits = model(ids).logits[0, len(p) - 1:len(p) - 1 + NEW_TOKENS]
                fp32_argmax.extend(logits.argmax(-1).tolist())
        del model
        torch.cuda.empty_cache()
        want = [t for s in sequences for t in s]
        hf_agree = sum(a == b for a, b in zip(fp32_argmax, want))
        print(f"{name}: transformers fp32 vs transformers bf16 greedy (teacher-forced): "
              f"{hf_agree}/{len(want)} = {hf_agree / len(want):.4f}", flush=True)
        self_agree = sum(a == b for a, b in zip(bf16_argmax, want))
        print(f"{name}: transformers bf16 one-pass vs its own bf16 greedy decoding: "
              f"{self_agree}/{len(want)} = {self_agree / len(want):.4f}", flush=True)
        if os.environ.get("HF_ONLY"):
            continue
        lines = []
        for p, s in zip(prompts, sequences):
            for j in range(NEW_TOKENS):
                lines.append(json.dumps({"prompt_ids": p + s[:j]}))
        prompts_file = os.path.join(work, name + ".jsonl")
        with open(prompts_file, "w") as f:
            f.write("\n".join(lines) + "\n")
        for dtype in ("bfloat16", "float32"):
            t0 = time.time()
            run = subprocess.run(
                [binary, "generate", "--model", path, "--prompts-file", prompts_file,
                 "--max-tokens", "1", "--temperature", "0", "--ignore-eos", "--output",
                 "json", "--device", "cuda", "--dtype", dtype, "--stats-json",
                 os.path.join(work, name + ".stats.json")],
                capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{name}: tessera {dtype} failed: {run.stderr[-2000:]}")
                continue
            got = [json.loads(l)["output_ids"][0] for l in run.stdout.splitlines()]
            agree = sum(g == w for g, w in zip(got, want))
            agree32 = sum(g == w for g, w in zip(got, fp32_argmax))
            stats = json.load(open(os.path.join(work, name + ".stats.json")))
            print(f"{name}: tessera {dtype}: top-1 agreement with transformers bf16 "
                  f"{agree}/{len(want)} = {agree / len(want):.4f}, with transformers fp32 "
                  f"{agree32}/{len(want)} = {agree32 / len(want):.4f} "
                  f"({time.time() - t0:.0f} s incl. load for {len(lines)} requests; "
                  f"prefix cache {stats['prefix_cache']})", flush=True)
            summary = [l for l in run.stderr.splitlines() if "prompts:" in l]
            print("  " + (summary[-1] if summary else ""))


if __name__ == "__main__":
    main()
