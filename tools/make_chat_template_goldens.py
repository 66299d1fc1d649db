#!/usr/bin/env python3
"""Render chat templates with Hugging Face transformers, as golden outputs.

Usage:
    python3 tools/make_chat_template_goldens.py \
        [--templates tests/fixtures/chat_templates] [--out FILE] [--jinja-only]

For every <name>.jinja in the templates folder and every conversation below
(system+user, user only, multi-turn, tool call + tool result, reasoning,
special characters, ...), each with add_generation_prompt false and true, this
renders the template the way `tokenizer.apply_chat_template(messages,
tokenize=False, add_generation_prompt=...)` does and writes
<templates>/goldens.json (or --out):

    [{"template": "qwen3", "case": "system_user", "messages": [...],
      "add_generation_prompt": false, "extra": {...},
      "special_tokens": {...}, "expected": "..."}, ...]

A case whose template raises has "error" (the message) and "error_type"
(the Python exception class; "TemplateError" for raise_exception) instead of
"expected". "extra" holds the template's keyword arguments: tools and
documents when the case has them, date_string for the Llama 3 templates (so
no golden depends on the clock), enable_thinking for some Qwen 3 cases.
"special_tokens" are the tokenizer's named special tokens that
apply_chat_template passes (bos_token, eos_token, ...).

Rendering goes through transformers' own function, so the goldens carry its
Jinja environment exactly: render_jinja_template from
transformers.utils.chat_template_utils (4.5x and 5.x), or
_compile_jinja_template(...).render(...) where that is all there is. With
--jinja-only (for a machine without transformers) the script builds the same
environment by hand: jinja2.sandbox.ImmutableSandboxedEnvironment(
trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]) with
transformers' tojson, raise_exception and strftime_now; every case then
records "renderer": "jinja2 <version> (transformers environment rebuilt)".

Needs: transformers (or, with --jinja-only, jinja2). No network access.
"""

import argparse
import datetime
import inspect
import json
import os
import sys

# Special tokens of each template's tokenizer, as apply_chat_template passes
# them (tokenizer.special_tokens_map; tokens that are None are left out).
SPECIAL_TOKENS = {
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3.2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral-v0.2": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "llama2": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}
DEFAULT_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

# Template keyword arguments every case of a template gets.
TEMPLATE_EXTRA = {
    "llama3": {"date_string": "26 Jul 2024"},
    "llama3.2": {"date_string": "26 Jul 2024"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def conversations(template_name):
    """(case name, messages, extra keyword arguments) for one template."""
    cases = [
        ("system_user", [SYSTEM, {"role": "user", "content": "Hi"}], {}),
        ("user_only", [{"role": "user", "content": "What is 2+2?"}], {}),
        (
            "multi_turn",
            [
                {"role": "user", "content": "Hello!"},
                {"role": "assistant", "content": "Hi there. How can I help?"},
                {"role": "user", "content": "Tell me a joke."},
            ],
            {},
        ),
        (
            "system_multi_turn",
            [
                SYSTEM,
                {"role": "user", "content": "Hello!"},
                {"role": "assistant", "content": "Hi there. How can I help?"},
                {"role": "user", "content": "Tell me a joke."},
            ],
            {},
        ),
        (
            "tool_call",
            [
                SYSTEM,
                {"role": "user", "content": "What's the weather in Paris?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call12345",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": {"city": "Paris", "unit": "celsius"},
                            },
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "call12345",
                    "name": "get_weather",
                    "content": '{"temperature": 21, "sky": "clear"}',
                },
            ],
            {"tools": [WEATHER_TOOL]},
        ),
        (
            "tools_no_call",
            [{"role": "user", "content": "Is it raining in Oslo?"}],
            {"tools": [WEATHER_TOOL]},
        ),
        (
            "tool_call_string_arguments",
            [
                {"role": "user", "content": "Weather in Rome, in fahrenheit?"},
                {
                    "role": "assistant",
                    "content": "Let me check.",
                    "tool_calls": [
                        {
                            "id": "abcdef123",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": '{"city": "Rome", "unit": "fahrenheit"}',
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "abcdef123", "content": "75"},
                {"role": "assistant", "content": "It is 75°F in Rome."},
            ],
            {"tools": [WEATHER_TOOL]},
        ),
        (
            # Templates that enforce user/assistant alternation raise here.
            "roles_not_alternating",
            [{"role": "user", "content": "One"}, {"role": "user", "content": "Two"}],
            {},
        ),
        (
            "special_characters",
            [
                {
                    "role": "system",
                    "content": "  Ünïcödé: 日本語, emoji 🙂, quotes 'single' \"double\"  ",
                },
                {
                    "role": "user",
                    "content": "Backslash \\ tab\tnewline\nbraces {{ not a tag }} {% nor this %}\n\n",
                },
                {"role": "assistant", "content": " <b>bold</b> & ampersand "},
                {"role": "user", "content": "Ça va? Ελληνικά — “curly” quotes"},
            ],
            {},
        ),
    ]
    if template_name.startswith("qwen3"):
        cases += [
            (
                "reasoning_content",
                [
                    {"role": "user", "content": "What is 17*3?"},
                    {
                        "role": "assistant",
                        "content": "51",
                        "reasoning_content": "17*3 = 51.",
                    },
                    {"role": "user", "content": "And 17*4?"},
                ],
                {},
            ),
            (
                "inline_think",
                [
                    {"role": "user", "content": "Hi"},
                    {
                        "role": "assistant",
                        "content": "<think>\nThe user greets me.\n</think>\n\nHello!",
                    },
                ],
                {},
            ),
            (
                "enable_thinking_false",
                [{"role": "user", "content": "Hi"}],
                {"enable_thinking": False},
            ),
            (
                "enable_thinking_true",
                [{"role": "user", "content": "Hi"}],
                {"enable_thinking": True},
            ),
        ]
    return cases


def make_transformers_renderer():
    import transformers
    from transformers.utils import chat_template_utils as ctu

    version = "transformers %s" % transformers.__version__
    render_fn = getattr(ctu, "render_jinja_template", None)
    if render_fn is not None:
        params = inspect.signature(render_fn).parameters
        if "conversations" in params:

            def render(source, messages, add_generation_prompt, kwargs):
                kwargs = dict(kwargs)
                tools = kwargs.pop("tools", None)
                documents = kwargs.pop("documents", None)
                rendered, _ = render_fn(
                    conversations=[messages],
                    tools=tools,
                    documents=documents,
                    chat_template=source,
                    add_generation_prompt=add_generation_prompt,
                    **kwargs,
                )
                return rendered[0]

            return render, version + " render_jinja_template"

    compile_fn = ctu._compile_jinja_template

    def render(source, messages, add_generation_prompt, kwargs):
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        documents = kwargs.pop("documents", None)
        return compile_fn(source).render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    return render, version + " _compile_jinja_template"


def make_jinja_renderer():
    """transformers' environment, rebuilt (see _compile_jinja_template)."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    def render(source, messages, add_generation_prompt, kwargs):
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None)
        documents = kwargs.pop("documents", None)
        return env.from_string(source).render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    return render, "jinja2 %s (transformers environment rebuilt)" % jinja2.__version__


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_dir = os.path.join(here, "..", "tests", "fixtures", "chat_templates")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--templates", default=default_dir, help="folder of <name>.jinja files")
    parser.add_argument("--out", default=None, help="output file (default: <templates>/goldens.json)")
    parser.add_argument(
        "--jinja-only",
        action="store_true",
        help="rebuild transformers' Jinja environment instead of importing transformers",
    )
    args = parser.parse_args()

    render, renderer = make_jinja_renderer() if args.jinja_only else make_transformers_renderer()

    names = sorted(f[: -len(".jinja")] for f in os.listdir(args.templates) if f.endswith(".jinja"))
    if not names:
        sys.exit("no .jinja files in %s" % args.templates)
    goldens = []
    for name in names:
        with open(os.path.join(args.templates, name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        special = SPECIAL_TOKENS.get(name, DEFAULT_SPECIAL_TOKENS)
        for case, messages, case_extra in conversations(name):
            extra = dict(TEMPLATE_EXTRA.get(name, {}))
            extra.update(case_extra)
            for add_generation_prompt in (False, True):
                entry = {
                    "template": name,
                    "case": case,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "extra": extra,
                    "special_tokens": special,
                    "renderer": renderer,
                }
                # apply_chat_template: template_kwargs = {**special_tokens_map, **kwargs}
                kwargs = dict(special)
                kwargs.update(extra)
                try:
                    entry["expected"] = render(source, messages, add_generation_prompt, kwargs)
                except Exception as e:  # the template raised: that is the golden
                    entry["error"] = str(e)
                    entry["error_type"] = type(e).__name__
                goldens.append(entry)
        print("%-14s %d cases" % (name, sum(1 for g in goldens if g["template"] == name)))

    out = args.out or os.path.join(args.templates, "goldens.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for g in goldens if "error" in g)
    print("wrote %s: %d cases (%d raise), rendered with %s" % (out, len(goldens), errors, renderer))


if __name__ == "__main__":
    main()
