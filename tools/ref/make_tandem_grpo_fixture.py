#!/usr/bin/env python3
"""End-to-end tandem-training fixture for tests/train: the tandem-weighted GRPO loss
through a real model, every parameter's gradient from PyTorch autograd.

Reads the tiny model and batch of an existing GRPO fixture
(tests/fixtures/grpo/<arch>/{config.json, model.safetensors, cases.json}, written by
make_grpo_fixtures.py), gives every completion token a model mask (1 = written by the
trained model, 0 = by the frozen partner; drawn from a seeded generator, one completion
all partner), and evaluates the loss the llm-tandem-verl fork optimises: per-token
weights w = m + (1 - m) * partner_weight multiply verl's response mask, so they enter
both the masked sum and the token-count denominators:
  grpo    mean_s( sum_t term*a / sum_t a )          (a = completion mask * w; a count below 1 counts as 1)
  bnpo, dapo   sum term*a / sum a
  dr_grpo      sum term*a / (B * max_completion_length)
  term = -min(ratio*A, clamp(ratio, 1-eps, 1+eps_high)*A) + beta * k3 KL, ratio = exp(logp - old)
Writes tests/fixtures/grpo/<arch>/tandem_cases.json:
  {"format": "grpo-tandem-fixture", "version": 1, "arch", versions, "model_mask": [T'],
   "cases": [{"name", "config", "loss", "dlogp": [T'], "params": {hf_name: stats}}]}
with the per-parameter statistics of make_grpo_fixtures.py (norm, probe_dot, probe_abs, samples).

Usage (repository root, on a machine with torch + transformers):
    python3 tools/ref/make_tandem_grpo_fixture.py [--arch llama,qwen3]
"""
import argparse
import json
import os

FORMAT = "grpo-tandem-fixture"
VERSION = 1
EPS, EPS_HIGH = 0.2, 0.28
CASES = [
    ("grpo_pw02", dict(loss_type="grpo", partner_weight=0.2, beta=0.04, mask_truncated=False)),
    ("bnpo_pw02", dict(loss_type="bnpo", partner_weight=0.2, beta=0.0, mask_truncated=False)),
    ("dr_grpo_pw02", dict(loss_type="dr_grpo", partner_weight=0.2, beta=0.04, mask_truncated=False)),
    ("dapo_pw02", dict(loss_type="dapo", partner_weight=0.2, beta=0.0, mask_truncated=False)),
    ("dapo_pw05_trunc", dict(loss_type="dapo", partner_weight=0.5, beta=0.04, mask_truncated=True)),
    ("grpo_pw0_trunc", dict(loss_type="grpo", partner_weight=0.0, beta=0.0, mask_truncated=True)),
]


def r8(x):
    return float(f"{float(x):.8g}")


def param_stats(torch, g):
    flat = g.detach().reshape(-1).double()
    n = flat.numel()
    probe = torch.sin(torch.arange(n, dtype=torch.float64) * 0.7 + 0.3)
    idx = [(k * 7919 + 13) % n for k in range(4)]
    return {"norm": r8(flat.norm()), "probe_dot": r8((flat * probe).sum()),
            "probe_abs": r8((flat * probe).abs().sum()), "samples": [[i, r8(flat[i])] for i in idx]}


def make(arch, root, seed):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    d = os.path.join(root, arch)
    with open(os.path.join(d, "cases.json")) as f:
        fx = json.load(f)
    B = fx["batch"]
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    prompts = [torch.tensor(p) for p in B["prompts"]]
    comps = [torch.tensor(c) for c in B["completions"]]
    lens = [len(c) for c in B["completions"]]
    T, S, L = sum(lens), len(lens), B["max_completion_length"]
    gen = torch.Generator().manual_seed(seed)
    model_mask = (torch.rand(T, generator=gen) < 0.5).long()
    model_mask[: lens[0]] = 0  # one completion written by the partner alone
    old = torch.tensor(B["old_logp"], dtype=torch.float32)
    ref = torch.tensor(B["ref_logp"], dtype=torch.float32)
    adv = torch.tensor(fx["advantages"]["group"], dtype=torch.float32)
    trunc = torch.tensor(B["truncated"])
    seq_of = torch.repeat_interleave(torch.arange(S), torch.tensor(lens))

    def forward():
        lps = []
        for p, c in zip(prompts, comps):
            ids = torch.cat([p, c])[None, :]
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            lsm = torch.log_softmax(logits[p.shape[0] - 1: ids.shape[1] - 1], dim=-1)
            lps.append(lsm.gather(1, c[:, None])[:, 0])
        return torch.cat(lps)

    named = list(model.named_parameters())
    res = {"format": FORMAT, "version": VERSION, "arch": arch, "torch_version": torch.__version__,
           "transformers_version": transformers.__version__, "model_mask": model_mask.tolist(), "cases": []}
    for name, c in CASES:
        model.zero_grad(set_to_none=True)
        logp = forward()
        logp.retain_grad()
        w = model_mask.float() + (1 - model_mask.float()) * c["partner_weight"]
        m = torch.ones(T)
        if c["mask_truncated"]:
            m = m * (~trunc[seq_of]).float()
        a = m * w
        A = adv[seq_of]
        ratio = torch.exp(logp - old)
        term = -torch.min(ratio * A, torch.clamp(ratio, 1 - EPS, 1 + EPS_HIGH) * A)
        if c["beta"] != 0.0:
            dd = ref - logp
            term = term + c["beta"] * (torch.exp(dd) - dd - 1)
        num_s = torch.zeros(S).index_add(0, seq_of, term * a)
        den_s = torch.zeros(S).index_add(0, seq_of, a)
        lt = c["loss_type"]
        if lt == "grpo":
            loss = (num_s / torch.clamp(den_s, min=1.0)).mean()
        elif lt == "dr_grpo":
            loss = num_s.sum() / (S * L)
        else:
            den = den_s.sum()
            loss = num_s.sum() / torch.clamp(den, min=1.0)
        loss.backward()
        conf = dict(c, eps=EPS, eps_high=EPS_HIGH)
        res["cases"].append({"name": name, "config": conf, "loss": float(loss),
                             "dlogp": [r8(x) for x in logp.grad.tolist()],
                             "params": {n: param_stats(torch, p.grad) for n, p in named}})
    out = os.path.join(d, "tandem_cases.json")
    with open(out, "w") as f:
        json.dump(res, f)
    print(f"{arch}: {len(res['cases'])} tandem cases -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="tests/fixtures/grpo")
    ap.add_argument("--arch", default="llama,qwen3")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    for arch in args.arch.split(","):
        make(arch, args.root, args.seed)


if __name__ == "__main__":
    main()
