"""kiln-run --tokenize prints the ids the reference byte-level BPE (tests/models) gives the
text, and the text of each id; bad combinations are refused."""

import json
import os
import subprocess

from conftest import MODELS, run, tool
from kiln_models.tokenizer import ByteLevelBPE

TEXTS = [
    "How do I install this part?",
    "  leading spaces, tabs\tand\nnew lines  ",
    "digits 1234567 and punctuation!?;",
    "日本語のテキスト and emoji 🙂👍🏽",
    "<image>a placeholder inside text",
]


def _tokenize(artifact, text, *flags):
    out = run([tool("kiln-run"), artifact, "--tokenize", text, "--json", *flags]).stdout
    return json.loads(out)


def test_tokenize_matches_reference(tiny_dir):
    ckpt = tiny_dir / "tokenize-tiny-llava"
    artifact = tiny_dir / "tokenize-tiny-llava.kiln"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", ckpt])
    run([tool("kiln-compile"), ckpt, "-o", artifact, "--target=portable"])
    ref = ByteLevelBPE.load(str(ckpt / "tokenizer.json"))
    for text in TEXTS:
        got = _tokenize(artifact, text, "--no-special")
        want = ref.encode(text, add_special_tokens=False)
        assert got["ids"] == want, f"{text!r}: {got['ids']} != reference {want}"
        assert len(got["pieces"]) == len(got["ids"])
        # Every piece is the text of its id alone; for ASCII text they join to the text.
        if text.isascii():
            assert "".join(got["pieces"]) == text
        # By default the tokenizer's special tokens are added, as for a prompt.
        with_bos = _tokenize(artifact, text)["ids"]
        assert with_bos == ref.encode(text, add_special_tokens=True)


def test_tokenize_refuses_other_modes(tiny_dir):
    ckpt = tiny_dir / "tokenize-tiny-llama"
    artifact = tiny_dir / "tokenize-tiny-llama.kiln"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llama", "--out", ckpt])
    run([tool("kiln-compile"), ckpt, "-o", artifact, "--target=portable"])
    bad = subprocess.run([tool("kiln-run"), artifact, "--tokenize", "x", "--prompt", "y"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--tokenize takes no --prompt" in bad.stderr
    # --no-special belongs to --tokenize.
    bad = subprocess.run([tool("kiln-run"), artifact, "--prompt", "y", "--no-special"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--no-special requires --tokenize" in bad.stderr
