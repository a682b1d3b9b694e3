#!/usr/bin/env python3
# Fuzz test of `grpo serve` over raw sockets (stdlib only): sends >= 1,000
# malformed or mutated requests, generated from a fixed seed, while 20 partial
# requests are held open, and checks that every answer is a well-formed HTTP
# response with a 4xx status and an OpenAI error body (or, for requests that
# are not parsable HTTP, a closed connection) - never a 5xx, never a crash.
# Afterwards the server must be alive, answer greedy requests exactly as before,
# and report the same KV-cache usage on /metrics as before (no leaked block).
#
# Usage: fuzz_server.py --url http://127.0.0.1:PORT [--count 1200] [--seed 1]
#          [--time-limit 150] [--server-pid PID] [--kv-metric NAME] [--api-key KEY]
import argparse
import json
import os
import random
import re
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

PROMPT = "Mia has 3 pens, gets 4 more. How many now?\n"
# Kinds of expectation:
#   error  - parsable HTTP carrying a bad request: 4xx with an OpenAI error body
#   any    - may be valid after mutation: 2xx, or 4xx with an OpenAI error body
#   http   - not parsable HTTP (or framing the server may refuse to read): a
#            closed connection or a 4xx; an error body, if JSON, must be well-formed
ERROR, ANY, HTTP = "error", "any", "http"


class Server:
    def __init__(self, url, api_key):
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.api_key = api_key

    def auth(self):
        return f"Authorization: Bearer {self.api_key}\r\n".encode() if self.api_key else b""

    def request(self, method, path, body=b"", extra=b"", content_length=True):
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nConnection: close\r\n".encode()
        head += self.auth() + extra
        if content_length:
            head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        return head + b"\r\n" + body

    def exchange(self, raw, timeout=30.0):
        """Sends raw bytes and reads until the server closes. Returns the bytes
        read, or None when the connection was closed/reset with nothing read."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            try:
                s.sendall(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may refuse an oversized upload mid-way and answer anyway
            chunks = []
            deadline = time.monotonic() + timeout
            while True:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    c = s.recv(65536)
                except ConnectionResetError:
                    break
                except socket.timeout:
                    raise TimeoutError(f"no complete answer within {timeout:.0f} s")
                if not c:
                    break
                chunks.append(c)
            data = b"".join(chunks)
            return data or None
        finally:
            s.close()


def parse_response(data):
    """Splits a raw HTTP/1.x response into (status, headers, body); raises
    ValueError when it is not well-formed."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("no end of headers")
    lines = head.split(b"\r\n")
    m = re.fullmatch(rb"HTTP/1\.[01] (\d{3})(?: .*)?", lines[0])
    if not m:
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        k, colon, v = line.partition(b":")
        if not colon or not k or k != k.strip():
            raise ValueError(f"bad header line {line[:80]!r}")
        headers[k.decode("latin-1").lower()] = v.strip().decode("latin-1")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while True:
            size_line, crlf, rest = rest.partition(b"\r\n")
            if not crlf:
                raise ValueError("chunked body cut short")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2:]
        body = out
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if len(body) != n:
            raise ValueError(f"Content-Length {n} but {len(body)} body bytes")
    return int(m.group(1)), headers, body


def check_error_body(body):
    try:
        obj = json.loads(body)
    except ValueError:
        raise ValueError(f"4xx body is not JSON: {body[:200]!r}")
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not err["message"]:
        raise ValueError(f"4xx body is not an OpenAI error object: {body[:200]!r}")
    for f in ("type", "param", "code"):
        if f not in err:
            raise ValueError(f"OpenAI error object lacks '{f}': {body[:200]!r}")


def judge(kind, data):
    """Returns None when the answer is acceptable for this kind, else why not."""
    if data is None:
        return None if kind == HTTP else "connection closed without an answer"
    try:
        status, headers, body = parse_response(data)
    except ValueError as e:
        return f"malformed HTTP response ({e}): {data[:200]!r}"
    if status >= 500:
        return f"status {status}: {body[:300]!r}"
    if 400 <= status < 500:
        if kind == HTTP and (not body or "json" not in headers.get("content-type", "")):
            return None
        try:
            check_error_body(body)
        except ValueError as e:
            return f"status {status}: {e}"
        if status == 429 and "retry-after" not in headers:
            return "429 without Retry-After"
        return None
    if kind == ERROR:
        return f"status {status} for a malformed request: {body[:200]!r}"
    if not 200 <= status < 300:
        return f"unexpected status {status}"
    return None


class Cases:
    """Builds the malformed requests, all from one seeded RNG."""

    def __init__(self, srv, model, rng, max_body):
        self.srv, self.rng, self.max_body = srv, rng, max_body
        # The served name, so that requests reach the field checks instead of
        # stopping at "no such model".
        self.m = json.dumps(model)
        self.valid = {
            "/v1/completions": {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
            "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4},
            "/generate": {"prompt": {"prompt_token_ids": list(PROMPT.encode()[:12])}, "max_tokens": 4, "logprobs": 0},
            "/tokenize": {"model": model, "prompt": "abc"},
            "/detokenize": {"model": model, "tokens": [97, 98, 99]},
        }
        self.out = []

    def add(self, name, kind, raw):
        self.out.append((name, kind, raw))

    def post(self, path, body, **kw):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        return self.srv.request("POST", path, body, **kw)

    def pick_path(self):
        return self.rng.choice(sorted(self.valid))

    def invalid_json(self, n):
        samples = ["{", "}", "[1,2", '{"a":}', "nul", "tru", '{"model": "x",}', "{'model': 'x'}", '{"a" 1}',
                   '{"a":1}}', "/* c */ {}", '{"a":1} trailing', '"just a string', "", " ", "\x00", "{\"\\q\": 1}",
                   '{"a": 01}', '{"a": .5}', '{"a": 1.}', '{"a": -}', '{"a": 1e}', '{"a": "\\u12"}', "[,]"]
        for i in range(n):
            s = samples[i % len(samples)] if i < len(samples) else "".join(
                self.rng.choice('{}[]":,0123456789abcnulltrue\\ ') for _ in range(self.rng.randint(1, 60)))
            try:
                json.loads(s)
                continue  # random text that happens to be valid JSON is not this category
            except ValueError:
                pass
            self.add("invalid-json", ERROR, self.post(self.pick_path(), s))

    def truncated(self, n):
        for _ in range(n):
            path = self.pick_path()
            body = json.dumps(self.valid[path]).encode()
            self.add("truncated-body", ERROR, self.post(path, body[: self.rng.randint(0, len(body) - 1)]))

    def wrong_types(self, n):
        wrong = {str: [1, 2.5, True, [], {}, ["x"]], int: ["4", 4.5, True, [], {}, [4], {"v": 4}],
                 float: ["0.5", True, [], {}, [0.5]], list: ["x", 5, True, {}, 3.5], dict: ["x", 5, True, [], 1.5]}
        fields = {"/v1/completions": {"max_tokens": int, "temperature": float, "top_p": float, "n": int, "prompt": str,
                                      "logprobs": int, "stream": "bool", "stop": "stop", "seed": int, "echo": "bool"},
                  "/v1/chat/completions": {"messages": list, "max_tokens": int, "top_logprobs": int, "logprobs": "bool",
                                           "temperature": float, "n": int},
                  "/generate": {"prompt": dict, "max_tokens": int, "logprobs": int, "n": int, "temperature": float},
                  "/tokenize": {"prompt": str}, "/detokenize": {"tokens": list}}
        for _ in range(n):
            path = self.pick_path()
            field, t = self.rng.choice(sorted(fields[path].items()))
            body = dict(self.valid[path])
            if t == "bool":
                body[field] = self.rng.choice(["true", 1, [], {}, "yes"])
            elif t == "stop":  # a string or a list of strings
                body[field] = self.rng.choice([5, True, {}, 3.5, [1], [[]], ["a", 2]])
            else:
                body[field] = self.rng.choice(wrong[t])
            if path == "/v1/completions" and field == "prompt" and isinstance(body[field], list) \
                    and all(isinstance(x, str) for x in body[field]):
                continue  # a list of strings is a valid batch prompt
            self.add(f"wrong-type:{path}:{field}", ERROR, self.post(path, body))
        # wrong types deeper inside
        # Servers differ on custom roles, a missing content and mixed prompt
        # lists (vLLM accepts them), so those only must not crash.
        for bad, kind in (([{"role": 5, "content": "x"}], ERROR), ([{"role": "user", "content": 5}], ERROR),
                          ([{"role": "user"}], ANY), (["hi"], ERROR), ([{"role": "wizard", "content": "x"}], ANY),
                          ([[]], ERROR), ([None], ERROR)):
            body = dict(self.valid["/v1/chat/completions"], messages=bad)
            self.add("wrong-type:messages", kind, self.post("/v1/chat/completions", body))
        for bad, kind in (([1, "a"], ERROR), ([[1, 2], "x"], ANY), ([1.5], ERROR), ([True], ERROR), ([[]], ERROR),
                          ({"prompt_token_ids": [1]}, ERROR)):
            self.add("wrong-type:prompt", kind, self.post("/v1/completions", dict(self.valid["/v1/completions"], prompt=bad)))
        # vLLM's /generate also takes a text or token-id list as the prompt.
        for bad, kind in (({"prompt_token_ids": "abc"}, ERROR), ({"prompt_token_ids": [1.5]}, ERROR),
                          ({"prompt_token_ids": [[1]]}, ERROR), ({}, ERROR), ([1, 2], ANY), ("text", ANY), (5, ERROR)):
            self.add("wrong-type:generate-prompt", kind, self.post("/generate", dict(self.valid["/generate"], prompt=bad)))

    def numbers(self):
        huge = ["1e400", "-1e400", "18446744073709551617", "-9223372036854775809", "1" + "0" * 400, "9" * 5000]
        for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            base = json.dumps(self.valid[path])
            for field in ("max_tokens", "n", "temperature", "top_p", "top_k", "min_p"):
                for v in huge + ["-1", "-2147483649", "2147483648", "1e30", "-0.5"]:
                    body = base[:-1] + f', "{field}": {v}' + "}"
                    # vLLM reads top_k = -1 as "off", and a huge finite temperature
                    # or top_k is a legal (if odd) setting; none may crash.
                    legal = (field == "top_k" and v in ("-1", "2147483648", "1e30")) or \
                            (field == "temperature" and v in ("2147483648", "1e30"))
                    self.add(f"number:{path}:{field}={v[:12]}", ANY if legal else ERROR, self.post(path, body))
                for v in ("NaN", "Infinity", "-Infinity", "nan", "inf", "+1", "0x10", "1_000"):
                    body = base[:-1] + f', "{field}": {v}' + "}"
                    self.add(f"literal:{path}:{field}={v}", ERROR, self.post(path, body))
            for v in ("-1", "18446744073709551616", "1e400", "-9223372036854775809", "NaN"):
                body = base[:-1] + f', "seed": {v}' + "}"
                # A negative seed is accepted by some servers (vLLM), so only the
                # unrepresentable ones must be refused; none may crash.
                self.add(f"number:{path}:seed={v}", ANY if v == "-1" else ERROR, self.post(path, body))
        for ids in ([-1], [2 ** 31], [10 ** 20], [258, 259], [2 ** 63]):
            self.add("number:token-id", ERROR, self.post("/generate", dict(self.valid["/generate"], prompt={"prompt_token_ids": ids})))
            self.add("number:token-id", ERROR, self.post("/v1/completions", dict(self.valid["/v1/completions"], prompt=ids)))
            self.add("number:token-id", ERROR, self.post("/detokenize", dict(self.valid["/detokenize"], tokens=ids)))
        for k in (-1, 10 ** 6, 2 ** 40):
            self.add("number:logprobs", ERROR, self.post("/v1/completions", dict(self.valid["/v1/completions"], logprobs=k)))
            self.add("number:top_logprobs", ERROR, self.post("/v1/chat/completions",
                                                             dict(self.valid["/v1/chat/completions"], logprobs=True, top_logprobs=k)))
        self.add("number:long-prompt", ERROR, self.post("/generate", dict(self.valid["/generate"], prompt={"prompt_token_ids": [97] * 5000})))

    def lora_updates(self):
        # vLLM's runtime adapter endpoints (grpo serve --enable-lora-updates; 404 without it).
        # None of these may load or unload anything: the served adapters stay as they are.
        for body in ({}, {"lora_name": 5, "lora_path": "/"}, {"lora_name": "x"}, {"lora_path": "/"},
                     {"lora_name": "x", "lora_path": 7}, {"lora_name": "x", "lora_path": "/no/such/adapter"},
                     {"lora_name": "x", "lora_path": "/"}, {"lora_name": "", "lora_path": "/"},
                     {"lora_name": "x" * 100000, "lora_path": "/"}, {"lora_name": "x", "lora_path": "/\u0000"},
                     {"lora_name": "x", "lora_path": "/" * 5000}, [1, 2], "text", None):
            self.add("lora:load", ERROR, self.post("/v1/load_lora_adapter", json.dumps(body)))
        for body in ({}, {"lora_name": 5}, {"lora_name": "no-such-adapter"}, {"lora_name": ""}, {"lora_name": None},
                     {"lora_name": json.loads(self.m)}, [1], "x"):
            self.add("lora:unload", ERROR, self.post("/v1/unload_lora_adapter", json.dumps(body)))
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            self.add("lora:invalid-json", ERROR, self.post(path, '{"lora_name": "x", "lora_path": '))

    def nesting(self):
        for depth in (1000, 10000, 30000):
            self.add(f"nesting:array-{depth}", ERROR, self.post("/v1/completions", "[" * depth + "]" * depth))
            self.add(f"nesting:open-{depth}", ERROR, self.post("/generate", "[" * depth))
            inner = '{"a":' * depth + "1" + "}" * depth
            body = json.dumps(self.valid["/v1/completions"])[:-1] + ', "unknown": ' + inner + "}"
            self.add(f"nesting:unknown-field-{depth}", ANY, self.post("/v1/completions", body))
            prompt = "[" * depth + "1" + "]" * depth
            self.add(f"nesting:prompt-{depth}", ERROR, self.post("/v1/completions", '{"model": ' + self.m + ', "max_tokens": 2, "prompt": ' + prompt + "}"))
            msgs = '{"role": "user", "content": ' + "[" * depth + '"x"' + "]" * depth + "}"
            self.add(f"nesting:messages-{depth}", ERROR, self.post("/v1/chat/completions", '{"model": ' + self.m + ', "messages": [' + msgs + "]}"))

    def utf8(self):
        bad = [b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xf4\x90\x80\x80", b"abc\xc3"]
        for b in bad:
            for path, field in (("/v1/completions", "prompt"), ("/tokenize", "prompt"), ("/v1/chat/completions", None),
                                ("/v1/completions", "model"), ("/v1/completions", "stop")):
                if field is None:
                    body = b'{"model": ' + self.m.encode() + b', "max_tokens": 2, "messages": [{"role": "user", "content": "hi' + b + b'"}]}'
                elif field == "stop":
                    body = b'{"model": ' + self.m.encode() + b', "max_tokens": 2, "prompt": "hi", "stop": ["' + b + b'"]}'
                else:
                    rest = {k: v for k, v in self.valid[path].items() if k != field}
                    body = json.dumps(rest).encode()[:-1] + b', "' + field.encode() + b'": "x' + b + b'y"}'
                self.add(f"utf8:{path}:{field}", ERROR, self.srv.request("POST", path, body))
            self.add("utf8:key", ERROR, self.srv.request("POST", "/v1/completions", b'{"mod' + b + b'el": "m", "prompt": "x"}'))
        for esc in ("\\ud800", "\\udc00x", "\\ud800\\ud800"):
            body = json.dumps(self.valid["/v1/completions"])[:-1] + f', "prompt": "a{esc}b"' + "}"
            self.add("utf8:lone-surrogate", ERROR, self.post("/v1/completions", body))
        for b in bad:
            for header in (b"X-Custom: ", b"User-Agent: ", b"Content-Type: application/json; charset=", b"Authorization: Bearer "):
                extra = header + b + b"\r\n"
                body = json.dumps(self.valid["/tokenize"]).encode()
                head = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra
                if not header.startswith(b"Authorization"):
                    head += self.srv.auth()
                if not header.startswith(b"Content-Type"):
                    head += b"Content-Type: application/json\r\n"
                raw = head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                # Odd header bytes do not make a request malformed for an API
                # that ignores the header; a wrong Authorization must be a 401
                # only when a key is configured.
                self.add("utf8:header", HTTP if header.startswith(b"Content-Type") else ANY, raw)
            self.add("utf8:path", HTTP, b"GET /v1/mod" + b + b"els HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + self.srv.auth() + b"\r\n")

    def unknown_fields(self, n):
        for i in range(n):
            path = self.pick_path()
            body = dict(self.valid[path])
            for _ in range(self.rng.randint(1, 4)):
                key = "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(self.rng.randint(1, 20)))
                if key in body:
                    continue
                body[key] = self.rng.choice([1, "x", None, [1, 2], {"k": [1]}, True, -5.5])
            self.add(f"unknown-field:{path}", ANY, self.post(path, body))

    def methods_paths(self):
        for path in self.valid:
            for m in ("GET", "PUT", "DELETE", "PATCH"):
                self.add(f"method:{m}:{path}", ERROR, self.srv.request(m, path, b"{}"))
        for path in ("/health", "/v1/models", "/metrics"):
            for m in ("POST", "PUT", "DELETE"):
                self.add(f"method:{m}:{path}", ERROR, self.srv.request(m, path, b"{}"))
        bad_paths = ["/", "/v2/completions", "/v1/completion", "/v1/completions/extra", "/v1//completions", "/generate/",
                     "/v1/completions/../../etc/passwd", "/%00", "/v1/%2e%2e/generate", "/" + "a" * 4000, "/v1/models/../..",
                     "/v1/chat", "/tokenizer", "/V1/COMPLETIONS", "/v1/completions%20", "/.env"]
        for p in bad_paths:
            self.add(f"path:{p[:20]}", ERROR, self.srv.request("POST", p, json.dumps(self.valid["/v1/completions"]).encode()))
            self.add(f"path-get:{p[:20]}", ERROR, self.srv.request("GET", p, content_length=False))
        for m in ("FOO", "G E T", "", "GET\x00"):
            self.add(f"method-garbage:{m!r}", HTTP, m.encode() + b" /health HTTP/1.1\r\nHost: x\r\n\r\n")

    def sizes(self):
        for size in (self.max_body + 1, 2 * self.max_body, 4 * 1024 * 1024):
            body = b'{"model": ' + self.m.encode() + b', "max_tokens": 1, "prompt": "' + b"a" * size + b'"}'
            # A server may answer 413 before reading the body, or close.
            self.add(f"size:body-{size}", HTTP, self.srv.request("POST", "/v1/completions", body))
            self.add(f"size:body-413-{size}", HTTP, self.srv.request("POST", "/tokenize", body))
        for cl in (10 ** 12, 2 ** 63 - 1, 10 ** 30):
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {cl}\r\n").encode() + self.srv.auth() + b"\r\n"
            self.add(f"size:content-length-{cl}", HTTP, head + b'{"model": ' + self.m.encode() + b'}')
        for n_headers, size in ((1, 100_000), (2000, 20), (50, 4000)):
            extra = b"".join(f"X-H{i}: ".encode() + b"v" * size + b"\r\n" for i in range(n_headers))
            self.add(f"size:headers-{n_headers}x{size}", HTTP, self.srv.request("POST", "/tokenize",
                                                                                  json.dumps(self.valid["/tokenize"]).encode(), extra=extra))
        self.add("size:request-line", HTTP, b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")

    def framing(self):
        body = json.dumps(self.valid["/tokenize"]).encode()
        base = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" + self.srv.auth()
        for cl in (b"-1", b"abc", b"1e3", b"0x10", b" ", b"+5", b"99999999999999999999999", b"1, 2", str(len(body)).encode() + b"x"):
            self.add(f"framing:content-length={cl[:10]!r}", HTTP, base + b"Content-Length: " + cl + b"\r\n\r\n" + body)
        self.add("framing:two-content-lengths", HTTP, base + b"Content-Length: 5\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.add("framing:short-content-length", HTTP, base + b"Content-Length: " + str(len(body) // 2).encode() + b"\r\n\r\n" + body)
        self.add("framing:no-content-length", HTTP, base + b"\r\n" + body)
        for chunked in (b"zz\r\nabc\r\n0\r\n\r\n", b"5\r\n{\"a\"\r\n", b"-1\r\nx\r\n0\r\n\r\n", b"ffffffffffffffff\r\nx\r\n",
                        b"3\r\n{}}\r\n0\r\n\r\n", b"\r\n\r\n"):
            self.add("framing:bad-chunked", HTTP, base + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        self.add("framing:te-and-cl", HTTP, base + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n")
        for line in (b"POST /tokenize HTTP/9.9", b"POST /tokenize", b"POST  /tokenize  HTTP/1.1", b"POST /tokenize HTTP/1.1 extra",
                     b"\r\n\r\n", b"POST /tokenize HTTP/1.1\nHost: x\n\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                     b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):
            self.add("framing:request-line", HTTP, line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        self.add("framing:header-no-colon", HTTP, b"GET /health HTTP/1.1\r\nHost x\r\nBroken\r\n\r\n")
        self.add("framing:header-space-before-colon", HTTP, b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n")
        self.add("framing:nul-in-header", HTTP, b"GET /health HTTP/1.1\r\nHost: x\x00y\r\n\r\n")
        self.add("framing:empty", HTTP, b"")

    def mutations(self, n):
        for i in range(n):
            path = self.pick_path()
            body = bytearray(json.dumps(self.valid[path]).encode())
            for _ in range(self.rng.randint(1, 6)):
                op = self.rng.randrange(5)
                pos = self.rng.randrange(len(body) + 1)
                if op == 0 and body:
                    body[min(pos, len(body) - 1)] = self.rng.randrange(256)
                elif op == 1:
                    body[pos:pos] = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 8)))
                elif op == 2 and body:
                    del body[pos:pos + self.rng.randint(1, 8)]
                elif op == 3:
                    tok = self.rng.choice([b"-1", b"1e999", b"null", b"[]", b"{}", b'"', b"\\", b"99999999999", b",", b":", b"true"])
                    body[pos:pos] = tok
                else:
                    a = self.rng.randrange(len(body) + 1)
                    body[pos:pos] = body[a:a + self.rng.randint(1, 16)]
            body = bytes(body)
            if i % 5 == 4:
                # Mutate the whole request, headers included.
                raw = bytearray(self.srv.request("POST", path, body))
                for _ in range(self.rng.randint(1, 4)):
                    p = self.rng.randrange(len(raw))
                    raw[p] = self.rng.randrange(256)
                self.add(f"mutation-raw:{path}", HTTP, bytes(raw))
            else:
                self.add(f"mutation:{path}", ANY, self.srv.request("POST", path, body))


def get(srv, path, timeout=30.0):
    data = srv.exchange(srv.request("GET", path, content_length=False), timeout)
    if data is None:
        raise RuntimeError(f"GET {path}: connection closed without an answer")
    return parse_response(data)


def post_json(srv, path, obj):
    data = srv.exchange(srv.request("POST", path, json.dumps(obj).encode()), 60.0)
    if data is None:
        raise RuntimeError(f"POST {path}: connection closed without an answer")
    status, _, body = parse_response(data)
    if status != 200:
        raise RuntimeError(f"POST {path}: status {status}: {body[:300]!r}")
    return json.loads(body)


def greedy_answers(srv, model):
    out = []
    for p in (PROMPT, "Leo has 9 cups, gives away 5. How many now?\n"):
        c = post_json(srv, "/v1/completions", {"model": model, "prompt": p, "max_tokens": 16, "temperature": 0})
        g = post_json(srv, "/generate", {"prompt": {"prompt_token_ids": list(p.encode())}, "max_tokens": 16,
                                         "temperature": 0, "logprobs": 0})
        out.append((c["choices"][0]["text"], g["token_ids"][0] if "token_ids" in g else g["text"][0]))
    return out


def kv_metrics(srv, name):
    status, _, body = get(srv, "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics: status {status}")
    values = {}
    for line in body.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        key = parts[0]
        metric = key.split("{", 1)[0]
        if (metric == name) if name else re.search(r"kv.*(used|usage|free|in_use)", metric) and "cached" not in metric \
                and not metric.endswith(("_total", "_bucket", "_sum", "_count")):
            values[key] = float(parts[1])
    if not values:
        raise RuntimeError(f"/metrics has no KV usage gauge ({'named ' + name if name else 'name matching kv.*(used|usage|free)'}); "
                           "pass --kv-metric NAME with the gauge the server exports")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, default=1200, help="malformed requests to send at least")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=150.0, help="seconds for the whole run")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--held", type=int, default=20, help="partial requests held open during the run")
    ap.add_argument("--max-body-bytes", type=int, default=1 << 20, help="the server's --max-body-bytes")
    ap.add_argument("--server-pid", type=int, default=0)
    ap.add_argument("--kv-metric", default="", help="gauge of KV blocks in use (default: found by name)")
    ap.add_argument("--api-key", default="")
    args = ap.parse_args()

    t0 = time.monotonic()
    srv = Server(args.url, args.api_key)
    status, _, body = get(srv, "/v1/models")
    if status != 200:
        sys.exit(f"GET /v1/models: status {status}; is the server up at {args.url}?")
    model = json.loads(body)["data"][0]["id"]
    # Read while the server is idle (no request yet from this test).
    kv_before = kv_metrics(srv, args.kv_metric)
    before = greedy_answers(srv, model)

    rng = random.Random(args.seed)
    cases = Cases(srv, model, rng, args.max_body_bytes)
    cases.invalid_json(80)
    cases.truncated(100)
    cases.wrong_types(150)
    cases.numbers()
    cases.nesting()
    cases.lora_updates()
    cases.utf8()
    cases.unknown_fields(60)
    cases.methods_paths()
    cases.sizes()
    cases.framing()
    cases.mutations(max(300, args.count - len(cases.out)))
    todo = cases.out
    rng.shuffle(todo)

    # Partial requests left open: headers promising a body that never comes,
    # and headers that never end.
    held = []
    for i in range(args.held):
        s = socket.create_connection((srv.host, srv.port), timeout=10)
        if i % 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"mod")
        else:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        held.append(s)

    failures, closed, statuses = [], 0, {}
    lock = threading.Lock()

    def run(case):
        nonlocal closed
        name, kind, raw = case
        if time.monotonic() - t0 > args.time_limit:
            return
        try:
            data = srv.exchange(raw)
            why = judge(kind, data)
        except (OSError, TimeoutError) as e:
            data, why = None, f"{type(e).__name__}: {e}"
        with lock:
            if data is None and why is None:
                closed += 1
            elif data is not None:
                m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
                code = m.group(1).decode() if m else "?"
                statuses[code] = statuses.get(code, 0) + 1
            if why:
                failures.append(f"{name} ({kind}): {why}\n    request: {raw[:160]!r}")

    done = 0
    with ThreadPoolExecutor(args.workers) as pool:
        for i in range(0, len(todo), 200):
            list(pool.map(run, todo[i:i + 200]))
            done = min(len(todo), i + 200)
            if args.server_pid:
                try:
                    os.kill(args.server_pid, 0)
                except ProcessLookupError:
                    failures.append(f"the server process {args.server_pid} died after about {done} requests")
                    break
            if get(srv, "/health")[0] != 200:
                failures.append(f"/health is not 200 after {done} requests")
            if time.monotonic() - t0 > args.time_limit:
                failures.append(f"time limit of {args.time_limit:.0f} s reached after {done} of {len(todo)} requests")
                break
    for s in held:
        s.close()

    # The engine needs a moment to finish requests the fuzzer gave up on.
    kv_after = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        kv_after = kv_metrics(srv, args.kv_metric)
        if kv_after == kv_before:
            break
        time.sleep(0.5)
    if kv_after != kv_before:
        failures.append(f"KV usage before {kv_before} != after {kv_after}: blocks leaked")
    after = greedy_answers(srv, model)
    if after != before:
        failures.append(f"greedy answers changed: before {before!r}, after {after!r}")
    if args.server_pid:
        try:
            os.kill(args.server_pid, 0)
        except ProcessLookupError:
            failures.append("the server process died")

    elapsed = time.monotonic() - t0
    print(f"fuzz_server: {done} malformed requests in {elapsed:.1f} s (seed {args.seed}, {args.held} held open); "
          f"statuses {dict(sorted(statuses.items()))}, {closed} closed without answer; KV {kv_before} -> {kv_after}")
    if done < args.count:
        failures.append(f"only {done} requests were sent, fewer than --count {args.count}")
    if failures:
        print(f"fuzz_server: {len(failures)} FAILURES", file=sys.stderr)
        for f in failures[:50]:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print("fuzz_server: OK")


if __name__ == "__main__":
    main()
