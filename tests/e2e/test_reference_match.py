"""Kiln's logits and greedy tokens equal the PyTorch reference's, for every supported
architecture (tiny generated checkpoints, fp32):

    max |kiln - torch| <= 1e-4 * max |torch logits|   over every prompt position
    greedy continuation identical
"""

import os

import numpy as np
import pytest
from PIL import Image

from conftest import MODELS, run, tool

PRESETS = [
    ("tiny-llama", False),
    ("tiny-llama-tied", False),
    ("tiny-qwen2", False),
    ("tiny-mixtral", False),
    ("tiny-llava", True),
    ("tiny-llava-qwen2", True),
    ("tiny-idefics3", True),
]
MAX_NEW_TOKENS = 12


def _image(path):
    rng = np.random.default_rng(7)
    # A non-square photo-like image: the processor must resize and crop it.
    base = rng.integers(0, 255, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(base).resize((90, 67), Image.BILINEAR).save(path)


@pytest.mark.parametrize("preset,vlm", PRESETS, ids=[p for p, _ in PRESETS])
def test_logits_and_greedy_match_reference(preset, vlm, tiny_dir):
    ckpt = tiny_dir / preset
    artifact = tiny_dir / f"{preset}.kiln"
    golden = tiny_dir / f"{preset}-golden"
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", ckpt])
    run([tool("kiln-compile"), ckpt, "-o", artifact, "--kv-cache=f32"])
    args = ["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ckpt, "--out", golden,
            "--prompt", "How do I install this part? Tell me step by step.",
            "--max-new-tokens", str(MAX_NEW_TOKENS)]
    if vlm:
        _image(tiny_dir / "photo.png")
        args += ["--image", tiny_dir / "photo.png"]
    run(args)

    kiln_logits = tiny_dir / f"{preset}-kiln-logits.npy"
    cmd = [tool("kiln-run"), artifact, "--input-ids", golden / "input_ids.npy", "--dump-logits", kiln_logits,
           "--max-new-tokens", str(MAX_NEW_TOKENS), "--threads", "2"]
    if vlm:
        px = np.load(golden / "pixel_values.npy").astype(np.float32)
        np.save(tiny_dir / f"{preset}-px.npy", px.reshape(px.shape[-3:]))
        cmd += ["--pixel-values", tiny_dir / f"{preset}-px.npy"]
    out = run(cmd + ["--quiet", "--json"]).stdout

    ref = np.load(golden / "logits.npy")
    got = np.load(kiln_logits)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    assert err <= 1e-4 * scale, f"{preset}: max abs error {err} > 1e-4 * {scale}"

    # Greedy tokens: without --quiet kiln-run prints the answer, then "tokens: ...".
    tokens = run(cmd).stdout
    line = [l for l in tokens.splitlines() if l.startswith("tokens:")][-1]
    got_ids = [int(t) for t in line.split()[1:]]
    ref_ids = [int(t) for t in np.load(golden / "greedy.npy").reshape(-1)]
    assert got_ids == ref_ids, f"{preset}: greedy {got_ids} != reference {ref_ids}"
    assert '"ttft_ms"' in out
