#!/usr/bin/env python3
"""Checks that a `grpo train` checkpoint is a working Hugging Face model: transformers
loads it (AutoModelForCausalLM + AutoTokenizer from the checkpoint folder) and its
greedy completions equal those of `grpo generate` on the same checkpoint.

Usage (GPU machine): python3 tools/ref/check_train_checkpoint.py --grpo build-static/grpo --ckpt DIR
"""
import argparse, subprocess, sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["Tom has 3 apples, gets 4 more. How many now?\n", "Ann has 9 pens, gives away 5. How many now?\n",
           "Leo has 2 cards, gets 7 more. How many now?\n", "Sam has 8 books, gives away 1. How many now?\n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--new", type=int, default=20)
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(a.ckpt)
    model = AutoModelForCausalLM.from_pretrained(a.ckpt, dtype=torch.float32).eval()
    ok = True
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=a.new, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        hf = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        r = subprocess.run([a.grpo, "generate", "--model", a.ckpt, "--prompt", p, "--temperature", "0",
                            "--max-tokens", str(a.new), "--device", "cpu"], capture_output=True, text=True, check=True)
        ours = r.stdout.split("[finish")[0].rstrip("\n")
        same = hf == ours
        ok &= same
        print(f"{'PASS' if same else 'FAIL'} {p.strip()!r}: transformers {hf!r} grpo {ours!r}")
    print("checkpoint loads in transformers and greedy outputs agree" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
