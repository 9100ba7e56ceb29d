"""Several questions about one photo (kiln-run --batch): the second and later ones
reuse the encoded image and the cached prefix of the prompt (kiln_generate_options_t.
reuse_prefix), prefill only their new tokens, and answer exactly as the PyTorch
reference does; every output line carries the per-stage timings of --json."""

import json
import os
import subprocess

import torch

from conftest import MODELS, run, tool

from shapes import model as sm
from shapes.evaluate import generate
from test_demo import reference, reference_pixels

CHECKPOINT = os.path.join(MODELS, "shapes", "checkpoints", "dense")
IMAGES = 6
PER_IMAGE = 3


def batch_lines(eval_dir):
    """Each image asked PER_IMAGE questions in a row: its own and the next ones'."""
    qs = [json.loads(l) for l in open(os.path.join(eval_dir, "questions.jsonl"))]
    lines = []
    for i in range(IMAGES):
        for j in range(PER_IMAGE):
            lines.append({"id": f"{i}.{j}", "image": qs[i]["image"], "prompt": qs[(i + j) % len(qs)]["prompt"]})
    lines.append({"id": "text", "prompt": qs[0]["prompt"]})  # no image: the image is forgotten
    lines.append({"id": "again", "image": qs[0]["image"], "prompt": qs[1]["prompt"]})
    return lines


def kiln_batch(artifact, path, *flags):
    out = run([tool("kiln-run"), artifact, "--batch", path, "--threads", "2", *flags]).stdout
    return [json.loads(l) for l in out.splitlines()]


def test_followups_reuse_the_image_and_prefix(tmp_path):
    eval_dir = tmp_path / "eval"
    run(["/usr/bin/python3", os.path.join(MODELS, "shapes", "make_examples.py"), "--out", eval_dir, "--count",
         str(IMAGES + PER_IMAGE), "--split", "test", "--start", "2000"])
    lines = batch_lines(eval_dir)
    batch = eval_dir / "followups.jsonl"
    batch.write_text("".join(json.dumps(l) + "\n" for l in lines))
    artifact = tmp_path / "dense.kiln"
    run([tool("kiln-compile"), CHECKPOINT, "-o", artifact])

    reused = kiln_batch(artifact, batch)
    whole = kiln_batch(artifact, batch, "--no-prefix-reuse")
    assert [a["id"] for a in reused] == [l["id"] for l in lines]

    model, tok, pipe = reference(CHECKPOINT)
    with torch.no_grad():
        for line, a, b in zip(lines, reused, whole):
            expected = None
            if "image" in line:
                ids = sm.prompt_ids(tok, line["prompt"])
                expected = tok.decode(generate(model, reference_pixels(pipe, eval_dir, line), ids,
                                               sm.SPECIALS["</s>"]))
                assert a["answer"].strip() == expected.strip(), line
            assert a["answer"] == b["answer"], line
            # The same per-stage timings as --json on every line.
            for key in ("image_preprocess_ms", "vision_encoder_ms", "projector_ms", "prefill_ms", "first_token_ms",
                        "ttft_ms", "prompt_tokens", "reused_tokens", "image_tokens", "decode_ms", "kv_cache"):
                assert key in a and key in b, key
            stages = sum(a[k] for k in ("image_preprocess_ms", "vision_encoder_ms", "projector_ms", "prefill_ms",
                                        "first_token_ms"))
            assert abs(stages - a["ttft_ms"]) <= 0.05 + 0.02 * a["ttft_ms"], a
            assert b["reused_tokens"] == 0
            follow_up = line["id"].split(".")[-1] not in ("0", "text", "again")
            if follow_up:
                # Everything up to where the questions differ came from the cache; the
                # image was neither preprocessed nor encoded again.
                assert a["image_preprocess_ms"] == 0 and a["vision_encoder_ms"] == 0 and a["projector_ms"] == 0, a
                assert a["reused_tokens"] > a["image_tokens"] > 0, a
                assert a["reused_tokens"] < a["prompt_tokens"], a
                assert b["vision_encoder_ms"] > 0, b
            else:
                assert a["reused_tokens"] == 0, a
                if "image" in line:
                    assert a["vision_encoder_ms"] > 0, a


def test_paged_cache(tmp_path):
    """kiln-run --kv-pool: the same answers as the session's own cache, at least as much
    reuse; a pool too small for the conversation is an error naming the pool, not a crash;
    kiln-inspect --kv-pool shows the pool in the memory report."""
    eval_dir = tmp_path / "eval"
    run(["/usr/bin/python3", os.path.join(MODELS, "shapes", "make_examples.py"), "--out", eval_dir, "--count",
         str(IMAGES + PER_IMAGE), "--split", "test", "--start", "3000"])
    batch = eval_dir / "followups.jsonl"
    batch.write_text("".join(json.dumps(l) + "\n" for l in batch_lines(eval_dir)))
    artifact = tmp_path / "dense.kiln"
    run([tool("kiln-compile"), CHECKPOINT, "-o", artifact])
    whole = kiln_batch(artifact, batch)
    paged = kiln_batch(artifact, batch, "--kv-pool", "256", "--kv-block", "8")
    assert [a["answer"] for a in paged] == [a["answer"] for a in whole]
    # The pool may also hold blocks of earlier lines about the same image (the "again" line).
    assert all(p["reused_tokens"] >= w["reused_tokens"] for p, w in zip(paged, whole))
    for a in paged:
        assert a["kv_block_tokens"] == 8 and a["kv_pool_blocks"] == 32, a
        assert a["kv_blocks"] * 8 >= a["prompt_tokens"], a
    # A pool large enough to keep every block: the return to the first image (a new
    # conversation after other images) finds the blocks of the line that asked the same.
    kept = kiln_batch(artifact, batch, "--kv-pool", "4096", "--kv-block", "8")
    assert [a["answer"] for a in kept] == [a["answer"] for a in whole]
    again = kept[-1]
    assert again["id"] == "again" and whole[-1]["reused_tokens"] == 0
    assert again["reused_tokens"] == again["prompt_tokens"] - 1, again
    assert again["vision_encoder_ms"] == 0, again
    # 16 positions cannot hold a prompt of 30.
    p = subprocess.run([tool("kiln-run"), artifact, "--batch", batch, "--kv-pool", "16", "--kv-block", "8"],
                       capture_output=True, text=True)
    assert p.returncode == 1, p
    assert "KV block pool is full" in p.stderr and "2 blocks of 8 tokens" in p.stderr, p.stderr
    out = run([tool("kiln-inspect"), artifact, "--kv-pool", "4096", "--kv-block", "64", "--json"]).stdout
    mem = json.loads(out)["memory"]
    assert mem["kv_block_tokens"] == 64 and mem["kv_pool_blocks"] == 64, mem
    assert mem["kv_cache_bytes"] == mem["kv_pool_bytes"] > 0
    assert mem["total_bytes"] == (mem["weight_bytes"] + mem["code_bytes"] + mem["model_bytes"] + mem["session_bytes"]
                                  + mem["kv_pool_bytes"])
    assert "KV pool" in run([tool("kiln-inspect"), artifact, "--kv-pool", "4096"]).stdout
