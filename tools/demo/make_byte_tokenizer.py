#!/usr/bin/env python3
"""Writes a byte-level tokenizer.json (Hugging Face `tokenizers` format) with
the 256 byte tokens and no merges, plus special tokens. Used by the embedded
default demo model, whose texts are short ASCII word problems: a byte
vocabulary keeps the model tiny and every string representable.

Usage: python3 tools/demo/make_byte_tokenizer.py OUT_DIR
"""
import json, os, sys

def byte_to_unicode():
    # GPT-2's ByteLevel alphabet: printable bytes map to themselves, the others
    # to code points from 256 upward, in byte order.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table

SPECIALS = ["<|endoftext|>", "<|pad|>"]

def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = []
    for i, s in enumerate(SPECIALS):
        vocab[s] = 256 + i
        added.append({"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    cfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
           "add_bos_token": False, "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

if __name__ == "__main__":
    main()
