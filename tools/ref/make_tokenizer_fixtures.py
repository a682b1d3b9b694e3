#!/usr/bin/env python3
"""Reference fixtures for grpo.cpp's tokenizer and chat templates.

Run from the repo root on a machine with `tokenizers`, `transformers` (5.x) and `jinja2`:

    python3 tools/ref/make_tokenizer_fixtures.py --shared .carry/shared --out tests/fixtures/tokenizer

where --shared is a copy of /work/shared/data (tokenizers/, gsm8k/, models/).
Writes (all small, versioned):
  <tok>.json          parity + stress ids, first 50 GSM8K texts with full ids   (tok = gpt2, qwen2, llama3)
  gsm8k_<tok>.bin     per GSM8K text: token count and FNV-1a-64 of the ids (format below)
  chat_templates.json rendered chat templates (HF apply_chat_template semantics) + their ids
The reference is Hugging Face `tokenizers`; grpo.cpp's code is never used here.

gsm8k_<tok>.bin (little-endian): b"GTKH", u32 version=1, u32 n, then n records of
(u32 n_tokens, u64 fnv1a64(ids as int32 LE bytes)). Record order: train.jsonl lines in
order, per line question then answer; then test.jsonl the same way.
"""
import argparse
import datetime
import json
import os
import struct
import sys
from pathlib import Path

FIXTURE_VERSION = 1
FIXED_DATE = datetime.date(2026, 11, 22)  # strftime_now() answers this date, for reproducible fixtures

# Llama-3 pre-tokenizer regex (as in Meta's tokenizer.json) and its special tokens, which
# llama3/encoder.json does not contain (ids 128000..128255, names as in Llama-3.1).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_special_tokens():
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>",
             128009: "<|eot_id|>", 128010: "<|python_tag|>"}
    out, reserved = [], 0
    for i in range(128000, 128256):
        if i in named:
            out.append((i, named[i]))
        else:
            out.append((i, "<|reserved_special_token_%d|>" % reserved))
            reserved += 1
    return out


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for b in struct.pack("<%di" % len(ids), *ids):
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_parity(folder):
    inp = next(folder.glob("*.inp"))
    out = next(folder.glob("*.out"))
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    lines = out.read_text(encoding="utf-8").split("\n")[:len(texts)]
    ids = [[int(t) for t in line.split()] for line in lines]
    assert len(texts) == len(ids), (inp, len(texts), len(ids))
    return texts, ids


def load_tokenizers(tok_dir):
    from tokenizers import Tokenizer, Regex, AddedToken, models, pre_tokenizers, decoders
    toks = {
        "gpt2": Tokenizer.from_file(str(tok_dir / "gpt2" / "tokenizer.json")),
        "qwen2": Tokenizer.from_file(str(tok_dir / "qwen2" / "tokenizer.json")),
    }
    # llama3 has only encoder.json + vocab.bpe: build the HF equivalent of Meta's tokenizer.json.
    vocab = json.loads((tok_dir / "llama3" / "encoder.json").read_text(encoding="utf-8"))
    merges = []
    for line in (tok_dir / "llama3" / "vocab.bpe").read_text(encoding="utf-8").split("\n"):
        if not line or line.startswith("#version"):
            continue
        a, b = line.split(" ")
        merges.append((a, b))
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=True)
    t = Tokenizer(bpe)
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    t.decoder = decoders.ByteLevel()
    specials = llama3_special_tokens()
    for i, (tid, content) in enumerate(specials):
        assert tid == 128000 + i
    t.add_special_tokens([AddedToken(c, special=True, normalized=False) for _, c in specials])
    for tid, content in specials:
        assert t.token_to_id(content) == tid, (content, t.token_to_id(content), tid)
    toks["llama3"] = t
    return toks


def check_parity(name, tok, tok_dir):
    texts, want = read_parity(tok_dir / name / "parity")
    got = [tok.encode(s, add_special_tokens=False).ids for s in texts]
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    if bad:
        for i in bad[:5]:
            print("PARITY MISMATCH %s #%d %r: hf=%s llama.cpp=%s" % (name, i, texts[i], got[i], want[i]))
        sys.exit("reference tokenizer %s disagrees with llama.cpp parity vectors (%d of %d)" % (name, len(bad), len(texts)))
    print("%s: %d/%d llama.cpp parity strings match" % (name, len(texts), len(texts)))
    return [{"text": s, "ids": g} for s, g in zip(texts, got)]


def gsm8k_texts(gsm_dir):
    out = []
    for split in ("train", "test"):
        with open(gsm_dir / (split + ".jsonl"), encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                out.append((split, "question", row["question"]))
                out.append((split, "answer", row["answer"]))
    return out


def write_tokenizer_fixtures(name, tok, tok_dir, stress, gsm, out_dir):
    parity = check_parity(name, tok, tok_dir)
    stress_rows = []
    for s in stress:
        enc = tok.encode(s, add_special_tokens=False)
        dec = tok.decode(enc.ids, skip_special_tokens=False)
        stress_rows.append({"text": s, "ids": enc.ids, "decoded": dec})
    encs = tok.encode_batch([t for _, _, t in gsm], add_special_tokens=False)
    recs = bytearray(b"GTKH" + struct.pack("<II", FIXTURE_VERSION, len(encs)))
    for e in encs:
        recs += struct.pack("<IQ", len(e.ids), fnv1a64(e.ids))
    (out_dir / ("gsm8k_%s.bin" % name)).write_bytes(bytes(recs))
    first = [{"split": sp, "field": fld, "text": t, "ids": e.ids}
             for (sp, fld, t), e in list(zip(gsm, encs))[:50]]
    doc = {"version": FIXTURE_VERSION, "tokenizer": name, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
           "reference": "tokenizers " + __import__("tokenizers").__version__,
           "add_special_tokens": False, "parity": parity, "stress": stress_rows,
           "gsm8k": {"file": "gsm8k_%s.bin" % name, "n_texts": len(encs),
                     "total_tokens": sum(len(e.ids) for e in encs), "first": first}}
    (out_dir / (name + ".json")).write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    print("%s: %d stress, %d gsm8k texts, %d tokens" % (name, len(stress_rows), len(encs), doc["gsm8k"]["total_tokens"]))


# ---- chat templates -------------------------------------------------------------------------

def conversations():
    sys_user = [{"role": "system", "content": "You are a careful math tutor."},
                {"role": "user", "content": "What is 12 * 7?"}]
    user_only = [{"role": "user", "content": "Natalia sold clips to 48 of her friends. How many?"}]
    multi = [{"role": "system", "content": "  Answer briefly.  \n"},
             {"role": "user", "content": "Hi there!"},
             {"role": "assistant", "content": "Hello! How can I help?"},
             {"role": "user", "content": "Compute 2+2, then explain. ünïcödé 中文 😀"}]
    ending_assistant = multi + [{"role": "assistant", "content": "2+2 = 4.\nBecause two and two make four."}]
    thinking = [{"role": "user", "content": "What is 3+5?"},
                {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nThe answer is 8."},
                {"role": "user", "content": "And 4+4?"},
                {"role": "assistant", "content": "<think>\nDouble four.\n</think>\n\n8"}]
    tools_conv = [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris", "unit": "C"}}}]},
                  {"role": "tool", "content": "{\"temp\": 21}"},
                  {"role": "user", "content": "Thanks"}]
    return [("system_user", sys_user), ("user_only", user_only), ("multi_turn", multi),
            ("ends_with_assistant", ending_assistant), ("thinking_history", thinking), ("tool_calls", tools_conv)]


def hf_compile(src):
    """The template compiled the way transformers' apply_chat_template does (if importable)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return _compile_jinja_template(src), "transformers " + __import__("transformers").__version__
    except Exception as e:  # noqa: BLE001 - fall back to plain jinja2 with HF's settings
        print("note: transformers' template compiler unavailable (%s); using jinja2 with HF settings" % e)
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(src), "jinja2 " + jinja2.__version__


def write_chat_fixtures(tok_dir, toks, out_dir):
    templates = [
        ("qwen2/chat_template.Qwen2.5-Instruct.jinja", "qwen2", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        ("qwen2/chat_template.Qwen3.jinja", "qwen2", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        ("qwen2/tokenizer_config.json#chat_template", "qwen2", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        ("llama3/chat_template.Llama-3.1-Instruct.jinja", "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
        ("llama3/chat_template.Llama-3.2-Instruct.jinja", "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ]
    fixed_strftime = lambda fmt: FIXED_DATE.strftime(fmt)  # noqa: E731
    cases, engine = [], None
    for path, tok_name, special in templates:
        if path.endswith("#chat_template"):
            src = json.loads((tok_dir / path.split("#")[0]).read_text(encoding="utf-8"))["chat_template"]
        else:
            src = (tok_dir / path).read_text(encoding="utf-8")
        tmpl, engine = hf_compile(src)
        for conv_name, msgs in conversations():
            if conv_name == "tool_calls" and "#" in path:
                continue  # the fine-tuner's template ignores tool messages; nothing to learn
            variants = [{"add_generation_prompt": True}, {"add_generation_prompt": False}]
            if "Qwen3" in path:
                variants.append({"add_generation_prompt": True, "enable_thinking": False})
                variants.append({"add_generation_prompt": True, "enable_thinking": True})
            for kw in variants:
                ctx = dict(special)
                ctx.update(kw)
                # Render variables shadow the compiled template's globals: this pins strftime_now's date.
                text = tmpl.render(messages=msgs, tools=None, documents=None, strftime_now=fixed_strftime, **ctx)
                row = {"template": path, "conversation": conv_name, "messages": msgs, "special_tokens": special,
                       "kwargs": kw, "rendered": text}
                if toks is not None:
                    row["tokenizer"] = tok_name
                    row["ids"] = toks[tok_name].encode(text, add_special_tokens=False).ids
                cases.append(row)
    doc = {"version": FIXTURE_VERSION, "engine": engine, "date": FIXED_DATE.isoformat(),
           "note": "rendered with trim_blocks/lstrip_blocks, tools=None; strftime_now returns `date`", "cases": cases}
    (out_dir / "chat_templates.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    print("chat templates: %d cases (%s)" % (len(cases), engine))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", required=True, help="copy of /work/shared/data (has tokenizers/ and gsm8k/)")
    ap.add_argument("--out", required=True, help="output folder, normally tests/fixtures/tokenizer")
    ap.add_argument("--stress", default=str(Path(__file__).resolve().parents[2] / "tests/fixtures/tokenizer/stress_texts.json"))
    ap.add_argument("--chat-only", action="store_true", help="only chat_templates.json, without ids (needs jinja2 only)")
    args = ap.parse_args()
    shared = Path(args.shared)
    tok_dir, gsm_dir, out_dir = shared / "tokenizers", shared / "gsm8k", Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.chat_only:
        write_chat_fixtures(tok_dir, None, out_dir)
        return
    stress = json.loads(Path(args.stress).read_text(encoding="utf-8"))["texts"]
    toks = load_tokenizers(tok_dir)
    gsm = gsm8k_texts(gsm_dir)
    for name in ("gpt2", "qwen2", "llama3"):
        write_tokenizer_fixtures(name, toks[name], tok_dir, stress, gsm, out_dir)
    write_chat_fixtures(tok_dir, toks, out_dir)
    total = sum(os.path.getsize(p) for p in out_dir.iterdir() if p.is_file())
    print("wrote %s (%.2f MB in all)" % (out_dir, total / 1e6))


if __name__ == "__main__":
    main()
