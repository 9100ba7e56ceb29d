#!/usr/bin/env python3
"""Golden renders of the chat templates in chat_templates/, by Jinja2 set up as
transformers' apply_chat_template sets it up (an immutable sandbox, trim_blocks,
lstrip_blocks, loopcontrols, the {% generation %} tag, raise_exception,
strftime_now, and tojson as json.dumps(ensure_ascii=False)).

Writes chat_template_goldens.json beside this script; jinja_test.cc renders the
same conversations with Kiln's evaluator (and, for the templates marked
representable, with the pieces the compiler derives) and compares.

    python3 tests/unit/compiler/gen_chat_template_goldens.py   # needs python3-jinja2
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


class Generation(Extension):  # transformers' AssistantTracker, without the tracking
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def content(message, list_content, image_token):
    """The message as the compiler's probes and the runtime write it (ChatTemplate.cpp)."""
    if list_content:
        items = [{"type": "image"}] if message.get("image") else []
        return items + [{"type": "text", "text": message["text"]}]
    return (image_token + "\n" if message.get("image") else "") + message["text"]


def render(env, source, variables, messages, list_content, image_token, add_generation_prompt=True):
    conv = [{"role": m["role"], "content": content(m, list_content, image_token)} for m in messages]
    return env.from_string(source).render(messages=conv, add_generation_prompt=add_generation_prompt, tools=None,
                                          documents=None, **variables)


def M(role, text, image=False):
    return {"role": role, "text": text, "image": image}


CHAT = [
    [M("user", "Hello!")],
    [M("system", "You are terse."), M("user", "What is 2+2?")],
    [M("user", "Hi"), M("assistant", "Hello. How can I help?"), M("user", "  Tell me a joke.\n")],
    [M("system", " Be kind. "), M("user", "a"), M("assistant", "b"), M("user", "c"), M("assistant", "d"),
     M("user", "e\nf")],
    [M("user", "one"), M("user", "two")],
    [M("assistant", "I start."), M("user", "ok")],
    [M("user", "x"), M("system", "late system"), M("user", "y")],
    [M("user", "Unicode: héllo 你好 👋🏽 مرحبا")],
    [M("user", "\u00a0\u3000 spaces:\u2003Python's isspace()\u2028\x1c \u200b"), M("assistant", "\u0085ok\u202f"),
     M("user", "\u205f\u1680x y\u2009")],
]
IMAGES = [
    [M("user", "What is in the picture?", True)],
    [M("system", "Describe parts."), M("user", "How do I install this?", True), M("assistant", "Turn it."),
     M("user", "Which way?")],
    [M("user", "Hi"), M("assistant", "Hello."), M("user", "And this one?", True)],
]

# name: (list content, variables, image token, representable as pieces)
TEMPLATES = {
    "llama3-instruct": (False, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, "", True),
    "qwen2-instruct": (False, {"bos_token": "", "eos_token": "<|im_end|>"}, "", True),
    "qwen3": (False, {"eos_token": "<|im_end|>"}, "", True),
    "smollm2": (False, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, "", True),
    "smolvlm": (True, {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>"}, "<image>", True),
    "llava-1.5": (True, {"bos_token": "<s>", "eos_token": "</s>"}, "<image>", True),
    "tinyllama": (False, {"bos_token": "<s>", "eos_token": "</s>"}, "", True),
    "mistral": (False, {"bos_token": "<s>", "eos_token": "</s>"}, "", True),
    "gemma": (False, {"bos_token": "<bos>", "eos_token": "<eos>"}, "", True),
    "whitespace": (False, {"bos_token": "<s>", "eos_token": "</s>"}, "", False),
    "expressions": (False, {"bos_token": "<s>", "eos_token": "</s>"}, "", False),
}


def main():
    env = environment()
    out = []
    for name, (list_content, variables, image_token, representable) in TEMPLATES.items():
        with open(os.path.join(HERE, "chat_templates", name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        cases = []
        for messages in CHAT + (IMAGES if image_token else []):
            for agp in (True, False):
                case = {"messages": messages, "add_generation_prompt": agp}
                try:
                    case["expected"] = render(env, source, variables, messages, list_content, image_token, agp)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
        out.append({"name": name, "list_content": list_content, "variables": variables, "image_token": image_token,
                    "representable": representable, "cases": cases})
    path = os.path.join(HERE, "chat_template_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {sum(len(t['cases']) for t in out)} renders of {len(out)} templates")


if __name__ == "__main__":
    main()
