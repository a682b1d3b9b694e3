# Tests `grpo serve`'s vLLM-style endpoints (/generate, /tokenize,
# /detokenize) with Python `requests`, in the shapes Atropos's vLLM server
# adapter and vLLM's tokenizer endpoints use:
#   POST /generate {"prompt": {"prompt_token_ids": [...]}, "logprobs": 0, "n", "max_tokens", ...}
#     -> {"text": [...], "finish_reasons": [...], "token_ids": [[...]],
#         "prompt_token_ids": [...], "logprobs": [[[{"<id>": logprob, ...}], ...], ...]}
#   POST /tokenize {"model", "prompt"} -> {"tokens", "count", "max_model_len"}
#   POST /detokenize {"model", "tokens"} -> {"prompt"}
# References are independent of the server: token ids from the model's
# tokenizer.json (serve_env.ByteVocabEncoder) and the model's EOS id from
# config.json; cross-endpoint agreement with /v1/completions.
# Run: GRPO_SERVE_URL=... GRPO_SERVE_MODEL_DIR=... python3 -m unittest test_generate
import math
import unittest

import requests

import serve_env

URL = serve_env.base_url()
HEADERS = serve_env.auth_headers()
TIMEOUT = 60
PROMPTS = [
    "Mia has 3 pens, gets 4 more. How many now?\n",
    "Leo has 9 cups, gives away 5. How many now?\n",
]


def post(path, body):
    return requests.post(URL + path, json=body, headers=HEADERS, timeout=TIMEOUT)


def post_ok(test, path, body):
    r = post(path, body)
    test.assertEqual(r.status_code, 200, f"POST {path} {body} -> {r.status_code} {r.text[:500]}")
    return r.json()


def model_name():
    r = requests.get(URL + "/v1/models", headers=HEADERS, timeout=TIMEOUT)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def assert_openai_error(test, r, status):
    test.assertEqual(r.status_code, status, r.text[:500])
    body = r.json()
    test.assertIn("error", body, body)
    err = body["error"]
    for field in ("message", "type", "param", "code"):
        test.assertIn(field, err, f"OpenAI error objects carry '{field}': {body}")
    test.assertIsInstance(err["message"], str)
    test.assertTrue(err["message"], "the error message is empty")
    return err


def per_token(entry):
    """One /generate logprobs entry is [{"<token id>": logprob, ...}]; returns
    that dict with int keys."""
    if not (isinstance(entry, list) and len(entry) == 1 and isinstance(entry[0], dict)):
        raise AssertionError(f"a per-token logprobs entry must be [{{id: logprob}}], got {entry!r}")
    return {int(k): float(v) for k, v in entry[0].items()}


class TokenizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = serve_env.reference_encoder()
        cls.model = model_name()

    def test_tokenize_matches_tokenizer_json(self):
        texts = PROMPTS + ["", " leading space", "tabs\tand\nnewlines", "caf\u00e9 \u2211 \U0001F600",
                           "end<|endoftext|>after"]
        for text in texts:
            with self.subTest(text=text):
                got = post_ok(self, "/tokenize", {"model": self.model, "prompt": text})
                want = self.ref.encode(text)
                self.assertEqual(got["tokens"], want)
                self.assertEqual(got["count"], len(want))
                self.assertIsInstance(got["max_model_len"], int)
                self.assertGreater(got["max_model_len"], 0)

    def test_detokenize_round_trip(self):
        for text in PROMPTS + ["caf\u00e9 \u2211", "x<|endoftext|>"]:
            with self.subTest(text=text):
                ids = self.ref.encode(text)
                got = post_ok(self, "/detokenize", {"model": self.model, "tokens": ids})
                self.assertEqual(got["prompt"], text)
                back = post_ok(self, "/tokenize", {"model": self.model, "prompt": got["prompt"]})
                self.assertEqual(back["tokens"], ids)

    def test_detokenize_rejects_ids_outside_vocab(self):
        for bad in ([len(self.ref.inverse) + 1000], [-1], ["7"], 7):
            with self.subTest(tokens=bad):
                err = assert_openai_error(self, post("/detokenize", {"model": self.model, "tokens": bad}), 400)
                self.assertEqual(err["param"], "tokens")

    def test_tokenize_rejects_missing_prompt(self):
        assert_openai_error(self, post("/tokenize", {"model": self.model}), 400)


class GenerateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = serve_env.reference_encoder()
        cls.eos = cls.ref.eos_id()
        cls.model = model_name()

    def generate(self, ids, **params):
        body = {"prompt": {"prompt_token_ids": ids}, "logprobs": 0}
        body.update(params)
        return post_ok(self, "/generate", body)

    def check_shape(self, out, n, prompt_ids, max_tokens):
        """Checks one /generate response against the facts that hold for any
        sampling and returns [(ids, chosen logprobs, finish reason)]."""
        self.assertEqual(len(out["finish_reasons"]), n)
        self.assertEqual(len(out["logprobs"]), n)
        self.assertEqual(out["prompt_token_ids"], prompt_ids)
        self.assertEqual(len(out["token_ids"]), n)
        self.assertEqual(len(out["text"]), n)
        samples = []
        for i in range(n):
            ids = out["token_ids"][i]
            entries = [per_token(e) for e in out["logprobs"][i]]
            self.assertEqual(len(entries), len(ids), "one logprobs entry per completion token")
            self.assertGreaterEqual(len(ids), 1)
            self.assertLessEqual(len(ids), max_tokens, "max_tokens not honoured")
            chosen = []
            for tok, d in zip(ids, entries):
                self.assertIn(tok, d, "the sampled token's logprob is reported")
                for v in d.values():
                    self.assertTrue(math.isfinite(v) and v <= 0.0, f"logprob {v} must be finite and <= 0")
                self.assertLessEqual(sum(math.exp(v) for v in d.values()), 1.0 + 1e-4,
                                     "reported probabilities of distinct tokens sum past 1")
                chosen.append(d[tok])
            reason = out["finish_reasons"][i]
            self.assertIn(reason, ("stop", "length"))
            if reason == "length":
                self.assertEqual(len(ids), max_tokens, "'length' means max_tokens tokens were produced")
                self.assertNotEqual(ids[-1], self.eos)
            else:
                self.assertEqual(ids[-1], self.eos, "without stop strings, 'stop' means EOS was sampled")
            self.assertNotIn(self.eos, ids[:-1], "generation continued past EOS")
            text_ids = ids[:-1] if ids[-1] == self.eos else ids
            self.assertEqual(out["text"][i], self.ref.decode(text_ids))
            samples.append((ids, chosen, reason))
        return samples

    def test_greedy_shape_and_finish_reasons(self):
        for prompt in PROMPTS:
            ids = self.ref.encode(prompt)
            with self.subTest(prompt=prompt):
                out = self.generate(ids, max_tokens=24, temperature=0.0)
                self.check_shape(out, 1, ids, 24)

    def test_max_tokens_honoured(self):
        ids = self.ref.encode(PROMPTS[0])
        for m in (1, 2, 5):
            with self.subTest(max_tokens=m):
                out = self.generate(ids, max_tokens=m, temperature=0.0)
                (toks, _, reason), = self.check_shape(out, 1, ids, m)
                full = self.generate(ids, max_tokens=32, temperature=0.0)["token_ids"][0]
                self.assertEqual(toks, full[:m], "a shorter max_tokens cuts the same greedy sequence")
                if len(full) > m:
                    self.assertEqual(reason, "length")

    def test_greedy_matches_completions_endpoint(self):
        for prompt in PROMPTS:
            ids = self.ref.encode(prompt)
            with self.subTest(prompt=prompt):
                gen = self.generate(ids, max_tokens=24, temperature=0.0)
                toks = gen["token_ids"][0]
                text = self.ref.decode(toks[:-1] if toks[-1] == self.eos else toks)
                for p in (prompt, ids):
                    comp = post_ok(self, "/v1/completions", {"model": self.model, "prompt": p, "max_tokens": 24,
                                                             "temperature": 0, "logprobs": 1})
                    choice = comp["choices"][0]
                    self.assertEqual(choice["text"], text)
                    self.assertEqual(choice["finish_reason"], gen["finish_reasons"][0])
                    self.assertEqual(comp["usage"]["prompt_tokens"], len(ids))
                    # Completions logprobs and /generate logprobs come from the same
                    # distribution for the same greedy tokens.
                    lp = choice["logprobs"]["token_logprobs"]
                    chosen = [per_token(e)[t] for e, t in zip(gen["logprobs"][0], toks)]
                    n_text = len(toks) - (1 if toks[-1] == self.eos else 0)
                    for a, b in zip(lp[:n_text], chosen[:n_text]):
                        self.assertAlmostEqual(a, b, delta=1e-4)

    def test_greedy_top_logprobs_contain_the_argmax(self):
        ids = self.ref.encode(PROMPTS[1])
        out = self.generate(ids, max_tokens=12, temperature=0.0, logprobs=5)
        self.check_shape(out, 1, ids, 12)
        for tok, e in zip(out["token_ids"][0], out["logprobs"][0]):
            d = per_token(e)
            self.assertGreaterEqual(len(d), 5, "logprobs=5 reports five candidates")
            self.assertEqual(max(d, key=d.get), tok, "at temperature 0 the chosen token has the best logprob")

    def test_seeded_sampling_reproduces(self):
        ids = self.ref.encode(PROMPTS[0])
        params = dict(n=4, max_tokens=16, temperature=1.5, top_p=1.0, seed=1234)
        a = self.generate(ids, **params)
        b = self.generate(ids, **params)
        sa = self.check_shape(a, 4, ids, 16)
        sb = self.check_shape(b, 4, ids, 16)
        self.assertEqual([s[0] for s in sa], [s[0] for s in sb], "same seed, same token ids")
        for (_, la, _), (_, lb, _) in zip(sa, sb):
            for x, y in zip(la, lb):
                self.assertAlmostEqual(x, y, delta=1e-5)
        self.assertGreater(len({tuple(s[0]) for s in sa}), 1, "the n samples of one request should not all agree "
                           "at temperature 1.5 over 16 tokens")

    def test_stop_string_finishes_with_stop(self):
        ids = self.ref.encode(PROMPTS[0])
        full = self.generate(ids, max_tokens=24, temperature=0.0)
        text = full["text"][0]
        if len(text) < 3:
            self.skipTest(f"the greedy completion {text!r} is too short to pick a stop string from")
        stop = text[1:3]
        out = self.generate(ids, max_tokens=24, temperature=0.0, stop=[stop])
        self.assertEqual(out["finish_reasons"][0], "stop")
        self.assertEqual(out["text"][0], text[:text.index(stop)])

    def test_bad_requests_are_openai_errors(self):
        ids = self.ref.encode(PROMPTS[0])
        cases = [
            ({"logprobs": 0, "max_tokens": 4}, "prompt"),
            ({"prompt": {"prompt_token_ids": []}, "max_tokens": 4}, "prompt"),
            ({"prompt": {"prompt_token_ids": [999999]}, "max_tokens": 4}, "prompt"),
            ({"prompt": {"prompt_token_ids": ids}, "max_tokens": 0}, "max_tokens"),
            ({"prompt": {"prompt_token_ids": ids}, "max_tokens": 4, "temperature": -1}, "temperature"),
            ({"prompt": {"prompt_token_ids": ids}, "max_tokens": 4, "n": 0}, "n"),
            ({"prompt": {"prompt_token_ids": ids}, "max_tokens": "four"}, "max_tokens"),
        ]
        for body, param in cases:
            with self.subTest(body=body):
                err = assert_openai_error(self, post("/generate", body), 400)
                self.assertTrue(err["param"] is None or param in err["param"],
                                f"param {err['param']!r} should name {param!r}")
                self.assertIn(param, err["message"], "the message names the bad field")


if __name__ == "__main__":
    unittest.main()
