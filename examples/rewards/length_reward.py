#!/usr/bin/env python3
"""A grpo.cpp "command" reward (standard library only).

Protocol (docs/rewards.md): one JSON request per line on stdin,
  {"id": 7, "prompt": "...", "completion": "...", "answer": "12", "metadata": {...}}
and one JSON answer per line on stdout, flushed,
  {"id": 7, "score": 0.5}    or    {"id": 7, "error": "why"}.
Exit when stdin ends. Anything written to stderr shows up in grpo's error
messages if this process dies, so print debugging goes there, never to stdout.

Score: 1 when the text inside <answer>...</answer> equals the gold answer
(as numbers when both parse), and a small bonus for stopping early, so that a
correct short completion beats a correct rambling one.
"""
import json
import re
import sys

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)


def same(a, b):
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


def score(req):
    completion = req["completion"]
    m = ANSWER.search(completion)
    correct = 1.0 if m and same(m.group(1), req["answer"]) else 0.0
    brevity = 0.1 * max(0.0, 1.0 - len(completion) / 64.0)
    return correct + brevity


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            out = {"id": req["id"], "score": score(req)}
        except Exception as e:  # report, keep serving the other completions
            out = {"id": req.get("id"), "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
