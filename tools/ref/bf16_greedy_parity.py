#!/usr/bin/env python3
"""bf16 greedy parity of the CUDA engine with transformers (issue 3, item 4).

On the GPU machine: writes a random-weight model with `grpo init-model`
(which also checks that transformers loads our safetensors + config.json),
runs transformers' bf16 greedy generate() and `grpo generate --temperature 0
--device cuda --dtype bf16` from the same random prompts, and reports the
share of tokens that agree before the first divergence, and the top-1/top-2
logit margin (transformers' logits) at each divergence: a divergence after a
near-tie is expected in bf16.

Usage: python3 tools/ref/bf16_greedy_parity.py --grpo build-static/grpo [--preset qwen2.5-0.5b]
"""
import argparse, json, os, subprocess, sys, tempfile

import torch
from transformers import AutoModelForCausalLM


def model_ids(grpo, d, prompt, new):
    # A model dir with a tokenizer prints text: ask for ids through --logprobs lines instead.
    r = subprocess.run([grpo, "generate", "--model", d, "--ids", ",".join(map(str, prompt)), "--temperature", "0",
                        "--max-tokens", str(new), "--min-tokens", str(new), "--ignore-eos", "--device", "cuda",
                        "--dtype", "bf16", "--logprobs"], capture_output=True, text=True, check=True)
    return [int(l.split(" id ")[1].split()[0]) for l in r.stdout.splitlines() if " id " in l and "logprob" in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--out", default="")
    ap.add_argument("--model", default="", help="use this HF model dir instead of a random preset")
    a = ap.parse_args()
    d = a.model
    if not d:
        d = tempfile.mkdtemp(prefix="parity_")
        subprocess.run([a.grpo, "init-model", "--preset", a.preset, "--out", d, "--dtype", "bf16", "--no-tokenizer",
                        "--seed", "3"], check=True)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).cuda().eval()
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, V, (a.prompts, a.prompt_len), generator=g)
    agree_prefix, total, same_pos, margins = 0, 0, 0, []
    per_prompt = []
    for i in range(a.prompts):
        ids = prompts[i:i + 1].cuda()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=a.new, min_new_tokens=a.new, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        hf = out.sequences[0, a.prompt_len:].tolist()
        scores = [s[0].float() for s in out.scores]
        r = subprocess.run([a.grpo, "generate", "--model", d, "--ids", ",".join(map(str, prompts[i].tolist())),
                            "--temperature", "0", "--max-tokens", str(a.new), "--min-tokens", str(a.new),
                            "--ignore-eos", "--device", "cuda", "--dtype", "bf16"],
                           capture_output=True, text=True, check=True)
        ours = [int(x) for x in r.stdout.strip().splitlines()[0].split(",")] if not a.model else \
            model_ids(a.grpo, d, prompts[i].tolist(), a.new)
        n = 0
        while n < min(len(hf), len(ours)) and hf[n] == ours[n]:
            n += 1
        margin = None
        if n < len(hf):
            top2 = torch.topk(scores[n], 2).values
            margin = float(top2[0] - top2[1])
            margins.append(margin)
        agree_prefix += n
        total += len(hf)
        same_pos += sum(int(x == y) for x, y in zip(hf, ours))
        per_prompt.append({"agree_prefix": n, "len": len(hf), "margin_at_divergence": margin})
        print(f"prompt {i}: {n}/{len(hf)} tokens agree before divergence; margin there {margin}")
    res = {"preset": a.preset if not a.model else None, "model": a.model or None, "prompts": a.prompts, "new_tokens": a.new,
           "prefix_agreement_rate": agree_prefix / total, "positionwise_agreement_rate": same_pos / total,
           "margins_at_divergence": margins, "per_prompt": per_prompt,
           "transformers_loaded_our_checkpoint": True}
    print(json.dumps({k: v for k, v in res.items() if k != "per_prompt"}))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=2)


if __name__ == "__main__":
    main()
