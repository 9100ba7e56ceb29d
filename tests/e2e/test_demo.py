"""The bundled demo model through Kiln: compiled with kiln-compile and asked with
kiln-run --batch (image files decoded and preprocessed by the runtime), its
exact-match accuracy on a fixed set of held-out questions equals the PyTorch
reference's on the same image files, answer for answer."""

import json
import os

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


def reference_answers(ckpt, eval_dir):
    model, _ = load_checkpoint(ckpt)
    model.eval()
    tok = ByteLevelBPE.load(ckpt)
    pipe = sm.Pipeline(tok)
    out = {}
    with torch.no_grad():
        for line in open(os.path.join(eval_dir, "questions.jsonl")):
            q = json.loads(line)
            px = torch.from_numpy(pipe.pixels(load_image(os.path.join(eval_dir, q["image"]))))
            ids = sm.prompt_ids(tok, q["prompt"])
            out[q["id"]] = tok.decode(generate(model, px, ids, sm.SPECIALS["</s>"])).strip()
    return out


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_kiln_accuracy_equals_reference(variant, eval_set, tmp_path):
    ckpt = os.path.join(CHECKPOINTS, variant)
    artifact = tmp_path / f"{variant}.kiln"
    run([tool("kiln-compile"), ckpt, "-o", artifact])
    answers = run([tool("kiln-run"), artifact, "--batch", eval_set / "questions.jsonl", "--threads", "2"]).stdout
    kiln = {a["id"]: a["answer"].strip() for a in map(json.loads, answers.splitlines())}
    questions = [json.loads(l) for l in open(eval_set / "questions.jsonl")]
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
