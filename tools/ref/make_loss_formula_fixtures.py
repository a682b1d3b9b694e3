#!/usr/bin/env python3
"""Reference values of TRL GRPOTrainer's loss family for tests/train (stdlib only).

Re-implements TRL's `_compute_loss` on padded (B, T) lists exactly as the
tensor code reads -- per-token or per-sequence importance ratio
(`importance_sampling_level`, "sequence" = GSPO), the clipped surrogate of
grpo / bnpo / dr_grpo / dapo, CISPO's detached clamp(ratio, max=epsilon_high)
times advantage times logp, the vLLM importance-sampling correction (ratio of
the trainer's generation-time logprobs to the sampler's, token_/sequence_
truncate/mask with its cap), the k3 KL term and each loss type's normaliser --
and differentiates it with forward-mode dual numbers that follow torch's
backward rules (clamp passes the gradient on [min, max], minimum splits a tie,
detach stops it). It shares no code with the C++ loss (src/train/grpo_loss.cpp).

Writes tests/fixtures/grpo/loss_formulas.json:
  python3 tools/ref/make_loss_formula_fixtures.py [--out PATH] [--seed N]
One case per (loss_type, importance_sampling_level, IS mode) plus variations
(β > 0, mask_truncated_completions, a partial completion mask, per-token loss
weights -- grpo.cpp's extension, a multiplier on the per-token loss after the
KL term that also weights the grpo/bnpo token counts). Inputs are rounded to float32 so that the C++ side reads the very
numbers used here.
"""
import argparse
import json
import math
import random
import struct


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


class D:
    """A value and its gradient with respect to the per-token logprobs (sparse)."""

    __slots__ = ("v", "g")

    def __init__(self, v, g=None):
        self.v = float(v)
        self.g = g if g is not None else {}

    @staticmethod
    def lift(x):
        return x if isinstance(x, D) else D(x)

    def _comb(self, o, a, b):  # a * self.g + b * o.g
        g = {k: a * d for k, d in self.g.items()}
        for k, d in o.g.items():
            g[k] = g.get(k, 0.0) + b * d
        return g

    def __add__(self, o):
        o = D.lift(o)
        return D(self.v + o.v, self._comb(o, 1.0, 1.0))

    __radd__ = __add__

    def __sub__(self, o):
        o = D.lift(o)
        return D(self.v - o.v, self._comb(o, 1.0, -1.0))

    def __rsub__(self, o):
        return D.lift(o) - self

    def __neg__(self):
        return D(-self.v, {k: -d for k, d in self.g.items()})

    def __mul__(self, o):
        o = D.lift(o)
        return D(self.v * o.v, self._comb(o, o.v, self.v))

    __rmul__ = __mul__

    def __truediv__(self, o):
        assert not isinstance(o, D)
        return D(self.v / o, {k: d / o for k, d in self.g.items()})


def dexp(x):
    e = math.exp(x.v)
    return D(e, {k: e * d for k, d in x.g.items()})


def detach(x):
    return D(x.v)


def clamp(x, lo=None, hi=None):
    """torch.clamp: value clipped; gradient passed where lo <= x <= hi."""
    v = x.v
    if lo is not None and v < lo:
        return D(lo)
    if hi is not None and v > hi:
        return D(hi)
    return D(v, dict(x.g))


def minimum(a, b):
    """torch.minimum: gradient to the smaller; a tie splits it in half."""
    if a.v < b.v:
        return D(a.v, dict(a.g))
    if b.v < a.v:
        return D(b.v, dict(b.g))
    return D(a.v, a._comb(b, 0.5, 0.5))


def trl_loss(cfg, case):
    """TRL's loss on one padded batch; returns (loss, dloss/dlogp per packed token)."""
    lens = case["lens"]
    B, T = len(lens), max(lens)
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)

    def padded(name, fill=0.0):
        src = case.get(name)
        if src is None:
            return None
        return [[src[offs[b] + t] if t < lens[b] else fill for t in range(T)] for b in range(B)]

    # Completion mask: padding 0, the case's own mask, truncated rows zeroed (TRL masks them at generation).
    if case.get("mask") is not None:
        mask = padded("mask")
    else:
        mask = [[1.0 if t < lens[b] else 0.0 for t in range(T)] for b in range(B)]
    if cfg["mask_truncated"]:
        mask = [[0.0] * T if case["truncated"][b] else row for b, row in enumerate(mask)]
    logp_v = padded("logp")
    logp = [[D(logp_v[b][t], {offs[b] + t: 1.0}) if t < lens[b] else D(0.0) for t in range(T)] for b in range(B)]
    old_v = padded("old_logp")
    # old_per_token_logps: the stored generation-time values, else per_token_logps.detach().
    old = [[D(old_v[b][t]) if old_v else detach(logp[b][t]) for t in range(T)] for b in range(B)]
    A = case["advantages"]
    eps_low, eps_high = cfg["eps"], cfg["eps_high"]

    log_ratio = [[logp[b][t] - old[b][t] for t in range(T)] for b in range(B)]
    if cfg["is_level"] == "token":
        coef_1 = [[dexp(log_ratio[b][t]) for t in range(T)] for b in range(B)]
    else:
        coef_1 = []
        for b in range(B):
            s = D(0.0)
            for t in range(T):
                s = s + log_ratio[b][t] * mask[b][t]
            w = s / max(1.0, sum(mask[b]))
            e = dexp(w)
            coef_1.append([e] * T)  # (B, 1) broadcast over T

    per_token_loss = [[None] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            c1 = coef_1[b][t]
            if cfg["loss_type"] == "cispo":
                clamped = detach(clamp(c1, hi=eps_high))
                per_token_loss[b][t] = -(clamped * A[b] * logp[b][t])
            else:
                c2 = clamp(c1, lo=1 - eps_low, hi=1 + eps_high)
                per_token_loss[b][t] = -minimum(c1 * A[b], c2 * A[b])

    mode = cfg["is_mode"]
    if mode != "none":
        samp = padded("rollout_logp")
        # The trainer's generation-time logprobs: stored old ones, else the current (same weights).
        gen = old_v if old_v else logp_v
        diff = [[(gen[b][t] - samp[b][t]) * mask[b][t] for t in range(T)] for b in range(B)]
        cap = cfg["is_cap"]
        for b in range(B):
            if mode.startswith("sequence"):
                rs = [math.exp(sum(diff[b]))] * T
            else:
                rs = [math.exp(d) for d in diff[b]]
            for t in range(T):
                r = rs[t]
                if mode.endswith("truncate"):
                    r = min(r, cap)
                elif r > cap:
                    r = 0.0
                per_token_loss[b][t] = per_token_loss[b][t] * r

    if cfg["beta"] != 0.0:
        ref = padded("ref_logp")
        for b in range(B):
            for t in range(T):
                d = ref[b][t] - logp[b][t]
                kl = dexp(d) - d - 1.0
                per_token_loss[b][t] = per_token_loss[b][t] + kl * cfg["beta"]

    weights = padded("weights")
    if weights:
        for b in range(B):
            for t in range(T):
                per_token_loss[b][t] = per_token_loss[b][t] * weights[b][t]

    def masked_sum(b):
        s = D(0.0)
        for t in range(T):
            s = s + per_token_loss[b][t] * mask[b][t]
        return s

    # Token means count a token of weight w as w tokens (grpo.cpp's extension; with
    # unit weights these are TRL's counts).
    def wcount(b):
        return sum(mask[b][t] * (weights[b][t] if weights else 1.0) for t in range(T))

    lt = cfg["loss_type"]
    if lt == "grpo":
        loss = D(0.0)
        for b in range(B):
            loss = loss + masked_sum(b) / max(1.0, wcount(b))
        loss = loss / B
    else:
        total = D(0.0)
        for b in range(B):
            total = total + masked_sum(b)
        if lt == "bnpo":
            loss = total / max(1.0, sum(wcount(b) for b in range(B)))
        elif lt == "dr_grpo":
            loss = total / (B * cfg["max_completion_length"])
        else:  # dapo, cispo
            loss = total / case["num_items_in_batch"]
    grad = [loss.g.get(i, 0.0) for i in range(offs[-1])]
    return loss.v, grad, coef_1, mask


def near_kink(cfg, coef_1, mask, A):
    """True when a ratio sits within 1e-4 of a clip edge (float32 rounding could flip the branch)."""
    edges = [cfg["eps_high"]] if cfg["loss_type"] == "cispo" else [1 - cfg["eps"], 1 + cfg["eps_high"]]
    for b, row in enumerate(coef_1):
        for t, c in enumerate(row):
            if mask[b][t] and any(abs(c.v - e) < 1e-4 for e in edges):
                return True
    return False


def make_case(rng, cfg, variant):
    B = rng.randint(2, 4)
    lens = [rng.randint(1, 6) for _ in range(B)]
    n = sum(lens)
    logp = [f32(rng.uniform(-3.0, -0.05)) for _ in range(n)]
    case = {"lens": lens, "logp": logp, "advantages": [f32(rng.gauss(0, 1)) for _ in range(B)],
            "truncated": [b > 0 and rng.random() < 0.3 for b in range(B)]}
    if variant["old"]:
        case["old_logp"] = [f32(x + rng.gauss(0, 0.25)) for x in logp]
    base = case.get("old_logp", logp)
    case["rollout_logp"] = [f32(x + rng.gauss(0, 0.3)) for x in base]
    if cfg["beta"] != 0.0:
        case["ref_logp"] = [f32(x + rng.gauss(0, 0.2)) for x in logp]
    if variant["mask"]:
        case["mask"] = [0.0 if rng.random() < 0.25 else 1.0 for _ in range(n)]
    if variant["weights"]:
        case["weights"] = [f32(rng.uniform(0.25, 2.0)) for _ in range(n)]
    # TRL's num_items_in_batch: masked tokens of the whole generation batch (here bigger than this one).
    case["num_items_in_batch"] = float(n + rng.randint(0, 5))
    return case


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/grpo/loss_formulas.json")
    ap.add_argument("--seed", type=int, default=20240614)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = []
    i = 0
    for lt in ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"]:
        for level in ["token", "sequence"]:
            for mode in ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]:
                i += 1
                variant = {"old": i % 3 != 0, "mask": i % 4 == 1, "weights": i % 5 == 2}
                for _attempt in range(100):
                    eps = f32(rng.choice([0.05, 0.1, 0.2]))
                    cfg = {
                        "loss_type": lt,
                        "is_level": level,
                        "is_mode": mode,
                        "beta": f32(rng.choice([0.0, 0.04])),
                        "eps": eps,
                        "eps_high": f32(rng.choice([1.02, 1.1, 5.0])) if lt == "cispo" else f32(
                            rng.choice([eps, 0.28])),
                        "is_cap": f32(rng.choice([1.2, 1.5, 3.0])),
                        "mask_truncated": rng.random() < 0.5,
                        "max_completion_length": 8,
                    }
                    case = make_case(rng, cfg, variant)
                    loss, grad, coef_1, mask = trl_loss(cfg, case)
                    if not near_kink(cfg, coef_1, mask, case["advantages"]) and any(abs(g) > 1e-3 for g in grad):
                        break
                else:
                    raise SystemExit("no case away from the clip edges for " + lt + "/" + level + "/" + mode)
                case.update({"name": "%s/%s/%s" % (lt, level, mode), "config": cfg, "loss": loss, "dlogp": grad})
                cases.append(case)
    with open(args.out, "w") as f:
        json.dump({"version": 1, "generator": "tools/ref/make_loss_formula_fixtures.py", "seed": args.seed,
                   "cases": cases}, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), args.out))


if __name__ == "__main__":
    main()
