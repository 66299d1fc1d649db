#!/usr/bin/env python3
"""Checks how `tessera serve` responses ended, for the fault and drain tests.

Usage: sse_check.py FILE...   (each: a body written by `curl -s[N] -w '\\n%{http_code}'`;
files named *.plain hold plain responses, the others streamed ones)

Prints one line per file:
  finished N         a 200 stream whose choices all finished, then [DONE] (N chunks)
  error N MESSAGE    a 200 stream that ended with an error event, then [DONE]
  plain 200          a plain response that succeeded
  http STATUS MESSAGE  any response refused or failed with a status and a JSON error
  cut N              a 200 stream that ended with neither: what must never happen
  bad ...            anything unparseable (a connection cut before the status: `bad 000`)
Exits 0.
"""
import json
import sys


def check_stream(text):
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    chunks = 0
    finished = False
    error = None
    done = bool(events) and events[-1] == "[DONE]"
    for event in events:
        if event == "[DONE]":
            continue
        try:
            body = json.loads(event)
        except ValueError:
            return "bad unparseable event %r" % event[:80]
        if "error" in body:
            error = body["error"].get("message", "")
            continue
        for choice in body.get("choices", []):
            chunks += 1
            if choice.get("finish_reason"):
                finished = True
    if error is not None and done:
        return "error %d %s" % (chunks, error)
    if finished and done:
        return "finished %d" % chunks
    return "cut %d" % chunks


def check(text, plain):
    body, _, status = text.rpartition("\n")
    if status == "200":
        return "plain 200" if plain else check_stream(body)
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return "bad %s %r" % (status, body[:80])
    return "http %s %s" % (status, message)


for path in sys.argv[1:]:
    text = open(path, encoding="utf-8", errors="replace").read()
    print(check(text, path.endswith(".plain")))
