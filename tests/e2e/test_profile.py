"""kiln-run --profile: the time of every op (kiln_session_set_op_profiling), summed by
stage, op kind and kernel, as a table on stderr or as "op_profile" in --json's stats."""

import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import MODELS, run, tool


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    d = tmp_path_factory.mktemp("profile")
    run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", d / "ckpt"])
    run([tool("kiln-compile"), d / "ckpt", "-o", d / "model.kiln"])
    rng = np.random.default_rng(9)
    Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((64, 48)).save(d / "photo.png")
    return d / "model.kiln", d / "photo.png"


def test_profile_json_covers_every_stage(llava):
    model, photo = llava
    out = run([tool("kiln-run"), model, "--image", photo, "--prompt", "What is this?", "--max-new-tokens", "4",
               "--threads", "2", "--quiet", "--json", "--profile"]).stdout
    stats = json.loads(out)
    rows = stats["op_profile"]
    stages = {r["stage"] for r in rows}
    assert {"VisionEncoder", "Projector", "DecoderPrefill"} <= stages, stages
    if stats["decode_steps"] > 0:
        assert "DecoderDecode" in stages
    for r in rows:
        assert r["ops"] >= 1 and r["calls"] >= r["ops"] and r["ms"] >= 0 and r["kernel"], r
    # Largest first; a stage's ops take no longer than the stage.
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    vision = sum(r["ms"] for r in rows if r["stage"] == "VisionEncoder")
    assert vision <= stats["vision_encoder_ms"] + 1e-3, (vision, stats["vision_encoder_ms"])
    # Decode ops run once per decode step.
    for r in rows:
        if r["stage"] == "DecoderDecode":
            assert r["calls"] == r["ops"] * stats["decode_steps"], r


def test_profile_table_and_usage(llava, tmp_path):
    model, photo = llava
    p = run([tool("kiln-run"), model, "--image", photo, "--prompt", "What is this?", "--max-new-tokens", "2",
             "--quiet", "--profile"])
    assert "time per op kind and kernel" in p.stderr, p.stderr
    assert "VisionEncoder" in p.stderr and "share" in p.stderr
    # Without --profile: no table, no op_profile.
    p = run([tool("kiln-run"), model, "--prompt", "Hi", "--max-new-tokens", "2", "--quiet", "--json"])
    assert "op_profile" not in json.loads(p.stdout)
    batch = tmp_path / "q.jsonl"
    batch.write_text(json.dumps({"prompt": "Hi"}) + "\n")
    p = subprocess.run([tool("kiln-run"), model, "--batch", batch, "--profile"], capture_output=True, text=True)
    assert p.returncode == 2 and "--profile" in p.stderr, (p.returncode, p.stderr)
