"""The bundled demo model through Kiln: compiled with kiln-compile and asked with
kiln-run --batch (image files decoded and preprocessed by the runtime), its
exact-match accuracy on a fixed set of held-out questions equals the PyTorch
reference's on the same image files, answer for answer."""

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from conftest import MODELS, run, tool

from kiln_models.image_processing import load_image
from kiln_models.registry import load_checkpoint
from kiln_models.tokenizer import ByteLevelBPE
from shapes import model as sm
from shapes.evaluate import generate

CHECKPOINTS = os.path.join(MODELS, "shapes", "checkpoints")
FIXED_SET = 100


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("shapes-eval")
    run(["/usr/bin/python3", os.path.join(MODELS, "shapes", "make_examples.py"), "--out", d, "--count",
         str(FIXED_SET), "--split", "test", "--start", "1000"])
    return d


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Each demo variant compiled once (default options), by variant name."""
    d = tmp_path_factory.mktemp("shapes-artifacts")
    compiled = {}

    def get(variant):
        if variant not in compiled:
            compiled[variant] = d / f"{variant}.kiln"
            run([tool("kiln-compile"), os.path.join(CHECKPOINTS, variant), "-o", compiled[variant]])
        return compiled[variant]
    return get


def questions_of(eval_dir):
    return [json.loads(l) for l in open(os.path.join(eval_dir, "questions.jsonl"))]


def kiln_answers(artifact, eval_dir):
    """Generated answers by question id (kiln-run --batch, 2 threads)."""
    out = run([tool("kiln-run"), artifact, "--batch", os.path.join(eval_dir, "questions.jsonl"), "--threads",
               "2"]).stdout
    return {a["id"]: a["answer"].strip() for a in map(json.loads, out.splitlines())}


def reference(ckpt):
    """The PyTorch reference model, its tokenizer and its image pipeline."""
    model, _ = load_checkpoint(ckpt)
    model.eval()
    tok = ByteLevelBPE.load(ckpt)
    return model, tok, sm.Pipeline(tok)


def reference_pixels(pipe, eval_dir, q):
    return torch.from_numpy(pipe.pixels(load_image(os.path.join(eval_dir, q["image"]))))


def reference_answers(ckpt, eval_dir):
    model, tok, pipe = reference(ckpt)
    out = {}
    with torch.no_grad():
        for q in questions_of(eval_dir):
            ids = sm.prompt_ids(tok, q["prompt"])
            out[q["id"]] = tok.decode(generate(model, reference_pixels(pipe, eval_dir, q), ids,
                                               sm.SPECIALS["</s>"])).strip()
    return out


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_kiln_accuracy_equals_reference(variant, eval_set, artifacts):
    ckpt = os.path.join(CHECKPOINTS, variant)
    kiln = kiln_answers(artifacts(variant), eval_set)
    questions = questions_of(eval_set)
    ref = reference_answers(ckpt, eval_set)
    kiln_acc = sum(kiln[q["id"]] == q["answer"] for q in questions) / len(questions)
    ref_acc = sum(ref[q["id"]] == q["answer"] for q in questions) / len(questions)
    differing = [(q["prompt"], ref[q["id"]], kiln[q["id"]]) for q in questions if ref[q["id"]] != kiln[q["id"]]]
    assert kiln_acc == ref_acc, f"{variant}: Kiln {kiln_acc:.3f} vs reference {ref_acc:.3f}; differing: {differing[:5]}"
    assert not differing, f"{variant}: answers differ: {differing[:5]}"
    # The accuracy floor (>= 90%) is tests/models/test_shapes_demo.py's; on these 100
    # questions the MoE model scores 0.89 (0.902 on 500), so it is not repeated here. A model that
    # answers at chance would not be a meaningful comparison, though:
    assert ref_acc >= 0.75, f"{variant}: reference accuracy {ref_acc:.3f} on the fixed set"


def test_score_mode(eval_set, artifacts, tmp_path):
    """kiln-run --batch --score: a line's greedy_match is exactly whether generation
    answers it right, its log-probability is the PyTorch reference's, and the dumped
    logits hold one row per scored token."""
    artifact = artifacts("dense")
    questions = questions_of(eval_set)
    generated = kiln_answers(artifact, eval_set)
    logits = tmp_path / "scored.npy"
    scores = run([tool("kiln-run"), artifact, "--batch", eval_set / "questions.jsonl", "--score", "--answer-suffix",
                  "</s>", "--dump-logits", logits, "--threads", "2"]).stdout
    scored = {s["id"]: s for s in map(json.loads, scores.splitlines())}
    assert len(scored) == len(questions)
    mismatched = [q["id"] for q in questions if scored[q["id"]]["greedy_match"] != (generated[q["id"]] == q["answer"])]
    assert not mismatched, f"greedy_match disagrees with generation for {mismatched[:5]}"
    assert any(not s["greedy_match"] for s in scored.values()) and any(s["greedy_match"] for s in scored.values())

    rows = np.load(logits)
    assert rows.shape[0] == sum(s["answer_tokens"] for s in scored.values())

    model, tok, pipe = reference(os.path.join(CHECKPOINTS, "dense"))
    with torch.no_grad():
        for q in questions[:12]:
            px = reference_pixels(pipe, eval_set, q)
            prompt = sm.prompt_ids(tok, q["prompt"])
            answer = sm.answer_ids(tok, q["answer"])
            assert scored[q["id"]]["answer_tokens"] == len(answer)
            lp = torch.log_softmax(model(torch.tensor([prompt + answer]), pixel_values=px[None])[0].double(), -1)
            ref = sum(float(lp[len(prompt) - 1 + t, a]) for t, a in enumerate(answer))
            assert abs(scored[q["id"]]["logprob"] - ref) < 1e-3 * max(1.0, abs(ref)), (q, scored[q["id"]], ref)


def test_score_mode_errors(artifacts, tmp_path):
    artifact = artifacts("dense")
    no_answer = tmp_path / "q.jsonl"
    no_answer.write_text(json.dumps({"id": "a", "prompt": "What colour is the circle?"}) + "\n")
    out = tmp_path / "l.npy"
    p = subprocess.run([tool("kiln-run"), artifact, "--batch", no_answer, "--score", "--dump-logits", out],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "q.jsonl:1: --score needs an \"answer\"" in p.stderr, p.stderr
    assert not out.exists()
    p = subprocess.run([tool("kiln-run"), artifact, "--prompt", "hi", "--score"], capture_output=True, text=True)
    assert p.returncode == 2 and "--score needs --batch" in p.stderr
    p = subprocess.run([tool("kiln-run"), artifact, "--batch", no_answer, "--answer-suffix", "</s>"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "--answer-suffix requires --score" in p.stderr + p.stdout
