#!/usr/bin/env python3
"""Tool calls and reasoning against a running `tessera serve` (tests/serve_test.sh).

Usage: tool_calls_check.py BASE_URL MODEL

The server runs with --tool-call-parser hermes --reasoning-parser qwen3. The demo model has
random-ish weights, so what it would say is not what is tested; what the server makes of it is:
 - tool_choice "required" and a named function are forced by the structured-output engine:
   under several seeds, plain and streamed, every call names a tool and its arguments validate
   against that tool's parameters (jsonschema), finish_reason is "tool_calls" ("stop" for a
   named call, as OpenAI's forced calls), parallel_tool_calls false gives one call, and a
   stream's deltas add up to the plain response of the same seed;
 - tool_choice "auto" (the default with tools on this server) through the hermes parser, and
   the qwen3 reasoning parser: a structured_outputs grammar makes the model write
   `<tool_call>` blocks and `<think>` text, so the parsers see known text, plain and streamed;
 - requests that cannot be served are 400s naming the field.
Prints PASS/FAIL lines; exits 1 on any failure.
"""
import json
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


def post(body):
    req = urllib.request.Request(
        BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(extra, stream, seed=0, max_tokens=440):
    """The choice as a plain response has it: {content, reasoning_content, tool_calls,
    finish_reason}; a stream's deltas are put together the way clients do."""
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "stream": stream,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            **extra}
    status, text = post(body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {text}")
    if not stream:
        choice = json.loads(text)["choices"][0]
        message = choice["message"]
        return {"content": message.get("content"),
                "reasoning_content": message.get("reasoning_content"),
                "tool_calls": message.get("tool_calls") or [],
                "finish_reason": choice["finish_reason"]}
    content, reasoning, calls, finish = "", None, [], None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"error event: {line}")
        for c in event.get("choices", []):
            delta = c.get("delta", {})
            content += delta.get("content") or ""
            if delta.get("reasoning_content"):
                reasoning = (reasoning or "") + delta["reasoning_content"]
            for d in delta.get("tool_calls") or []:
                i = d["index"]
                if i == len(calls):
                    if "id" not in d or "name" not in d.get("function", {}):
                        raise RuntimeError(f"a call's first delta lacks id or name: {d}")
                    calls.append({"id": d["id"], "type": d.get("type"),
                                  "function": {"name": d["function"]["name"],
                                               "arguments": ""}})
                elif i != len(calls) - 1 or "id" in d:
                    raise RuntimeError(f"delta out of order: {d}")
                calls[i]["function"]["arguments"] += d["function"].get("arguments", "")
            finish = c.get("finish_reason") or finish
    return {"content": content if content or not calls else None,
            "reasoning_content": reasoning, "tool_calls": calls, "finish_reason": finish}


def without_ids(choice):
    out = dict(choice)
    out["tool_calls"] = [{"name": c["function"]["name"],
                          "arguments": c["function"]["arguments"]}
                         for c in choice["tool_calls"]]
    return out


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "unit": {"$ref": "#/$defs/unit"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string", "maxLength": 30},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                            "maxItems": 3}},
    "required": ["query"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "search", "parameters": SEARCH}},
    {"type": "function", "function": {"name": "now"}},  # No parameters: any object.
]
SCHEMA_OF = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
             for t in TOOLS}


def valid_calls(calls):
    """None if every call names a tool and its arguments validate, else why not."""
    for call in calls:
        if call.get("type") != "function" or not call.get("id", "").startswith("chatcmpl-tool-"):
            return f"bad call envelope: {call}"
        name = call["function"]["name"]
        if name not in SCHEMA_OF:
            return f"unknown tool {name!r}"
        try:
            args = json.loads(call["function"]["arguments"])
            jsonschema.validate(args, SCHEMA_OF[name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{name}: {call['function']['arguments']!r}: {e}"
    return None


# ---- tool_choice "required": a JSON array of calls, forced.
for seed in range(4):
    plain = chat({"tools": TOOLS, "tool_choice": "required"}, False, seed)
    streamed = chat({"tools": TOOLS, "tool_choice": "required"}, True, seed)
    for kind, got in (("plain", plain), ("stream", streamed)):
        why = valid_calls(got["tool_calls"])
        check(f"required seed {seed} {kind}: calls valid",
              got["tool_calls"] and why is None, why or got)
        # A random-weight model may write calls until max_tokens: the cut element is then
        # content (never dropped), and finish_reason says "length".
        check(f"required seed {seed} {kind}: finish_reason tool_calls and no content, or cut",
              (got["finish_reason"] == "tool_calls" and got["content"] is None)
              or (got["finish_reason"] == "length" and got["content"]), got)
    check(f"required seed {seed}: stream adds up to the plain response",
          without_ids(plain) == without_ids(streamed), f"{plain} vs {streamed}")

for seed in range(3):
    for stream in (False, True):
        got = chat({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
                   stream, seed)
        check(f"required, parallel_tool_calls false, seed {seed} stream={stream}: one call",
              len(got["tool_calls"]) == 1 and valid_calls(got["tool_calls"]) is None, got)

# ---- A named function: its arguments, forced; finish_reason stays "stop". ("now" takes any
# object, which a random-weight model fills until max_tokens: its cut arguments would not parse.)
for name in ("get_weather", "search"):
    for seed in range(2):
        extra = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": name}}}
        plain = chat(extra, False, seed)
        streamed = chat(extra, True, seed)
        for kind, got in (("plain", plain), ("stream", streamed)):
            calls = got["tool_calls"]
            ok = len(calls) == 1 and calls[0]["function"]["name"] == name
            why = valid_calls(calls) if ok else "not one call of it"
            check(f"named {name} seed {seed} {kind}: one valid call",
                  ok and why is None, why or got)
            check(f"named {name} seed {seed} {kind}: finish_reason stop",
                  got["finish_reason"] == "stop", got)
        check(f"named {name} seed {seed}: stream adds up to the plain response",
              without_ids(plain) == without_ids(streamed), f"{plain} vs {streamed}")

# ---- tool_choice "auto" through the hermes parser: the grammar makes the model write the calls.
HERMES = ('root ::= "I will check. " call ("\\n" call)?\n'
          'call ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
          '{\\"city\\": \\"" [a-z]{1,8} "\\", \\"unit\\": \\"celsius\\"}}\\n</tool_call>"\n')
for seed in range(3):
    extra = {"tools": TOOLS, "structured_outputs": {"grammar": HERMES}}
    plain = chat(extra, False, seed)
    streamed = chat(extra, True, seed)
    for kind, got in (("plain", plain), ("stream", streamed)):
        calls = got["tool_calls"]
        check(f"auto hermes seed {seed} {kind}: content before the calls",
              got["content"] == "I will check. ", got)
        check(f"auto hermes seed {seed} {kind}: calls parsed",
              1 <= len(calls) <= 2 and valid_calls(calls) is None
              and all(c["function"]["name"] == "get_weather" for c in calls), got)
        check(f"auto hermes seed {seed} {kind}: finish_reason tool_calls",
              got["finish_reason"] == "tool_calls", got)
    check(f"auto hermes seed {seed}: stream adds up to the plain response",
          without_ids(plain) == without_ids(streamed), f"{plain} vs {streamed}")

# A call whose JSON does not parse stays in the content, whole.
BROKEN = 'root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {" [a-z]{1,5}'
for stream in (False, True):
    got = chat({"tools": TOOLS, "structured_outputs": {"grammar": BROKEN}}, stream, 1)
    check(f"auto hermes, broken call, stream={stream}: text kept as content",
          not got["tool_calls"] and got["content"].startswith("<tool_call>\n{\"name\"")
          and got["finish_reason"] == "stop", got)

# tool_choice "none": the same text is content.
got = chat({"tools": TOOLS, "tool_choice": "none", "structured_outputs": {"grammar": HERMES}},
           False, 0)
check("tool_choice none: calls left as content",
      not got["tool_calls"] and "<tool_call>" in got["content"], got)

# ---- The qwen3 reasoning parser.
THINK = 'root ::= "<think>" [a-z ]{1,30} "</think>" "\\n\\n" [a-z]{1,10}'
for seed in range(3):
    plain = chat({"structured_outputs": {"grammar": THINK}}, False, seed)
    streamed = chat({"structured_outputs": {"grammar": THINK}}, True, seed)
    for kind, got in (("plain", plain), ("stream", streamed)):
        r, c = got["reasoning_content"], got["content"] or ""
        check(f"reasoning seed {seed} {kind}: split at </think>",
              r is not None and 1 <= len(r) <= 30 and c.startswith("\n\n")
              and "<think>" not in r + c and "</think>" not in r + c, got)
    check(f"reasoning seed {seed}: stream adds up to the plain response",
          plain == streamed, f"{plain} vs {streamed}")
for stream in (False, True):
    got = chat({"structured_outputs": {"grammar": THINK}, "include_reasoning": False}, stream, 2)
    check(f"include_reasoning false stream={stream}: no reasoning_content",
          got["reasoning_content"] is None and (got["content"] or "").startswith("\n\n"), got)
# No <think> in the output (and none opened by the prompt): all content.
got = chat({"structured_outputs": {"regex": "[a-z]{3,9}"}}, False, 0)
check("reasoning: no think block, all content",
      got["reasoning_content"] is None and len(got["content"]) >= 3, got)
# Reasoning, then a tool call in the content.
BOTH = ('root ::= "<think>" [a-z ]{1,20} "</think>\\n\\n<tool_call>\\n{\\"name\\": \\"now\\", '
        '\\"arguments\\": {}}\\n</tool_call>"')
for stream in (False, True):
    got = chat({"tools": TOOLS, "structured_outputs": {"grammar": BOTH}}, stream, 3)
    check(f"reasoning then a call, stream={stream}",
          got["reasoning_content"] and len(got["tool_calls"]) == 1
          and got["tool_calls"][0]["function"]["name"] == "now"
          and json.loads(got["tool_calls"][0]["function"]["arguments"]) == {}
          and got["finish_reason"] == "tool_calls", got)


# ---- Requests that cannot be served: a 400 naming the field.
def bad(name, extra, param):
    body = {"model": MODEL, "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}], **extra}
    status, text = post(body)
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError):
        error = {}
    check(f"400: {name}", status == 400 and error.get("param") == param, f"{status} {text}")


bad("named tool not among the tools",
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    "tool_choice.function.name")
bad("required with response_format",
    {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
    "tool_choice")
bad("a parameters schema the engine refuses",
    {"tools": [{"type": "function", "function": {"name": "f", "parameters":
               {"type": "object", "properties": {"x": {"type": "number",
                                                       "multipleOf": 3}}}}}],
     "tool_choice": "required"}, "tools.[0].function.parameters")
bad("tool_choice without tools", {"tool_choice": "required"}, "tool_choice")
bad("a tool without a name", {"tools": [{"type": "function", "function": {}}]},
    "tools.[0].function.name")

print(f"{'FAILED' if failures else 'OK'}: {failures} failures")
sys.exit(1 if failures else 0)
