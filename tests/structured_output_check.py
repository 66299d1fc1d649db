#!/usr/bin/env python3
"""Structured output against a running `tessera serve` (tests/serve_test.sh).

Usage: structured_output_check.py BASE_URL MODEL

Every schema below is sent on both endpoints, plain and streamed, with
random sampling under several seeds (so the outputs walk many paths of each
grammar, not only the greedy one); every output must finish with
finish_reason "stop", parse, and validate against its schema with the
jsonschema package (formats checked too). Regexes must fullmatch, choices
must be one of the list. Bad schemas must be a 400 naming the field. Prints
PASS/FAIL lines; exits 1 on any failure.
"""
import json
import re
import sys
import urllib.error
import urllib.request

import jsonschema

BASE, MODEL = sys.argv[1], sys.argv[2]
failures = 0


def check(name, ok, detail=""):
    global failures
    if ok:
        print(f"PASS: {name}")
    else:
        failures += 1
        print(f"FAIL: {name}: {detail}")


def post(path, body):
    req = urllib.request.Request(
        BASE + path, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def generate(endpoint, extra, stream, seed, max_tokens=400):
    """(text, finish_reason) of one choice, or raises with the body."""
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": seed, "stream": stream, **extra}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Tell me about a cat"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Once upon a time"
        path = "/v1/completions"
    status, text = post(path, body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {text}")
    if not stream:
        choice = json.loads(text)["choices"][0]
        out = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        return out, choice["finish_reason"]
    out, finish = "", None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"error event: {line}")
        for c in event.get("choices", []):
            piece = (c.get("delta", {}).get("content") if endpoint == "chat"
                     else c.get("text"))
            out += piece or ""
            finish = c.get("finish_reason") or finish
    return out, finish


SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "alive": {"type": "boolean"}},
        "required": ["name", "age", "alive"], "additionalProperties": False},
    "optional_props": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 5},
                       "b": {"type": "null"},
                       "c": {"enum": ["x", "y", 3, None, True]}},
        "required": ["c"], "additionalProperties": False},
    "nested": {
        "type": "object",
        "properties": {
            "owner": {"type": "object",
                      "properties": {"first": {"type": "string", "maxLength": 6},
                                     "tags": {"type": "array", "maxItems": 3,
                                              "items": {"type": "string",
                                                        "maxLength": 4}}},
                      "required": ["first", "tags"],
                      "additionalProperties": False},
            "score": {"type": "number", "minimum": 0}},
        "required": ["owner", "score"], "additionalProperties": False},
    "array_bounds": {"type": "array", "minItems": 2, "maxItems": 4,
                     "items": {"type": "integer", "minimum": 10,
                               "maximum": 99}},
    "prefix_items": {"type": "array",
                     "prefixItems": [{"const": "id"}, {"type": "integer",
                                                       "minimum": 0,
                                                       "maximum": 9}],
                     "items": False},
    "defs_and_refs": {
        "$defs": {"color": {"enum": ["red", "green", "blue"]},
                  "point": {"type": "object",
                            "properties": {"x": {"type": "integer",
                                                 "minimum": 0, "maximum": 9},
                                           "color": {"$ref": "#/$defs/color"}},
                            "required": ["x", "color"],
                            "additionalProperties": False}},
        "type": "object",
        "properties": {"points": {"type": "array", "maxItems": 3,
                                  "items": {"$ref": "#/$defs/point"}}},
        "required": ["points"], "additionalProperties": False},
    "recursive": {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer",
                                                "minimum": 0, "maximum": 9},
                                          "next": {"anyOf": [
                                              {"$ref": "#/$defs/node"},
                                              {"type": "null"}]}},
                           "required": ["v", "next"],
                           "additionalProperties": False}},
        "$ref": "#/$defs/node"},
    "any_of_types": {"type": "object",
                     "properties": {"v": {"type": ["integer", "string",
                                                   "null"], "maxLength": 5}},
                     "required": ["v"], "additionalProperties": False},
    "unicode_strings": {
        "type": "object",
        "properties": {"city": {"enum": ["Zürich", "東京", "São Paulo",
                                         "naïve \"quoted\"", "tab\there"]},
                       "note": {"type": "string", "maxLength": 8}},
        "required": ["city", "note"], "additionalProperties": False},
    "formats_and_patterns": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"},
                       "id": {"type": "string", "format": "uuid"},
                       "code": {"type": "string",
                                "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
        "required": ["day", "id", "code"], "additionalProperties": False},
    "all_of": {"allOf": [{"type": "object",
                          "properties": {"a": {"type": "boolean"}},
                          "required": ["a"]},
                         {"properties": {"b": {"const": 7}},
                          "required": ["b"]}]},
}
# Keys that are free strings have no bound, so such an output may be cut by
# max_tokens; a finished one must validate.
OPEN_SCHEMA = {"type": "object", "properties": {},
               "additionalProperties": {"type": "integer", "minimum": 0,
                                        "maximum": 3}}

FORMATS = jsonschema.FormatChecker()


def validate(schema, text):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=FORMATS)
    return value


for name, schema in SCHEMAS.items():
    for endpoint in ("completions", "chat"):
        for stream in (False, True):
            for seed in (1, 2, 3):
                label = f"{name} {endpoint} stream={stream} seed={seed}"
                try:
                    text, finish = generate(endpoint, {"guided_json": schema}
                                            if seed == 1 else
                                            {"response_format": {
                                                "type": "json_schema",
                                                "json_schema": {
                                                    "name": name,
                                                    "strict": True,
                                                    "schema": schema}}},
                                            stream, seed)
                    validate(schema, text)
                    check(label, finish == "stop", f"finish {finish}: {text!r}")
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    check(label, False, f"{type(e).__name__}: {e}")

for seed in (1, 2, 3, 4):
    try:
        text, finish = generate("completions", {"guided_json": OPEN_SCHEMA},
                                False, seed, 300)
        if finish == "stop":
            validate(OPEN_SCHEMA, text)
        check(f"additionalProperties schema {seed} ({finish})",
              finish in ("stop", "length"), f"{finish}: {text!r}")
    except Exception as e:  # noqa: BLE001
        check(f"additionalProperties schema {seed}", False, str(e))

# json_object: any JSON object.
for endpoint in ("completions", "chat"):
    for seed in (4, 5):
        try:
            text, finish = generate(
                endpoint, {"response_format": {"type": "json_object"}}, False,
                seed, max_tokens=200)
            if finish == "stop":
                check(f"json_object {endpoint} {seed}",
                      isinstance(json.loads(text), dict), text)
            else:
                # An object may be cut by max_tokens; what came is a prefix.
                check(f"json_object {endpoint} {seed} (cut)",
                      text.startswith("{"), text)
        except Exception as e:  # noqa: BLE001
            check(f"json_object {endpoint} {seed}", False, str(e))

for pattern in [r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,3}", r"\d{3}-\d{4}",
                r"(yes|no)!?", r"[^\s]{1,5}\.txt"]:
    for endpoint in ("completions", "chat"):
        for extra in ({"guided_regex": pattern},
                      {"structured_outputs": {"regex": pattern}}):
            try:
                text, finish = generate(endpoint, extra, True, 7, 100)
                check(f"regex {pattern} {endpoint}",
                      finish == "stop" and re.fullmatch(pattern, text),
                      f"{finish}: {text!r}")
            except Exception as e:  # noqa: BLE001
                check(f"regex {pattern} {endpoint}", False, str(e))

choices = ["happy", "sad", "a story about a dog"]
for endpoint in ("completions", "chat"):
    for seed in (1, 2, 3, 4):
        text, finish = generate(endpoint, {"guided_choice": choices}, False,
                                seed, 50)
        check(f"choice {endpoint} {seed}", finish == "stop" and text in choices,
              f"{finish}: {text!r}")

grammar = 'root ::= "(" num (" + " num){0,3} ")"\nnum ::= [1-9] [0-9]?\n'
for seed in (9, 10):
    text, finish = generate("completions", {"guided_grammar": grammar}, False,
                            seed, 60)
    check(f"grammar {seed}", finish == "stop" and re.fullmatch(
        r"\([1-9][0-9]?( \+ [1-9][0-9]?){0,3}\)", text), f"{finish}: {text!r}")

# Bad specs: a 400 naming the field, and the server goes on.
for extra, param in [
        ({"guided_json": {"type": "object", "properties": {"a": {
            "type": "number", "maximum": 3}}}}, "guided_json"),
        ({"guided_regex": "(a"}, "guided_regex"),
        ({"guided_regex": "(a)\\1"}, "guided_regex"),
        ({"guided_grammar": "root ::= root \"x\""}, "guided_grammar"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#/$defs/missing"}}}},
         "response_format.json_schema.schema"),
        ({"guided_json": {"allOf": [{"properties": {"a": {}}}],
                          "additionalProperties": False}}, "guided_json"),
        ({"guided_json": {}, "guided_regex": "a"}, "guided_regex")]:
    status, body = post("/v1/completions",
                        {"model": MODEL, "prompt": "x", "max_tokens": 4,
                         **extra})
    err = json.loads(body).get("error", {}) if status == 400 else {}
    check(f"400 for {json.dumps(extra)[:60]}",
          status == 400 and err.get("param") == param, f"{status} {body}")

print(f"{'FAIL' if failures else 'PASS'}: structured output, {failures} failures")
sys.exit(1 if failures else 0)
