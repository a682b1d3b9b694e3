# Settings shared by the Python client tests of `grpo serve`, read from the
# environment that tests/server/run_server_tests.sh exports, plus an
# independent reference encoder for the served model's tokenizer.json.
import json
import os
import sys


def need(name):
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"{name} is not set: run these tests through tests/server/run_server_tests.sh BUILD_DIR, "
                 f"or export {name} yourself (see that script)")
    return value


def base_url():
    return need("GRPO_SERVE_URL").rstrip("/")


def model_dir():
    return need("GRPO_SERVE_MODEL_DIR")


def auth_headers():
    key = os.environ.get("GRPO_SERVE_API_KEY", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def gpt2_byte_alphabet():
    # GPT-2's reversible byte -> printable character map, rebuilt from its
    # definition: printable Latin-1 bytes stand for themselves, the rest take
    # code points from 256 upward in byte order.
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, next_cp = {}, 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(next_cp)
            next_cp += 1
    return table


class ByteVocabEncoder:
    """Encodes text the way a merge-free byte-level BPE tokenizer.json does:
    one token per UTF-8 byte, special tokens matched whole. It refuses
    tokenizers with merges, whose reference would need a full BPE."""

    def __init__(self, tokenizer_json_path):
        with open(tokenizer_json_path, encoding="utf-8") as f:
            tok = json.load(f)
        model = tok["model"]
        if model.get("type") != "BPE" or model.get("merges"):
            raise ValueError(f"{tokenizer_json_path}: the reference encoder handles merge-free byte-level BPE only")
        self.vocab = model["vocab"]
        self.specials = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
        self.alphabet = gpt2_byte_alphabet()
        self.inverse = {v: k for k, v in self.vocab.items()}
        for content, i in self.specials.items():
            self.inverse[i] = content

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            hit = next((s for s in self.specials if text.startswith(s, i)), None)
            if hit:
                ids.append(self.specials[hit])
                i += len(hit)
                continue
            for b in text[i].encode("utf-8"):
                ids.append(self.vocab[self.alphabet[b]])
            i += 1
        return ids

    def decode(self, ids):
        byte_of = {c: b for b, c in self.alphabet.items()}
        out = bytearray()
        for i in ids:
            piece = self.inverse[i]
            if piece in self.specials:
                out += piece.encode("utf-8")
            else:
                out += bytes(byte_of[c] for c in piece)
        return out.decode("utf-8", errors="replace")

    def eos_id(self):
        with open(os.path.join(model_dir(), "config.json"), encoding="utf-8") as f:
            eos = json.load(f)["eos_token_id"]
        return eos[0] if isinstance(eos, list) else eos


def reference_encoder():
    return ByteVocabEncoder(os.path.join(model_dir(), "tokenizer.json"))
