#!/usr/bin/env python3
"""Checks that peft reads an adapter written by grpo.cpp as grpo.cpp means it.

Loads BASE with transformers, applies the adapter DIR with
peft.PeftModel.from_pretrained, and compares its logits on a few random token
sequences with those of MERGED (the checkpoint `grpo merge-lora` wrote from the
same base and adapter); also compares peft's merge_and_unload() weights with
MERGED's tensor by tensor. Exits 1 on any difference above the tolerance.

    grpo train examples/lora.toml --out runs/lora
    grpo merge-lora --model models/arith-tiny --lora runs/lora/checkpoint-20 --out /tmp/merged --dtype f32
    python3 tools/ref/check_peft_load.py --base models/arith-tiny --adapter runs/lora/checkpoint-20 --merged /tmp/merged
"""
import argparse
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="base HF model directory")
    ap.add_argument("--adapter", required=True, help="adapter directory written by grpo.cpp")
    ap.add_argument("--merged", required=True, help="grpo merge-lora output (--dtype f32)")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(a.base, dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(base, a.adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(a.merged, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    V = merged.config.vocab_size
    worst = 0.0
    with torch.no_grad():
        for n in (5, 17, 33):
            x = torch.randint(0, V, (1, n))
            d = (pm(input_ids=x).logits - merged(input_ids=x).logits).abs().max().item()
            worst = max(worst, d)
    print(f"logits peft(base + adapter) vs grpo merge-lora: max |diff| {worst:.3g}")
    ok = worst <= a.tol

    ref = pm.merge_and_unload().state_dict()
    mine = merged.state_dict()
    worst_w, where = 0.0, ""
    for k, v in ref.items():
        if k not in mine:
            print(f"missing in merged checkpoint: {k}")
            ok = False
            continue
        d = (v.float() - mine[k].float()).abs().max().item()
        if d > worst_w:
            worst_w, where = d, k
    print(f"weights peft merge_and_unload vs grpo merge-lora: max |diff| {worst_w:.3g} ({where})")
    ok = ok and worst_w <= a.tol
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
