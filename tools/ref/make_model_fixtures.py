#!/usr/bin/env python3
"""Reference fixtures for the inference transformer (tests/model/).

For each architecture we support, builds a tiny random model with Hugging Face
transformers (float32, eager attention, on the CPU so the numbers are
deterministic), saves it with save_pretrained (config.json + safetensors) and
writes reference.json next to it:

  {"format": "grpo-model-fixture", "version": 1,
   "name", "model_type", "torch_version", "transformers_version",
   "rope_inv_freq": [D/2 floats]          # model.model.rotary_emb.inv_freq
   "logits":   [{"tokens": [T ints], "shape": [T, V], "values": [T*V floats]}],
   "generate": [{"prompt": [ints], "new_tokens": [32 ints], "min_margin": float}]}

`logits` are the full-sequence logits at every position; `generate` is greedy
generate() (do_sample=False, no EOS so it never stops early) and `min_margin`
is the smallest top-1 minus top-2 logit gap over its steps (how close the
greedy choice came to a tie).

Weights are re-initialised so that activations have unit scale and every
parameter matters: linear weights ~ N(0, 1/in_features), embeddings ~ N(0, 0.5²),
norm weights ~ 1 + N(0, 0.2²), biases ~ N(0, 0.2²).

Usage (from the repository root, on a machine with torch + transformers):
    python3 tools/ref/make_model_fixtures.py --out tests/fixtures/models [--only mistral_swa,qwen2_swa,qwen3_swa]
"""
import argparse
import json
import math
import os
import sys

FORMAT = "grpo-model-fixture"
VERSION = 1
N_NEW_TOKENS = 32

COMMON = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    hidden_act="silu",
)

# name -> (model_type, extra config kwargs)
MODELS = {
    # Llama 3 style: llama3 rope scaling, tied embeddings. original_max_position_embeddings
    # is small so that the scaled and smoothed bands are exercised at short positions
    # (head_dim 16, theta 1e4: wavelengths 6.3, 20, 63, ... straddle 8 and 32).
    "llama3": ("llama", dict(rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                             rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0,
                                               original_max_position_embeddings=32))),
    # Llama 2 style: no scaling, untied LM head.
    "llama2": ("llama", dict(rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # Linear rope scaling (position interpolation), untied.
    "llama_linear": ("llama", dict(rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                   rope_scaling=dict(rope_type="linear", factor=2.0))),
    # Qwen2: q/k/v bias, tied embeddings, theta 1e6.
    "qwen2": ("qwen2", dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                            use_sliding_window=False)),
    # Qwen3: per-head q/k RMSNorm, explicit head_dim (32) != hidden/heads (16), untied.
    "qwen3": ("qwen3", dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                            head_dim=32, attention_bias=False, use_sliding_window=False)),
    # Mistral: like Llama 2 with a sliding window far longer than our sequences.
    "mistral": ("mistral", dict(rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                sliding_window=4096)),
    # Sliding-window attention with windows shorter than the prompts (SWA_LENGTHS):
    # Mistral windows every layer; Qwen2 only layers >= max_window_layers (layer 1);
    # Qwen3 takes explicit layer_types (window on layer 0 only).
    "mistral_swa": ("mistral", dict(rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                    sliding_window=24)),
    "qwen2_swa": ("qwen2", dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                use_sliding_window=True, sliding_window=24, max_window_layers=1)),
    "qwen3_swa": ("qwen3", dict(rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                head_dim=32, attention_bias=False, use_sliding_window=True, sliding_window=16,
                                layer_types=["sliding_attention", "full_attention"])),
}

# Prompt lengths (full-sequence logits, greedy generate) per model; the default
# is DEFAULT_LENGTHS. The sliding-window models use prompts past their window.
DEFAULT_LENGTHS = ((7, 13, 21), (5, 11, 17))
SWA_LENGTHS = ((40, 57), (40, 45))
LENGTHS = {"mistral_swa": SWA_LENGTHS, "qwen2_swa": SWA_LENGTHS, "qwen3_swa": SWA_LENGTHS}


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


def rope_inv_freq(model):
    rot = getattr(model.model, "rotary_emb", None)
    inv = getattr(rot, "inv_freq", None) if rot is not None else None
    return [float(x) for x in inv.float().tolist()] if inv is not None else []


def make_one(name, model_type, extra, out_dir, seed):
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    kwargs = dict(COMMON)
    kwargs.update(extra)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    if "layer_types" in extra:
        assert list(cfg.layer_types) == extra["layer_types"], f"{name}: layer_types not kept: {cfg.layer_types}"
    randomise(model, torch, gen)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "tying broken"

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)

    V = cfg.vocab_size
    ref = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "model_type": model_type,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "rope_inv_freq": rope_inv_freq(model),
        "logits": [],
        "generate": [],
    }

    logit_lengths, generate_lengths = LENGTHS.get(name, DEFAULT_LENGTHS)
    # Full-sequence logits for a few prompt lengths (21 crosses a 16-token KV block).
    with torch.no_grad():
        for T in logit_lengths:
            toks = torch.randint(3, V, (1, T), generator=gen)
            out = model(input_ids=toks, use_cache=False)
            lg = out.logits[0].float()
            assert lg.shape == (T, V)
            ref["logits"].append({"tokens": toks[0].tolist(), "shape": [T, V],
                                  "values": [float(x) for x in lg.reshape(-1).tolist()]})

    # generate() may fill unset fields from the model's own generation config: clear EOS there too.
    model.generation_config.eos_token_id = None
    # Greedy generation that never stops early: no EOS token at all (min_new_tokens
    # would mask EOS logits and change the argmax).
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=N_NEW_TOKENS, eos_token_id=None,
                            pad_token_id=0, bos_token_id=cfg.bos_token_id, num_beams=1,
                            repetition_penalty=1.0)
    with torch.no_grad():
        for T in generate_lengths:
            toks = torch.randint(3, V, (1, T), generator=gen)
            res = model.generate(input_ids=toks, attention_mask=torch.ones_like(toks),
                                 generation_config=gcfg, return_dict_in_generate=True,
                                 output_logits=True)
            seq = res.sequences[0]
            new = seq[T:].tolist()
            assert len(new) == N_NEW_TOKENS, f"{name}: generate stopped after {len(new)} tokens"
            margin = float("inf")
            for step_logits in res.logits:
                top2 = torch.topk(step_logits[0].float(), 2).values
                margin = min(margin, float(top2[0] - top2[1]))
            # Self-check: the cached greedy path equals argmax of an uncached forward.
            full = model(input_ids=seq[None, :-1], use_cache=False).logits[0]
            agree = full[T - 1:].argmax(-1).tolist() == new
            if not agree:
                print(f"warning: {name}: cached generate disagrees with uncached argmax", file=sys.stderr)
            ref["generate"].append({"prompt": toks[0].tolist(), "new_tokens": new,
                                    "min_margin": margin, "uncached_argmax_agrees": agree})

    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f)
    sizes = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{name}: {model_type} -> {d} ({sizes / 1024:.0f} KiB), "
          f"min greedy margin {min(g['min_margin'] for g in ref['generate']):.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/models", help="output folder (one subfolder per model)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(MODELS))
    args = ap.parse_args()

    import torch
    torch.set_num_threads(1)  # deterministic CPU reductions
    names = [n for n in MODELS if not args.only or n in args.only.split(",")]
    for n in names:
        model_type, extra = MODELS[n]
        make_one(n, model_type, extra, args.out, args.seed + list(MODELS).index(n))  # seed stable under --only


if __name__ == "__main__":
    main()
