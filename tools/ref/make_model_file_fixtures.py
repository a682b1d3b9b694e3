#!/usr/bin/env python3
"""Reference fixtures for the model-file area (src/model/llama2c, checkpoint).

Default mode (pure Python, no packages; runs anywhere):
  python3 tools/ref/make_model_file_fixtures.py
writes tests/fixtures/model_files/tok512_reference.json with
  - "merges": the BPE merges transformers' SentencePiece converter derives
    from the stories260K vocabulary (tok512.bin), computed here by a port of
    transformers.convert_slow_tokenizer.generate_merges (vocab_scores given:
    every split of every piece into two vocabulary pieces, per piece ordered by
    (id(left), id(right)), then stably sorted by the piece score, descending);
  - "encodings": llama2.c's own encoder (run.c `encode`: dummy-prefix space,
    UTF-8 code points looked up, byte fallback to id+3, then repeatedly merge
    the adjacent pair whose concatenation has the highest score) on sample
    strings, with BOS. A Llama-2-style HF tokenizer.json must give the same ids.

--check-hf DIR (GPU machine: needs `tokenizers`, `transformers`, `torch`):
  DIR is the output of `grpo convert llama2c`. Checks that tokenizers'
  Tokenizer.from_file(DIR/tokenizer.json) reproduces the llama2.c encodings,
  and that transformers' greedy generation from BOS reproduces
  golden_greedy_t0_200steps.ids.txt. Prints PASS/FAIL lines; exit code 1 on failure.
"""
import argparse, json, os, struct, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "models", "stories260K"))
SAMPLES = ["Once upon a time, there was a little girl named Lily.",
           "Hello world", "  two  spaces", "The end.\nA new line", "caf\u00e9 \u2014 \u201cquoted\u201d",
           "Tom's 3 dogs ran 10 miles!", "\u00fcber \u4e2d\u6587", ""]


def read_tok(path, n=512):
    d = open(path, "rb").read()
    o = 4
    pieces, scores = [], []
    for _ in range(n):
        s, l = struct.unpack("<fi", d[o:o + 8]); o += 8
        pieces.append(d[o:o + l]); scores.append(s); o += l
    return pieces, scores


def hf_vocab(pieces):
    out = []
    for i, p in enumerate(pieces):
        if i == 0: out.append("<unk>")
        elif i == 1: out.append("<s>")
        elif i == 2: out.append("</s>")
        else: out.append(p.decode("utf-8").replace(" ", "\u2581"))
    return out


def generate_merges(vocab, vocab_scores):
    merges = []
    for merge, piece_score in vocab_scores.items():
        local = []
        for index in range(1, len(merge)):
            l, r = merge[:index], merge[index:]
            if l in vocab and r in vocab:
                local.append((l, r, piece_score))
        local = sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges = sorted(merges, key=lambda v: v[2], reverse=True)
    return [[a, b] for a, b, _ in merges]


def llama2c_encode(text, pieces, scores):
    # run.c encode(): bos, dummy prefix " " when text is non-empty, then code points / byte fallback, then merges.
    lookup = {p: i for i, p in enumerate(pieces)}
    ids = [1]
    if not text:
        return ids
    data = (" " + text).encode("utf-8")
    i = 0
    toks = []
    while i < len(data):
        c = data[i]
        n = 1 if c < 0x80 else 2 if c >> 5 == 6 else 3 if c >> 4 == 14 else 4
        ch = data[i:i + n]
        if ch in lookup: toks.append(lookup[ch])
        else: toks.extend(b + 3 for b in ch)
        i += n
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for k in range(len(toks) - 1):
            m = pieces[toks[k]] + pieces[toks[k + 1]]
            if m in lookup and scores[lookup[m]] > best:
                best, best_id, best_i = scores[lookup[m]], lookup[m], k
        if best_i < 0: break
        toks[best_i:best_i + 2] = [best_id]
    return ids + toks


def make_fixture(out_path):
    pieces, scores = read_tok(os.path.join(SHARED, "tok512.bin"))
    vocab_list = hf_vocab(pieces)
    vocab = {p: i for i, p in enumerate(vocab_list)}
    vocab_scores = {p: scores[i] for i, p in enumerate(vocab_list)}
    fx = {"source": "tools/ref/make_model_file_fixtures.py (pure Python port; see its docstring)",
          "vocab_size": len(vocab_list), "merges": generate_merges(vocab, vocab_scores),
          "encodings": [{"text": s, "ids": llama2c_encode(s, pieces, scores)} for s in SAMPLES]}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out_path}: {len(fx['merges'])} merges, {len(SAMPLES)} encodings")


def check_hf(model_dir, fixture_path):
    from tokenizers import Tokenizer
    ok = True
    fx = json.load(open(fixture_path, encoding="utf-8"))
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    for e in fx["encodings"]:
        got = tok.encode(e["text"]).ids
        good = got == e["ids"]
        ok &= good
        print(("PASS" if good else "FAIL"), "encode", repr(e["text"]), "" if good else f"got {got} want {e['ids']}")
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    golden = [int(x) for x in open(os.path.join(SHARED, "golden_greedy_t0_200steps.ids.txt")).read().split()]
    with torch.no_grad():
        out = model.generate(torch.tensor([[1]]), max_new_tokens=200, min_new_tokens=200, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0].tolist()
    good = out == golden
    ok &= good
    first = next((i for i, (a, b) in enumerate(zip(out, golden)) if a != b), None)
    print(("PASS" if good else "FAIL"), "transformers greedy 200 steps vs golden", "" if good else f"first diff at {first}")
    return ok


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "model_files", "tok512_reference.json"))
    ap.add_argument("--check-hf", metavar="DIR")
    a = ap.parse_args()
    if a.check_hf:
        sys.exit(0 if check_hf(a.check_hf, a.out) else 1)
    make_fixture(a.out)
