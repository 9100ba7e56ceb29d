"""The "shapes v2" training pipeline against Kiln: a checkpoint of each variant as
tests/models/shapes_v2/train.py writes it (one step from initialisation) compiles, and
Kiln's scores of the answers equal the PyTorch reference's on the prompts the training
builds: the LLaVA layouts with "USER: <image>x144\\n...", Idefics3 with its image
wrapped in <fake_token_around_image><global-img> ... <fake_token_around_image>; with
--visual-tokens, the rows the pruning-aware training keeps are the ones Kiln keeps, at
the positions it gives them (original or consecutive, train.py --original-positions).
The reference side is the training's own packed forward (one question per row)."""

import json
import os

import pytest
import torch

from conftest import MODELS, run, tool

from kiln_models.image_processing import load_image
from kiln_models.registry import load_checkpoint
from kiln_models.tokenizer import ByteLevelBPE
from shapes_v2 import model as sm
from shapes_v2 import task

TRAIN = os.path.join(MODELS, "shapes_v2", "train.py")
QUESTIONS = 4


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("shapes-v2-pipeline")
    lines = []
    for i in range(QUESTIONS):
        s = task.sample_at("test", i, task.QUESTION_KINDS[i * 2])
        task.render(s.scene, 256).save(d / f"{i}.png")
        lines.append(json.dumps({"id": str(i), "image": str(d / f"{i}.png"), "prompt": s.question,
                                 "answer": s.answer, "kind": s.kind}))
    (d / "q.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture(scope="module")
def checkpoint(work):
    made = {}

    def get(variant):
        if variant not in made:
            out = work / variant
            run(["/usr/bin/python3", TRAIN, "--variant", variant, "--out", out, "--steps", "1", "--batch-size", "2",
                 "--questions", "2", "--eval-every", "0", "--save-every", "0", "--eval-samples", "1", "--workers", "0"])
            made[variant] = out
        return made[variant]
    return get


def reference_scores(ckpt, qfile, keep, original_positions):
    model, config = load_checkpoint(str(ckpt))
    model.eval()
    tok = ByteLevelBPE.load(str(ckpt))
    pipe = sm.Pipeline(tok, sm.variant_of(config))
    out = {}
    with torch.no_grad():
        for q in map(json.loads, open(qfile)):
            # one question packed as training packs it
            ids, labels, positions, segments = pipe.pack([(q["prompt"], q["answer"], q["kind"])], keep)
            px = torch.from_numpy(pipe.pixels(load_image(q["image"])))[None]
            logits = sm.forward_packed(model, torch.tensor([ids]), px, torch.tensor([keep]),
                                       torch.tensor([positions]), torch.tensor([segments]),
                                       original_positions=original_positions)[0]
            lp = torch.log_softmax(logits.double(), -1)
            assert [t for t in labels if t != -100] == sm.answer_ids(tok, q["answer"])
            out[q["id"]] = sum(float(lp[t, a]) for t, a in enumerate(labels) if a != -100)
    return out


@pytest.mark.parametrize("variant,keep,positions", [
    ("dense", 144, None), ("moe", 144, None), ("idefics3", 144, None), ("dense", 72, "original"),
    ("moe", 100, "original"), ("idefics3", 36, "original"), ("dense", 72, "consecutive")])
def test_kiln_scores_the_training_prompts_as_the_reference(variant, keep, positions, work, checkpoint):
    ckpt = checkpoint(variant)
    artifact = work / f"{variant}-{keep}-{positions}.kiln"
    flags = [] if keep == sm.NUM_IMAGE_TOKENS else [f"--visual-tokens={keep}",
                                                    f"--visual-token-positions={positions}"]
    run([tool("kiln-compile"), ckpt, "-o", artifact, *flags])
    out = run([tool("kiln-run"), artifact, "--batch", work / "q.jsonl", "--score", "--answer-suffix", "</s>",
               "--threads", "2"]).stdout
    kiln = {s["id"]: s for s in map(json.loads, out.splitlines())}
    ref = reference_scores(ckpt, work / "q.jsonl", keep, positions == "original")
    assert set(kiln) == set(ref)
    for qid, r in ref.items():
        assert abs(kiln[qid]["logprob"] - r) < 1e-3 * max(1.0, abs(r)), (variant, keep, qid, kiln[qid], r)
