#!/usr/bin/env python3
"""A GSM8K environment process for grpo.cpp's Atropos-compatible trajectory API.

Standard library only. For each question it samples G completions from an
OpenAI-compatible server (`grpo serve`, or `grpo train` with [server] enabled,
which serves the live policy), scores each by its final number against the
GSM8K answer ("#### N"), and posts the group to the trajectory API
(POST /scored_data) with the token ids, the loss mask (-100 on the prompt),
the sampling logprobs (for the importance-sampling correction) and the policy
version that produced it (for max_staleness). See docs/environments.md.

    python3 examples/environments/gsm8k_env.py --api http://127.0.0.1:8000 \
        --server http://127.0.0.1:8001 --group-size 4
"""
import argparse
import gzip
import json
import random
import re
import signal
import sys
import time
import urllib.error
import urllib.request

NUM = re.compile(r"-?\d[\d,]*\.?\d*")


def final_number(text):
    """The number after '####' if any, else the last number in the text (None if none)."""
    tail = text.split("####")[-1] if "####" in text else text
    found = NUM.findall(tail)
    if not found:
        return None
    s = found[0] if "####" in text else found[-1]
    s = s.replace(",", "").rstrip(".")
    try:
        return float(s)
    except ValueError:
        return None


def score(completion, gold):
    got = final_number(completion)
    return 1.0 if got is not None and gold is not None and abs(got - gold) < 1e-6 else 0.0


class Http:
    def __init__(self, base, timeout, use_gzip=False):
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.use_gzip = use_gzip

    def call(self, method, path, body=None):
        """(status, json or text, headers); raises urllib.error.URLError when unreachable."""
        data = None
        headers = {"Accept-Encoding": "gzip"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
            if self.use_gzip:
                data = gzip.compress(data)
                headers["Content-Encoding"] = "gzip"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
            status, raw, hdrs = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), e.headers
        if hdrs.get("Content-Encoding", "") == "gzip":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text), hdrs
        except ValueError:
            return status, text, hdrs


def load_questions(path, limit, qfield, afield):
    qs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            if qfield not in row or afield not in row:
                sys.exit(f"gsm8k_env: {path}: a line lacks the '{qfield}' or '{afield}' field (see --question-field/--answer-field)")
            gold = final_number(str(row[afield]))
            if gold is not None:
                qs.append((row[qfield], gold))
            if limit and len(qs) >= limit:
                break
    if not qs:
        sys.exit(f"gsm8k_env: no usable question in {path} (need a question and an answer ending in '#### N' or a number)")
    return qs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--api", default="http://127.0.0.1:8000", help="trajectory API (grpo train data.env=remote, or grpo api)")
    ap.add_argument("--server", default="http://127.0.0.1:8001", help="OpenAI-compatible sampling server")
    ap.add_argument("--model", default="", help="model name for the server (default: the first of GET /v1/models)")
    ap.add_argument("--data", default="data/gsm8k/train.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N questions (0 = all)")
    ap.add_argument("--question-field", default="question")
    ap.add_argument("--answer-field", default="answer", help="GSM8K solution ('... #### N') or a plain number")
    ap.add_argument("--prompt-template", default="Question: {question}\nAnswer:")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--name", default="gsm8k")
    ap.add_argument("--weight", type=float, default=1.0)
    ap.add_argument("--max-groups", type=int, default=0, help="stop after posting this many groups (0 = run until the API goes away)")
    ap.add_argument("--off-policy-tolerance", type=int, default=4,
                    help="pause while the API holds more than this many batches' worth of groups")
    ap.add_argument("--skip-same-scores", action="store_true", help="do not post groups whose scores are all equal (Atropos's default)")
    ap.add_argument("--gzip", action="store_true", help="gzip-compress posted bodies")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()

    api = Http(args.api, 30, args.gzip)
    srv = Http(args.server, args.timeout)
    qs = load_questions(args.data, args.limit, args.question_field, args.answer_field)
    rng = random.Random(args.seed)
    log = lambda msg: print(f"gsm8k_env: {msg}", file=sys.stderr, flush=True)

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    def retrying(fn, what, patience=60.0):
        """fn() until it does not raise URLError; gives up (exit 0: the trainer is gone) after `patience` s."""
        t0 = time.time()
        while True:
            try:
                return fn()
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                if stop["now"] or time.time() - t0 > patience:
                    log(f"{what}: unreachable for {time.time() - t0:.0f} s ({e}); exiting")
                    sys.exit(0)
                time.sleep(1.0)

    # The trainer registers first; environments register once it polls for batches.
    while True:
        st, info, _ = retrying(lambda: api.call("GET", "/info"), "GET /info", 300)
        if st == 200 and isinstance(info, dict) and info.get("batch_size", -1) > 0:
            break
        time.sleep(0.5)
    reg_body = {"max_token_length": info.get("max_token_len", 2048), "desired_name": args.name,
                "weight": args.weight, "group_size": args.group_size, "min_batch_allocation": None}
    while True:
        st, reg, _ = retrying(lambda: api.call("POST", "/register-env", reg_body), "POST /register-env", 300)
        if st == 200 and reg.get("status") == "success":
            break
        if st != 200:
            sys.exit(f"gsm8k_env: POST /register-env: HTTP {st}: {reg}")
        time.sleep(0.5)
    env_id = reg["env_id"]
    batch_size = info["batch_size"]
    log(f"registered as {reg['wandb_name']} (env_id {env_id}); batch_size {batch_size}, starting_step {reg['starting_step']}")

    model = args.model
    if not model:
        st, models, _ = retrying(lambda: srv.call("GET", "/v1/models"), "GET /v1/models", 300)
        model = models["data"][0]["id"] if st == 200 else "default"

    posted = 0
    try:
        while not stop["now"] and (args.max_groups == 0 or posted < args.max_groups):
            st, status, _ = retrying(lambda: api.call("GET", f"/status-env?env_id={env_id}"), "GET /status-env")
            if st == 200 and status.get("queue_size", 0) * args.group_size > args.off_policy_tolerance * batch_size:
                time.sleep(0.5)
                continue
            question, gold = qs[rng.randrange(len(qs))]
            req = {"model": model, "prompt": args.prompt_template.format(question=question), "n": args.group_size,
                   "max_tokens": args.max_tokens, "temperature": args.temperature, "logprobs": 0,
                   "return_token_ids": True, "seed": rng.randrange(1 << 31)}
            st, out, _ = retrying(lambda: srv.call("POST", "/v1/completions", req), "POST /v1/completions")
            if st != 200:
                log(f"POST /v1/completions: HTTP {st}: {str(out)[:300]}")
                time.sleep(1.0)
                continue
            version = out.get("policy_version")
            group = {"tokens": [], "masks": [], "scores": [], "inference_logprobs": [],
                     "generation_params": {"temperature": args.temperature, "max_tokens": args.max_tokens},
                     "env_id": env_id}
            if version is not None:
                group["generation_params"]["policy_version"] = version
            for ch in out["choices"]:
                prompt_ids, comp_ids = ch["prompt_token_ids"], ch["token_ids"]
                if not comp_ids:
                    continue
                lps = ch["logprobs"]["token_logprobs"]
                group["tokens"].append(prompt_ids + comp_ids)
                group["masks"].append([-100] * len(prompt_ids) + comp_ids)
                group["inference_logprobs"].append([1.0] * len(prompt_ids) + [float(x) for x in lps])
                group["scores"].append(score(ch["text"], gold))
            if len(group["tokens"]) < 2:
                continue
            if args.skip_same_scores and len(set(group["scores"])) == 1:
                continue
            while True:
                st, ack, hdrs = retrying(lambda: api.call("POST", "/scored_data", group), "POST /scored_data")
                if st == 200:
                    break
                if st in (429, 503):  # backpressure: the queue is full
                    time.sleep(float(hdrs.get("Retry-After", "1")))
                    continue
                sys.exit(f"gsm8k_env: POST /scored_data: HTTP {st}: {ack}")
            posted += 1
            mean = sum(group["scores"]) / len(group["scores"])
            log(f"posted group {posted} (policy_version {version}, mean score {mean:.2f})")
    except KeyboardInterrupt:
        pass
    try:
        api.call("POST", "/disconnect-env", {"env_id": env_id})
    except (urllib.error.URLError, ConnectionError):
        pass
    log(f"done: {posted} groups posted")


if __name__ == "__main__":
    main()
