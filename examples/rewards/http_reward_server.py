#!/usr/bin/env python3
"""A grpo.cpp "http" reward server (standard library only).

  python3 examples/rewards/http_reward_server.py --port 8765

Accepts both request shapes of docs/rewards.md on POST (any path):
  batch:  {"items": [{"prompt", "completion", "answer", "metadata"}, ...]} -> {"scores": [...]}
  single: {"prompt", "completion", "answer", "metadata"}                  -> {"score": x}
Scores like length_reward.py: 1 for the gold answer inside <answer>...</answer>
plus a small brevity bonus. Threaded, so grpo's max_concurrency requests are
served side by side. --api-key makes it require "Authorization: Bearer KEY".
"""
import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def same(a, b):
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def score(item):
    completion = item["completion"]
    m = ANSWER.search(completion)
    correct = 1.0 if m and same(m.group(1), item["answer"]) else 0.0
    return correct + 0.1 * max(0.0, 1.0 - len(completion) / 64.0)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: grpo reuses one connection per worker
    api_key = None

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self.api_key and self.headers.get("Authorization") != "Bearer " + self.api_key:
            return self.reply(401, {"error": "bad or missing API key"})
        try:
            req = json.loads(raw)
            if "items" in req:
                return self.reply(200, {"scores": [score(it) for it in req["items"]]})
            return self.reply(200, {"score": score(req)})
        except (ValueError, KeyError, TypeError) as e:
            return self.reply(400, {"error": f"{type(e).__name__}: {e}"})

    def log_message(self, fmt, *args):  # quiet: one line per request is too much during training
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    Handler.api_key = args.api_key
    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"scoring on http://{args.host}:{args.port}/", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
