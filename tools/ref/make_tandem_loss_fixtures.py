#!/usr/bin/env python3
"""Reference values of the tandem-training loss for tests/train (stdlib only).

Tandem training (arXiv 2510.13551, the llm-tandem-verl fork of verl) weighs each
completion token by w = m + (1 - m) * partner_weight, m = 1 where the trained
model wrote the token, and multiplies the response mask by w, so the weights
enter both the masked sum and the token-count denominator of verl's loss
aggregation:
  token-mean (dapo, bnpo, cispo):  sum(loss * a) / sum(a)
  seq-mean-token-mean (grpo):      mean_b [ sum_t(loss * a) / sum_t(a) ]
  seq-mean-token-sum-norm (dr_grpo): sum(loss * a) / (B * max_completion_length)
with a = completion_mask * w. A count below 1 counts as 1, grpo.cpp's rule for every
weighted count (the fork's is "a zero sum counts as 1"; the two differ only when a
sequence's or the batch's weighted count is in (0, 1), e.g. a short partner-only
sequence, which case 0 of every loss type has).
The per-token loss is the clipped surrogate (token-level ratio against stored
old logprobs), or CISPO's detached clamp(ratio, max=eps_high) * A * logp, plus
beta * k3 KL. Gradients come from the dual numbers of
make_loss_formula_fixtures.py (same folder), which follow torch's backward
rules; nothing is shared with the C++ loss (src/train/grpo_loss.cpp).

Writes tests/fixtures/grpo/tandem_loss.json:
  python3 tools/ref/make_tandem_loss_fixtures.py [--out PATH] [--seed N]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_loss_formula_fixtures import D, clamp, detach, dexp, f32, minimum  # noqa: E402


def tandem_loss(cfg, case):
    lens = case["lens"]
    B = len(lens)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)
    pw = cfg["partner_weight"]
    A = case["advantages"]
    eps_low, eps_high = cfg["eps"], cfg["eps_high"]
    seq_num, seq_den = [], []
    for b in range(B):
        num, den = D(0.0), 0.0
        for t in range(offs[b], offs[b + 1]):
            m = 0.0 if (cfg["mask_truncated"] and case["truncated"][b]) else 1.0
            a = m * (case["model_mask"][t] + (1 - case["model_mask"][t]) * pw)
            logp = D(case["logp"][t], {t: 1.0})
            ratio = dexp(logp - case["old_logp"][t])
            if cfg["loss_type"] == "cispo":
                loss = -(detach(clamp(ratio, hi=eps_high)) * A[b] * logp)
            else:
                loss = -minimum(ratio * A[b], clamp(ratio, lo=1 - eps_low, hi=1 + eps_high) * A[b])
            if cfg["beta"] != 0.0:
                d = case["ref_logp"][t] - logp
                loss = loss + (dexp(d) - d - 1.0) * cfg["beta"]
            num = num + loss * a
            den += a
        seq_num.append(num)
        seq_den.append(den)
    lt = cfg["loss_type"]
    if lt == "grpo":
        total = D(0.0)
        for b in range(B):
            total = total + seq_num[b] / max(1.0, seq_den[b])
        loss = total / B
    else:
        total = D(0.0)
        for b in range(B):
            total = total + seq_num[b]
        if lt == "dr_grpo":
            loss = total / (B * cfg["max_completion_length"])
        else:
            den = sum(seq_den)
            loss = total / max(1.0, den)
    return loss.v, [loss.g.get(i, 0.0) for i in range(offs[-1])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/grpo/tandem_loss.json")
    ap.add_argument("--seed", type=int, default=20251017)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = []
    for lt in ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"]:
        for pw in [0.2, 0.5, 0.0]:
            B = rng.randint(2, 4)
            lens = [rng.randint(1, 7) for _ in range(B)]
            n = sum(lens)
            logp = [f32(rng.uniform(-3.0, -0.05)) for _ in range(n)]
            case = {
                "lens": lens,
                "logp": logp,
                # Old logprobs close enough that some ratios fall inside and some outside the clip range.
                "old_logp": [f32(x + rng.gauss(0, 0.15)) for x in logp],
                "ref_logp": [f32(x + rng.gauss(0, 0.2)) for x in logp],
                "advantages": [f32(rng.gauss(0, 1)) for _ in range(B)],
                "truncated": [b > 0 and rng.random() < 0.3 for b in range(B)],
                "model_mask": [1 if rng.random() < 0.5 else 0 for _ in range(n)],
            }
            # One sequence written by the partner alone (its denominator is pure partner weight).
            for t in range(lens[0]):
                case["model_mask"][t] = 0
            eps = f32(rng.choice([0.1, 0.2]))
            cfg = {
                "loss_type": lt,
                "partner_weight": f32(pw),
                "eps": eps,
                "eps_high": f32(rng.choice([1.1, 5.0])) if lt == "cispo" else f32(rng.choice([eps, 0.28])),
                "beta": f32(rng.choice([0.0, 0.04])),
                "mask_truncated": rng.random() < 0.5,
                "max_completion_length": 8,
            }
            loss, grad = tandem_loss(cfg, case)
            case.update({"name": "%s/pw=%g" % (lt, pw), "config": cfg, "loss": loss, "dlogp": grad})
            cases.append(case)
    with open(args.out, "w") as f:
        json.dump({"version": 1, "generator": "tools/ref/make_tandem_loss_fixtures.py", "seed": args.seed,
                   "cases": cases}, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), args.out))


if __name__ == "__main__":
    main()
