#!/usr/bin/env python3
"""Reference fixtures for the trainer (tests/train/): GRPO losses and gradients.

For each architecture (llama, qwen2, qwen3, mistral) builds a tiny random model
(hidden 64, 2 layers, 4 heads, 2 kv heads, intermediate 128, vocab 320, float32,
eager attention, on the CPU), saves it with save_pretrained into <out>/<arch>/,
and evaluates TRL's GRPO loss (formulas written out below with plain autograd,
no TRL import) on one fixed batch of 2 prompts x 3 samples for many option
combinations. Output per architecture:

  <arch>/config.json, model.safetensors      the model (save_pretrained)
  <arch>/cases.json                          batch + expected values, see below
  <arch>/grads_full.safetensors              every parameter's gradient (HF names)
                                             for the case "full" (llama, qwen3)

cases.json = {"format": "grpo-loss-fixture", "version": 1, "arch", versions,
  "batch": {"prompts": [[ids]...] (one per sequence), "completions": [[ids]...],
            "truncated": [bools], "rewards": [6], "group_size": 3,
            "max_completion_length": L, "temperature": 1.0,
            "logp", "entropy", "old_logp", "ref_logp", "rollout_logp", "weights":
            packed (T') floats over completion tokens, sequence after sequence},
  "advantages": {"group": [6], "batch": [6], "none": [6]},
  "cases": [{"name", "config": {...}, "loss", "metrics": {...},
             "dlogp": [T'] (d loss / d logp, packed),
             "params": {hf_name: {"norm", "probe_dot", "probe_abs", "samples": [[idx, val]...]}}}]}

probe_dot = sum_i g[i] * sin(0.7 * i + 0.3) over the flattened (row-major) HF
gradient, probe_abs = sum_i |g[i] * sin(0.7 * i + 0.3)| (scale for the
tolerance), samples = g at indices (k * 7919 + 13) % numel, k = 0..3.
These per-parameter statistics let every loss variant check every parameter's
gradient while keeping the fixtures small (< 3 MB); "full" also stores them whole.

Usage (from the repository root, on a machine with torch + transformers):
    python3 tools/ref/make_grpo_fixtures.py --out tests/fixtures/grpo [--only mistral_swa,qwen2_swa]
"""
import argparse
import json
import math
import os

FORMAT = "grpo-loss-fixture"
VERSION = 1

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, hidden_act="silu", rms_norm_eps=1e-6)

# name -> (model_type, extra config, store full gradients)
ARCHS = {
    "llama": ("llama", dict(tie_word_embeddings=False, attention_bias=False), True),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=False), False),
    "qwen3": ("qwen3", dict(tie_word_embeddings=True, head_dim=16, attention_bias=False,
                            use_sliding_window=False), True),
    "mistral": ("mistral", dict(tie_word_embeddings=False, sliding_window=4096), False),
    # Sliding windows shorter than the 7..13-token sequences, so the backward pass
    # through the windowed mask is checked: every layer (Mistral), and only layer 1
    # (Qwen2, max_window_layers=1). The C++ tests skip these when absent.
    "mistral_swa": ("mistral", dict(tie_word_embeddings=False, sliding_window=4), True),
    "qwen2_swa": ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
                                max_window_layers=1), True),
}

PROMPT_LENS = [5, 5, 5, 7, 7, 7]      # two prompts, three samples each
COMPLETION_LENS = [4, 6, 3, 5, 2, 6]
MAX_COMPLETION = 6                    # completions of this length without EOS are "truncated"
TRUNCATED = [False, True, False, False, False, True]
REWARDS = [1.0, 0.0, 0.5, 0.2, 0.3, 0.9]
GROUP = 3
EPS, EPS_HIGH = 0.2, 0.28

# Loss option combinations. Keys: loss_type, beta, is_mode (none | token_truncate |
# token_mask | sequence_truncate | sequence_mask; "sequence" = product of token ratios,
# i.e. exp of the summed log-ratio), is_geomean (sequence level: exp of the MEAN log-ratio
# instead), is_cap, use_old (False: old = current detached, mu = 1), use_weights,
# mask_truncated, dapo_num_items (dapo normaliser: completion tokens of the whole generation
# batch divided by the number of processes; default the local count), scale_rewards.
BASE = dict(loss_type="grpo", beta=0.0, eps=EPS, eps_high=EPS_HIGH, is_mode="none", is_geomean=False,
            is_cap=2.0, use_old=True, use_weights=False, mask_truncated=False, dapo_num_items=None,
            scale_rewards="group", n_micro=1)
CASES = [
    ("grpo_b0", dict(loss_type="grpo")),
    ("bnpo_b0", dict(loss_type="bnpo")),
    ("dr_grpo_b0", dict(loss_type="dr_grpo")),
    ("dapo_b0", dict(loss_type="dapo")),
    ("dapo_global", dict(loss_type="dapo", dapo_num_items=2 * sum(COMPLETION_LENS))),
    ("grpo_b004", dict(loss_type="grpo", beta=0.04)),
    ("bnpo_b004", dict(loss_type="bnpo", beta=0.04)),
    ("dr_grpo_b004", dict(loss_type="dr_grpo", beta=0.04)),
    ("dapo_b004", dict(loss_type="dapo", beta=0.04)),
    ("grpo_onpolicy", dict(loss_type="grpo", use_old=False, beta=0.04)),
    ("grpo_tis", dict(loss_type="grpo", is_mode="token_truncate", is_cap=1.1)),
    ("bnpo_mis", dict(loss_type="bnpo", is_mode="token_mask", is_cap=1.1)),
    ("dr_grpo_seq_trunc", dict(loss_type="dr_grpo", is_mode="sequence_truncate", is_cap=1.2)),
    ("grpo_seq_mask", dict(loss_type="grpo", is_mode="sequence_mask", is_cap=1.2)),
    ("grpo_seq_geo_trunc", dict(loss_type="grpo", is_mode="sequence_truncate", is_geomean=True, is_cap=1.05)),
    ("grpo_weights", dict(loss_type="grpo", use_weights=True, beta=0.04)),
    ("grpo_mask_trunc", dict(loss_type="grpo", mask_truncated=True)),
    ("bnpo_scale_batch", dict(loss_type="bnpo", scale_rewards="batch")),
    ("dr_grpo_scale_none", dict(loss_type="dr_grpo", scale_rewards="none")),
    ("full", dict(loss_type="bnpo", beta=0.04, is_mode="token_truncate", is_cap=1.1,
                  use_weights=True, mask_truncated=True)),
]


def randomise(model, torch, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def advantages(torch, rewards, group, mode):
    """TRL: A = r - mean_group(r); / (std + 1e-4) with std unbiased (N-1) over the group
    ("group") or over the whole batch ("batch"); "none" leaves A unscaled."""
    r = torch.tensor(rewards, dtype=torch.float64)
    g = r.view(-1, group)
    a = r - g.mean(dim=1).repeat_interleave(group)
    if mode == "group":
        a = a / (g.std(dim=1).repeat_interleave(group) + 1e-4)
    elif mode == "batch":
        a = a / (r.std() + 1e-4)
    return a.float()


def pad(torch, segs, L):
    return torch.stack([torch.nn.functional.pad(s, (0, L - s.shape[0])) for s in segs])


def grpo_loss(torch, logp, inp, cfg):
    """TRL GRPOTrainer._compute_loss over padded (B, L) tensors. logp requires grad.

    ratio = exp(logp - old);  old = logp.detach() when use_old is False (mu = 1)
    surrogate = -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps_high) * A)
    IS (vLLM correction): w = exp(old - rollout) per token (token_*) or exp(sum_t(old - rollout))
        per sequence (sequence_*; geometric mean: exp(mean_t)); *_truncate: min(w, cap);
        *_mask: w > cap -> 0; surrogate *= w (detached)
    kl = exp(ref - logp) - (ref - logp) - 1;  term = surrogate + beta * kl;  term *= weight
    token counts are weighted (wm = m * weight; = m without weights):
    grpo:    mean_s(sum_t term*m / max(1, sum_t wm)) / n_micro
    bnpo:    sum term*m / max(1, sum wm) / n_micro
    dr_grpo: sum term*m / (B * max_completion_length) / n_micro
    dapo:    sum term*m / num_items (sum wm over the whole generation batch)
    """
    mask = inp["mask"].clone()
    if cfg["mask_truncated"]:
        mask = mask * (~inp["truncated"]).float()[:, None]
    A = inp["adv_" + cfg["scale_rewards"]][:, None]
    old = inp["old"] if cfg["use_old"] else logp.detach()
    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1 - cfg["eps"], 1 + cfg["eps_high"])
    term = -torch.min(ratio * A, clipped * A)
    mode = cfg["is_mode"]
    if mode != "none":
        diff = (old.detach() - inp["rollout"]) * mask
        if mode.startswith("sequence"):
            s = diff.sum(-1, keepdim=True)
            if cfg["is_geomean"]:
                s = s / mask.sum(-1, keepdim=True).clamp(min=1.0)
            w = torch.exp(s)
        else:
            w = torch.exp(diff)
        if mode.endswith("truncate"):
            w = torch.clamp(w, max=cfg["is_cap"])
        else:
            w = w.masked_fill(w > cfg["is_cap"], 0.0)
        term = term * w
    kl = None
    if cfg["beta"] != 0.0:
        d = inp["ref"] - logp
        kl = torch.exp(d) - d - 1
        term = term + cfg["beta"] * kl
    if cfg["use_weights"]:
        term = term * inp["weights"]
    wm = mask * inp["weights"] if cfg["use_weights"] else mask
    B = logp.shape[0]
    lt, k = cfg["loss_type"], cfg["n_micro"]
    if lt == "grpo":
        loss = ((term * mask).sum(-1) / wm.sum(-1).clamp(min=1.0)).mean() / k
    elif lt == "bnpo":
        loss = (term * mask).sum() / wm.sum().clamp(min=1.0) / k
    elif lt == "dr_grpo":
        loss = (term * mask).sum() / (B * MAX_COMPLETION) / k
    elif lt == "dapo":
        n = cfg["dapo_num_items"] if cfg["dapo_num_items"] is not None else float(wm.sum())
        loss = (term * mask).sum() / n
    else:
        raise ValueError(lt)

    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        mmean = lambda x: float((x.float() * mask).sum() / n_tok)  # noqa: E731
        low = (ratio < 1 - cfg["eps"]) & (A < 0)
        high = (ratio > 1 + cfg["eps_high"]) & (A > 0)
        metrics = {"clip_low": mmean(low), "clip_high": mmean(high), "clip_region": mmean(low | high),
                   "entropy": mmean(inp["entropy"]), "kl": mmean(kl) if kl is not None else 0.0}
        # rollout vs trainer (current logp): |delta| max/mean and the k3 estimate of
        # KL(rollout || trainer) with samples from the rollout policy: exp(t - r) - (t - r) - 1
        dt = logp.detach() - inp["rollout"]
        sel = mask.bool()
        metrics["rollout_max_abs_diff"] = float(dt.abs()[sel].max())
        metrics["rollout_mean_abs_diff"] = float(dt.abs()[sel].mean())
        metrics["rollout_kl"] = mmean(torch.exp(dt) - dt - 1)
    return loss, metrics


def r8(x):
    """8 significant digits (JSON size; far below the 1e-4 test tolerance)."""
    return float(f"{float(x):.8g}")


def param_stats(torch, g):
    flat = g.detach().reshape(-1).double()
    n = flat.numel()
    probe = torch.sin(torch.arange(n, dtype=torch.float64) * 0.7 + 0.3)
    idx = [(k * 7919 + 13) % n for k in range(4)]
    return {"norm": r8(flat.norm()), "probe_dot": r8((flat * probe).sum()),
            "probe_abs": r8((flat * probe).abs().sum()),
            "samples": [[i, r8(flat[i])] for i in idx]}


def make_one(name, model_type, extra, full, out_dir, seed):
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    kwargs = dict(COMMON)
    kwargs.update(extra)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    randomise(model, torch, gen)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tying broken"
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)

    V = cfg.vocab_size
    prompts_by_group = [torch.randint(3, V, (PROMPT_LENS[g * GROUP],), generator=gen) for g in range(2)]
    prompts = [prompts_by_group[i // GROUP] for i in range(6)]
    comps = [torch.randint(3, V, (n,), generator=gen) for n in COMPLETION_LENS]
    T = sum(COMPLETION_LENS)
    pert = {k: torch.randn(T, generator=gen) * s for k, s in (("old", 0.15), ("ref", 0.1), ("rollout", 0.1))}
    weights_packed = 0.25 + 0.75 * torch.rand(T, generator=gen)

    def forward():
        """Per-sequence forward (no padding); returns packed logp (T') and entropy (T')."""
        lps, ents = [], []
        for p, c in zip(prompts, comps):
            ids = torch.cat([p, c])[None, :]
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            logits = logits[p.shape[0] - 1: ids.shape[1] - 1] / 1.0  # temperature 1
            lsm = torch.log_softmax(logits, dim=-1)
            lps.append(lsm.gather(1, c[:, None])[:, 0])
            ents.append(-(lsm.exp() * lsm).sum(-1).detach())
        return torch.cat(lps), torch.cat(ents)

    with torch.no_grad():
        logp0, ent0 = forward()
    # Inputs are rounded as they are written to JSON, so that C++ reads exactly what was used.
    q8 = lambda x: torch.tensor([r8(v) for v in x.tolist()], dtype=torch.float32)  # noqa: E731
    old = q8(logp0 + pert["old"])
    ref = q8(logp0 + pert["ref"])
    rollout = q8(logp0 + pert["rollout"])
    weights_packed = q8(weights_packed)

    def segs(x):
        out, o = [], 0
        for n in COMPLETION_LENS:
            out.append(x[o:o + n])
            o += n
        return out

    L = MAX_COMPLETION
    adv = {m: advantages(torch, REWARDS, GROUP, m) for m in ("group", "batch", "none")}
    inp = {"mask": pad(torch, [torch.ones(n) for n in COMPLETION_LENS], L),
           "truncated": torch.tensor(TRUNCATED), "old": pad(torch, segs(old), L),
           "ref": pad(torch, segs(ref), L), "rollout": pad(torch, segs(rollout), L),
           "weights": pad(torch, segs(weights_packed), L), "entropy": pad(torch, segs(ent0), L)}
    for m, a in adv.items():
        inp["adv_" + m] = a

    flt = lambda x: [r8(v) for v in x.tolist()]  # noqa: E731
    # weights_in_counts: per-token weights enter the token-mean counts (fixtures without it predate that).
    res = {"format": FORMAT, "version": VERSION, "weights_in_counts": True, "arch": name, "model_type": model_type,
           "torch_version": torch.__version__, "transformers_version": transformers.__version__,
           "batch": {"prompts": [p.tolist() for p in prompts], "completions": [c.tolist() for c in comps],
                     "truncated": TRUNCATED, "rewards": REWARDS, "group_size": GROUP,
                     "max_completion_length": MAX_COMPLETION, "temperature": 1.0,
                     "logp": flt(logp0), "entropy": flt(ent0), "old_logp": flt(old), "ref_logp": flt(ref),
                     "rollout_logp": flt(rollout), "weights": flt(weights_packed)},
           "advantages": {m: flt(a) for m, a in adv.items()}, "cases": []}

    named = [(n, p) for n, p in model.named_parameters()]
    cases = [(cn, dict(BASE, **over)) for cn, over in CASES] + [("sft", None)]
    for cname, c in cases:
        model.zero_grad(set_to_none=True)
        logp, _ = forward()
        logp.retain_grad()
        if c is None:  # SFT: mean cross-entropy over completion tokens
            loss = -logp.mean()
            metrics, conf = {}, {"loss_type": "sft"}
        else:
            loss, metrics = grpo_loss(torch, pad(torch, segs(logp), L), inp, c)
            conf = c
        loss.backward()
        entry = {"name": cname, "config": conf, "loss": float(loss), "metrics": metrics,
                 "dlogp": flt(logp.grad), "params": {n: param_stats(torch, p.grad) for n, p in named}}
        res["cases"].append(entry)
        if cname == "full" and full:
            save_file({n: p.grad.detach().contiguous().clone() for n, p in named},
                      os.path.join(d, "grads_full.safetensors"), metadata={"case": "full"})
    with open(os.path.join(d, "cases.json"), "w") as f:
        json.dump(res, f)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {len(res['cases'])} cases -> {d} ({size / 1024:.0f} KiB)")
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/grpo", help="output folder (one subfolder per architecture)")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(ARCHS))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # deterministic CPU reductions
    total = 0
    for i, (n, (mt, extra, full)) in enumerate(ARCHS.items()):
        if args.only and n not in args.only.split(","):
            continue
        total += make_one(n, mt, extra, full, args.out, args.seed + i)
    print(f"total {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
