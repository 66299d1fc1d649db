#!/usr/bin/env python3
"""Hostile-client fuzzer for `tessera serve` (issue 14's acceptance run).

Sends --requests seeded malformed or hostile requests to a live server from
--workers threads, over raw sockets (so that broken HTTP can be sent too), and
then checks that:
  - every complete request got an answer in time (no hang), and the server
    never closed the connection on a well-formed request without a response;
  - no answer was a 5xx (the server's only documented 5xx, 503, means
    draining, and nothing drains during the run);
  - every 4xx on an API route carries an OpenAI-shaped JSON error body;
  - every 200 is a valid response (JSON with choices, or an SSE stream that
    ends in "data: [DONE]");
  - afterwards /health answers 200 and a normal greedy completion still gives
    --expected (the offline `tessera generate` text).

Python's standard library only: CI installs nothing from PyPI. Prints one
summary line per status class and exits non-zero on the first broken rule
(after the run, with the offending request's kind and a prefix of it).
"""

import argparse
import json
import random
import socket
import sys
import threading
import time

API_PATHS = ["/v1/completions", "/v1/chat/completions"]
# vLLM's tokenizer routes: 200s are checked for their own shapes.
TOKENIZER_PATHS = ["/tokenize", "/detokenize"]
# Fields of both endpoints with values of every kind, valid and not.
FIELD_VALUES = {
    "temperature": [0, 0.5, 1.0, 2.5, -1, 1e309, "hot", None, True, [1], 1e-30],
    "top_p": [0, 0.5, 1, 1.5, -0.1, "x", None, {}],
    "top_k": [-2, -1, 0, 1, 40, 2**31, 2**63, 2**64, 1.5, "k", None],
    "min_p": [0, 0.1, 1, 2, -1, None, "p"],
    "presence_penalty": [0, 2, -2, 3, -3, None, "a"],
    "frequency_penalty": [0, 1, -2.5, 1e10, None],
    "repetition_penalty": [0, 1, 1.2, -1, 1e309, None, "r"],
    "n": [1, 2, 0, -1, 3, 129, 100000, 2**40, 1.5, "2", None],
    "best_of": [1, 2, 0, None, "b"],
    "seed": [0, 1, -1, 2**63 - 1, -2**63, 2**64, 1.5, "s", None],
    "max_tokens": [1, 4, 0, -1, 2**31, 2**63, 2**64, 1.0, 1.5, "8", None],
    "max_completion_tokens": [1, 3, 0, -5, None, "x"],
    "min_tokens": [0, 1, 3, 100, -1, 2**40, None, "m"],
    "stop": ["\n", "", [], ["a", "b"], ["x"] * 50, [1, 2], [""], "s" * 5000,
             None, {"a": 1}],
    "stop_token_ids": [[], [2], [-1], [2**31], [1.5], ["a"], None, 7],
    "ignore_eos": [True, False, 1, "yes", None],
    "logprobs": [0, 1, 5, 20, 21, -1, True, False, None, "l", 10**6],
    "top_logprobs": [0, 1, 20, 21, -1, None, "t"],
    "echo": [True, False, None, 1],
    "stream": [True, False, None, "yes", 1],
    "stream_options": [{"include_usage": True}, {"include_usage": "y"}, {},
                       None, [], "o"],
    "logit_bias": [{}, {"1": 5}, None, [], "b"],
    "response_format": [{"type": "text"}, {"type": "json_object"}, {"type": 3},
                        None, "text", {}],
    "user": ["u", None, 5],
    "suffix": ["", "x", None, 3],
    "include_stop_str_in_output": [True, False, None, "x"],
    "skip_special_tokens": [True, False, None, 0],
    "spaces_between_special_tokens": [True, False, None],
    "add_generation_prompt": [True, False, None, "x"],
    "continue_final_message": [True, False, None],
    "chat_template_kwargs": [{}, {"enable_thinking": False}, None, [], "k"],
    "tools": [[], [{"type": "function", "function": {"name": "f"}}], None, {},
              "t"],
    "tool_choice": ["none", "auto", "required", None, 3,
                    {"type": "function", "function": {"name": "f"}}],
    "guided_json": [{"type": "object"}, None],
    "prompt_logprobs": [1, None],
    "use_beam_search": [True, False],
    "model": ["demo", "", "nope", None, 3, ["demo"]],
    "unknown_field_xyz": [1, "x", None, {"a": []}],
}


def deep(depth, open_char="[", close_char="]"):
    return open_char * depth + close_char * depth


def random_text(rng, n):
    choices = ["Once upon a time", " ", "\n", "é", "日本", "\U0001F600",
               "<s>", "</s>", "[INST]", "\\", "\"", "\x00", "\ud800"]
    out = []
    for _ in range(n):
        out.append(rng.choice(choices))
    return "".join(out)


def random_prompt(rng):
    kind = rng.randrange(12)
    if kind == 0:
        return random_text(rng, rng.randrange(0, 40))
    if kind == 1:
        return [random_text(rng, 3) for _ in range(rng.randrange(0, 5))]
    if kind == 2:
        return [rng.randrange(-5, 600) for _ in range(rng.randrange(0, 20))]
    if kind == 3:
        return [[rng.randrange(0, 512) for _ in range(3)]
                for _ in range(rng.randrange(0, 4))]
    if kind == 4:
        return [1, "a", [2]]
    if kind == 5:
        return [2**31, 2**63, -2**63]
    if kind == 6:
        return None
    if kind == 7:
        return {"text": "x"}
    if kind == 8:
        return [[]]
    if kind == 9:
        return [1.5, 2]
    if kind == 10:
        return "Once upon a time"
    return rng.choice([True, 3, 1e309])


def random_messages(rng):
    kind = rng.randrange(10)
    if kind == 0:
        return []
    if kind == 1:
        return "hello"
    if kind == 2:
        return [{"role": "user"}]
    if kind == 3:
        return [{"role": 3, "content": "x"}]
    if kind == 4:
        return [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    if kind == 5:
        return [{"role": "user", "content": [{"type": "image_url"}]}]
    if kind == 6:
        return [{"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c", "type": "function",
                                 "function": {"name": "f",
                                              "arguments": rng.choice(
                                                  ["{}", "{bad", 3])}}]},
                {"role": "user", "content": "x"}]
    if kind == 7:
        return [{"role": "user", "content": random_text(rng, 10)},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "b"}]
    if kind == 8:
        return [{"role": "system", "content": 5}]
    return [{"role": "user", "content": "Tell me a story"}]


def random_body(rng, path):
    body = {"model": "demo"}
    if path.endswith("chat/completions"):
        body["messages"] = random_messages(rng)
    else:
        body["prompt"] = random_prompt(rng)
    body["max_tokens"] = rng.choice([1, 2, 4, 8])
    for _ in range(rng.randrange(0, 6)):
        key = rng.choice(list(FIELD_VALUES))
        body[key] = rng.choice(FIELD_VALUES[key])
    # Keep what the server accepts cheap to generate.
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 16:
        if rng.random() < 0.9:
            body["max_tokens"] = 8
    if isinstance(body.get("n"), int) and body["n"] > 4 and rng.random() < 0.8:
        body["n"] = 2
    return body


def http_request(method, path, body=b"", headers=None, content_length=None):
    headers = dict(headers or {})
    if content_length is None:
        content_length = len(body)
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz", "Connection: close"]
    if method in ("POST", "PUT", "PATCH") or body:
        lines.append(f"Content-Length: {content_length}")
        headers.setdefault("Content-Type", "application/json")
    for k, v in headers.items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass") + body


class Case:
    """One request: its bytes, how it is sent, and what is expected."""

    def __init__(self, kind, data, path, complete=True, trickle=False):
        self.kind = kind
        self.data = data
        self.path = path
        self.complete = complete  # A well-formed, complete HTTP request.
        self.trickle = trickle    # Sent a few bytes at a time.


def tokenizer_body(rng, path):
    if path == "/detokenize":
        tokens = rng.choice([
            [rng.randrange(0, 600) for _ in range(rng.randrange(0, 40))],
            [1, -1], [2**31], [2**64], [1.5], ["1"], [None], [[1]], [1e308],
            "1 2", None, {}])
        return {"model": rng.choice(["demo", "other", None, 3]),
                "tokens": tokens}
    body = {"model": rng.choice(["demo", None, "other"])}
    if rng.random() < 0.5:
        body["messages"] = random_messages(rng)
        if rng.random() < 0.3:
            body["continue_final_message"] = rng.choice([True, 1, None])
    else:
        body["prompt"] = random_prompt(rng)
    for key in ("add_special_tokens", "return_token_strs",
                "add_generation_prompt"):
        if rng.random() < 0.3:
            body[key] = rng.choice([True, False, 0, "yes", None])
    return body


def make_case(rng, big_bytes):
    r = rng.random()
    path = rng.choice(API_PATHS)
    if r < 0.05:
        path = rng.choice(TOKENIZER_PATHS)
        body = json.dumps(tokenizer_body(rng, path), allow_nan=True).encode()
        return Case("tokenizer", http_request("POST", path, body), path)
    if r < 0.45:
        body = json.dumps(random_body(rng, path), allow_nan=True).encode()
        return Case("fields", http_request("POST", path, body), path)
    if r < 0.55:
        # Deep nesting in some field (or the whole body), [ or {.
        depth = rng.choice([65, 100, 1000, 20000, 80000])
        if rng.random() < 0.5:
            inner = deep(depth)
        else:
            inner = '{"a":' * depth + "1" + "}" * depth
        field = rng.choice(["a", "prompt", "messages", "tools",
                            "chat_template_kwargs", "stop", "logit_bias"])
        if path.endswith("chat/completions") and rng.random() < 0.5:
            body = ('{"model":"demo","messages":[{"role":"user","content":"x",'
                    '"extra":' + inner + '}],"max_tokens":2}')
        else:
            body = '{"model":"demo","prompt":"x","' + field + '":' + inner + \
                ',"b":1}'
        return Case("deep", http_request("POST", path, body.encode()), path)
    if r < 0.65:
        # Broken JSON: truncated, random bytes, invalid UTF-8, not an object.
        good = json.dumps(random_body(rng, path)).encode()
        choice = rng.randrange(6)
        if choice == 0:
            body = good[: rng.randrange(0, max(1, len(good)))]
        elif choice == 1:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        elif choice == 2:
            body = good.replace(b"demo", b"de\xff\xfemo")
        elif choice == 3:
            body = rng.choice([b"[]", b"null", b"3", b'"x"', b"", b"{}"])
        elif choice == 4:
            body = b'{"model":"demo","prompt":"\\ud800\\udfff\\u0000x"}'
        else:
            body = good + b"}" * rng.randrange(1, 5)
        return Case("json", http_request("POST", path, body), path)
    if r < 0.73:
        # Methods and routes.
        method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "POST", "HEAD",
                             "OPTIONS"])
        target = rng.choice(API_PATHS + ["/", "/v1", "/v1/models",
                                         "/v1/models/demo", "/v1/models/x",
                                         "/health", "/metrics", "/version",
                                         "/v1/completions?x=1",
                                         "/" + "a" * rng.randrange(1, 3000),
                                         "/v1/../etc/passwd", "/%00", "/v2"])
        body = b"{}" if method in ("POST", "PUT", "PATCH") else b""
        return Case("route", http_request(method, target, body), target)
    if r < 0.80:
        # Header junk: odd types, huge headers, duplicated lengths.
        body = json.dumps(random_body(rng, path)).encode()
        choice = rng.randrange(5)
        if choice == 0:
            data = http_request("POST", path, body,
                                {"Content-Type": "text/plain"})
            return Case("headers", data, path)
        if choice == 1:
            data = http_request("POST", path, body,
                                {"X-Junk": "j" * rng.choice([100, 8000, 70000])})
            return Case("headers", data, path, complete=False)
        if choice == 2:
            data = http_request("POST", path, body,
                                {"Transfer-Encoding": "chunked"})
            return Case("headers", data, path, complete=False)
        if choice == 3:
            data = (b"GARBAGE\r\n\r\n" if rng.random() < 0.5 else
                    b"POST " + path.encode() + b" HTTP/9.9\r\n\r\n")
            return Case("headers", data, path, complete=False)
        data = http_request("POST", path, body, content_length=-5)
        return Case("headers", data, path, complete=False)
    if r < 0.86:
        # Truncated body: Content-Length promises more than arrives.
        body = json.dumps(random_body(rng, path)).encode()
        data = http_request("POST", path, body[: len(body) // 2],
                            content_length=len(body))
        return Case("truncated", data, path, complete=False)
    if r < 0.90:
        # Huge bodies: a long prompt, many prompts, many stop strings.
        choice = rng.randrange(4)
        if choice == 0:
            body = json.dumps({"model": "demo",
                               "prompt": "Once upon a time " *
                               (rng.randrange(big_bytes // 4, big_bytes) // 17),
                               "max_tokens": 2}).encode()
        elif choice == 1:
            body = json.dumps({"model": "demo",
                               "prompt": ["Once"] * rng.choice([1025, 5000]),
                               "max_tokens": 1}).encode()
        elif choice == 2:
            body = json.dumps({"model": "demo", "prompt": "x",
                               "stop": ["s%d" % i for i in range(2000)],
                               "max_tokens": 2}).encode()
        else:
            body = json.dumps({"model": "demo",
                               "prompt": [1] * rng.choice([300, 100000]),
                               "max_tokens": 2}).encode()
        return Case("big", http_request("POST", "/v1/completions", body),
                    "/v1/completions")
    # Trickled: a valid request sent a few bytes at a time.
    body = json.dumps({"model": "demo", "prompt": "Once upon a time",
                       "max_tokens": 2}).encode()
    return Case("trickle", http_request("POST", "/v1/completions", body),
                "/v1/completions", trickle=True)


def read_response(sock, deadline):
    """(status, headers, body) or None when the server closed without one."""
    data = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no complete response in time")
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    if not data:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError("not an HTTP response: %r" % lines[0][:80])
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = b""
        rest = body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2:]
        body = out
    return status, headers, body


def send_case(host, port, case, timeout):
    deadline = time.time() + timeout
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if case.trickle:
            for i in range(0, len(case.data), 7):
                sock.sendall(case.data[i:i + 7])
                time.sleep(0.002)
        else:
            try:
                sock.sendall(case.data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # The server refused early (e.g. 413): read its answer.
        if not case.complete:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        try:
            return read_response(sock, deadline)
        except (BrokenPipeError, ConnectionResetError):
            return None
    finally:
        sock.close()


def check(case, response):
    """None when the answer is acceptable, else what is wrong."""
    if response is None:
        if case.complete:
            return "the server closed the connection without an answer"
        return None
    status, headers, body = response
    if status >= 500:
        return "HTTP %d: %r" % (status, body[:300])
    route = case.path.split("?")[0]
    api = (route in API_PATHS or route in TOKENIZER_PATHS or
           case.path.startswith("/v1"))
    if 400 <= status < 500 and api and case.complete and body:
        try:
            error = json.loads(body)
            if not isinstance(error.get("error", {}).get("message"), str):
                return "HTTP %d without an error object: %r" % (status, body[:200])
        except ValueError:
            return "HTTP %d with a non-JSON body: %r" % (status, body[:200])
    if status == 200 and route in TOKENIZER_PATHS:
        try:
            reply = json.loads(body)
        except ValueError:
            return "200 with a non-JSON body: %r" % body[:200]
        if route == "/tokenize":
            if (not isinstance(reply.get("tokens"), list) or
                    reply.get("count") != len(reply["tokens"])):
                return "/tokenize 200 without tokens and count: %r" % body[:200]
        elif not isinstance(reply.get("prompt"), str):
            return "/detokenize 200 without a prompt: %r" % body[:200]
        return None
    if status == 200 and case.path.split("?")[0] in API_PATHS:
        if headers.get("content-type", "").startswith("text/event-stream"):
            text = body.decode("utf-8", "replace")
            if not text.rstrip().endswith("data: [DONE]"):
                return "stream without [DONE]: %r" % text[-200:]
            for event in text.split("\n\n"):
                if event.startswith("data: ") and event != "data: [DONE]":
                    try:
                        json.loads(event[6:])
                    except ValueError:
                        return "bad SSE event: %r" % event[:200]
        else:
            try:
                reply = json.loads(body)
            except ValueError:
                return "200 with a non-JSON body: %r" % body[:200]
            if "error" in reply or not isinstance(reply.get("choices"), list):
                return "200 without choices: %r" % body[:200]
    return None


def completion_text(host, port, prompt, max_tokens):
    body = json.dumps({"model": "demo", "prompt": prompt,
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    response = send_case(host, port, Case("check", http_request(
        "POST", "/v1/completions", body), "/v1/completions"), 60)
    if response is None or response[0] != 200:
        return None
    return json.loads(response[2])["choices"][0]["text"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--big-bytes", type=int, default=20 << 20,
                        help="largest huge-prompt body (sizes are drawn up to it)")
    parser.add_argument("--expected", required=True,
                        help="greedy text of 'Once upon a time', 24 tokens")
    args = parser.parse_args()

    # Each case is made from its own seeded generator when it is sent, so the
    # run is reproducible whatever the worker interleaving, and huge bodies
    # are not all held in memory at once.
    def case_at(i):
        return make_case(random.Random(args.seed * 1000003 + i), args.big_bytes)
    statuses = {}
    problems = []
    lock = threading.Lock()
    next_case = [0]

    def worker():
        while True:
            with lock:
                i = next_case[0]
                next_case[0] += 1
            if (i >= args.requests or len(problems) > 20 or
                    statuses.get("refused")):
                return
            case = case_at(i)
            try:
                response = send_case(args.host, args.port, case, args.timeout)
                problem = check(case, response)
                key = "closed" if response is None else str(response[0])
            except ConnectionRefusedError:
                problem, key = "connection refused: the server is gone", "refused"
            except (TimeoutError, socket.timeout):
                problem, key = "no answer within %.0f s" % args.timeout, "timeout"
            except (ValueError, OSError) as e:
                problem, key = "transport: %s" % e, "error"
            with lock:
                statuses[key] = statuses.get(key, 0) + 1
                if problem:
                    problems.append((i, case.kind, problem,
                                     case.data[:160]))

    start = time.time()
    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - start
    sent = sum(statuses.values())
    print("fuzz: %d requests (seed %d) in %.1f s; answers: %s" % (
        sent, args.seed, seconds,
        ", ".join("%s=%d" % kv for kv in sorted(statuses.items()))))
    for i, kind, problem, data in problems[:20]:
        print("FUZZ PROBLEM #%d (%s): %s\n  request: %r" % (i, kind, problem, data))

    try:
        health = send_case(args.host, args.port, Case(
            "health", http_request("GET", "/health"), "/health"), 10)
    except OSError as e:
        health = "unreachable: %s" % e
    if health is None or health[0] != 200:
        problems.append((-1, "health", "/health after the run: %r" % (health,), b""))
        print("FUZZ PROBLEM: /health after the run answered %r" % (health,))
    try:
        text = completion_text(args.host, args.port, "Once upon a time", 24)
    except OSError as e:
        text = "unreachable: %s" % e
    if text != args.expected:
        problems.append((-1, "final", "final completion %r" % text, b""))
        print("FUZZ PROBLEM: the final completion gave %r, expected %r" % (
            text, args.expected))
    if sent != args.requests and not problems:
        problems.append((-1, "count", "only %d of %d sent" % (sent, args.requests), b""))
    print("fuzz: %s" % ("OK" if not problems else "%d problems" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
