#!/usr/bin/env python3
"""Reference fixtures for LoRA (tests/train/test_lora_fixtures.cpp), made with
PyTorch + transformers + peft.

For each variant (llama: untied, no bias; qwen2: tied, q/k/v bias; qwen3: tied,
qk-norm, use_rslora) builds a tiny random model (hidden 64, 2 layers, 4 heads,
2 kv heads, intermediate 128, vocab 320, float32, eager attention, CPU), wraps
it with peft.get_peft_model(LoraConfig(r=4, lora_alpha=8, lora_dropout=0,
target_modules=the seven projections)), overwrites every lora_A and lora_B with
fixed random values (B != 0, so that A's gradient and the adapter's output are
not zero), and evaluates on one batch of three sequences

    L = sum_t coef[t] * logp[t],   logp[t] = log softmax(logits)[token]

over the completion tokens (packed, sequence after sequence), with
coef[t] = sin(0.37 t + 0.1). Output per variant, in <out>/<variant>/:

  base/config.json, base/model.safetensors     the base model (save_pretrained)
  adapter/adapter_config.json,
  adapter/adapter_model.safetensors            the adapter (PeftModel.save_pretrained)
  grads.safetensors                            dL/d(every lora_A/lora_B), float32, under
                                               the adapter file's names
  case.json = {"format": "lora-fixture", "version": 1, "variant", versions,
               "sequences": [[ids]], "prompt_lens": [n], "coef": [T'], "logp": [T'],
               "logp_base": [T'] (the base model without the adapter), "loss"}

Usage (repository root, on a machine with torch, transformers, peft, safetensors):
    python3 tools/ref/make_lora_fixtures.py --out tests/fixtures/lora
"""
import argparse
import json
import math
import os

FORMAT = "lora-fixture"
VERSION = 1

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=2, hidden_act="silu", rms_norm_eps=1e-6)

# name -> (model_type, extra config, use_rslora)
VARIANTS = {
    "llama": ("llama", dict(tie_word_embeddings=False, attention_bias=False), False),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True, use_sliding_window=False), False),
    "qwen3": ("qwen3", dict(tie_word_embeddings=True, head_dim=16, attention_bias=False,
                            use_sliding_window=False), True),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQ_LENS = [(4, 9), (1, 6), (6, 11)]  # (prompt_len, total_len)


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


def file_name(param_name):
    # PEFT's in-memory name carries the adapter name ("default"); its saved files do not.
    return param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def packed_logp(torch, model, seqs, prompt_lens):
    out = []
    for ids, p in zip(seqs, prompt_lens):
        x = torch.tensor([ids])
        logits = model(input_ids=x).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        tgt = torch.tensor(ids[p:])
        out.append(lp[p - 1:len(ids) - 1].gather(1, tgt[:, None])[:, 0])
    return torch.cat(out)


def make_one(name, model_type, extra, rslora, out_dir, seed):
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    kwargs = dict(COMMON)
    kwargs.update(extra)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(torch.float32).eval()
    randomise(model, torch, gen)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(os.path.join(d, "base"))

    V = cfg.vocab_size
    seqs = [torch.randint(3, V, (n,), generator=gen).tolist() for _, n in SEQ_LENS]
    prompt_lens = [p for p, _ in SEQ_LENS]
    with torch.no_grad():
        logp_base = packed_logp(torch, model, seqs, prompt_lens)

    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                      task_type="CAUSAL_LM", use_rslora=rslora)
    pm = get_peft_model(model, lcfg)
    pm.eval()
    names = []
    with torch.no_grad():
        for pname, p in pm.named_parameters():
            if ".lora_A." in pname or ".lora_B." in pname:
                p.copy_(0.5 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
                names.append(pname)
    assert len(names) == 2 * len(TARGETS) * cfg.num_hidden_layers, names
    pm.save_pretrained(os.path.join(d, "adapter"))

    logp = packed_logp(torch, pm, seqs, prompt_lens)
    coef = torch.tensor([math.sin(0.37 * t + 0.1) for t in range(logp.numel())])
    loss = (coef * logp).sum()
    loss.backward()
    grads = {}
    for pname, p in pm.named_parameters():
        if pname in names:
            grads[file_name(pname)] = p.grad.detach().float().contiguous()
        elif p.requires_grad:
            raise RuntimeError(f"{pname} is trainable but is not a LoRA matrix")
    save_file(grads, os.path.join(d, "grads.safetensors"))
    case = {"format": FORMAT, "version": VERSION, "variant": name,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "peft": peft.__version__},
            "sequences": seqs, "prompt_lens": prompt_lens, "coef": coef.tolist(),
            "logp": logp.detach().tolist(), "logp_base": logp_base.tolist(), "loss": float(loss)}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f)
    print(f"{name}: loss {float(loss):.6f}, {len(grads)} gradients -> {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/lora")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    for i, (name, (mt, extra, rslora)) in enumerate(VARIANTS.items()):
        make_one(name, mt, extra, rslora, a.out, a.seed + i)


if __name__ == "__main__":
    main()
