"""The bundled "shapes v2" demo model (tests/models/shapes_v2: 144 image tokens, a
sign to read, counts to nine, a 3x3 grid of positions) through Kiln, on its shipped
held-out test set (tests/models/test_shapes_v2.py checks the set itself): Kiln answers
as the PyTorch reference does, and the accuracy, per question kind too, and that of
the artifact with half its image tokens pruned stay above floors a few points under
the measurements in tests/models/README.md and docs/pruning.md."""

import json
import os
import subprocess

import pytest
import torch

from conftest import MODELS, run, tool

from kiln_models.image_processing import load_image
from kiln_models.registry import load_checkpoint
from kiln_models.tokenizer import ByteLevelBPE
from shapes.evaluate import generate
from shapes_v2 import model as sm
from shapes_v2 import task

DEMO = os.path.join(MODELS, "shapes_v2")
CHECKPOINTS = os.path.join(DEMO, "checkpoints")
TEST_SET = os.path.join(DEMO, "test", "test.jsonl")
VARIANTS = sorted(os.listdir(CHECKPOINTS))


def load_test_set():
    return [json.loads(l) for l in open(TEST_SET)]


def kiln_answers(artifact, qfile):
    out = run([tool("kiln-run"), artifact, "--batch", qfile, "--threads", "2"]).stdout
    return {a["id"]: a["answer"].strip() for a in map(json.loads, out.splitlines())}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Artifacts by (variant, kiln-compile flags), each compiled once."""
    d = tmp_path_factory.mktemp("shapes-v2")
    compiled = {}

    def get(variant, *flags):
        key = (variant,) + flags
        if key not in compiled:
            compiled[key] = d / f"{variant}-{len(compiled)}.kiln"
            run([tool("kiln-compile"), os.path.join(CHECKPOINTS, variant), "-o", compiled[key], *flags])
        return compiled[key]
    return get


@pytest.fixture(scope="module")
def answers(artifacts, tmp_path_factory):
    """Kiln's answers to the whole test set by id, per (variant, kiln-compile flags),
    each artifact run once; the question list is written with absolute image paths."""
    qfile = tmp_path_factory.mktemp("shapes-v2-test") / "test.jsonl"
    with open(qfile, "w") as f:
        for q in load_test_set():
            f.write(json.dumps(dict(q, image=os.path.join(os.path.dirname(TEST_SET), q["image"]))) + "\n")
    cache = {}

    def get(variant, *flags):
        key = (variant,) + flags
        if key not in cache:
            cache[key] = kiln_answers(artifacts(variant, *flags), qfile)
        return cache[key]
    return get


def accuracy(kiln, qs):
    return sum(kiln[q["id"]] == q["answer"] for q in qs) / len(qs)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kiln_answers_as_the_reference_does(variant, answers):
    """The first 60 test questions."""
    ckpt = os.path.join(CHECKPOINTS, variant)
    kiln = answers(variant)
    model, config = load_checkpoint(ckpt)
    model.eval()
    tok = ByteLevelBPE.load(ckpt)
    pipe = sm.Pipeline(tok, sm.variant_of(config))
    differing = []
    with torch.no_grad():
        for q in load_test_set()[:60]:
            px = torch.from_numpy(pipe.pixels(load_image(os.path.join(os.path.dirname(TEST_SET), q["image"]))))
            ref = tok.decode(generate(model, px, pipe.prompt_ids(q["prompt"]), sm.SPECIALS["</s>"])).strip()
            if ref != kiln[q["id"]]:
                differing.append((q["prompt"], ref, kiln[q["id"]]))
    assert not differing, f"{variant}: answers differ: {differing[:5]}"


# Floors a few points under the accuracies measured (500 questions, tests/models/README.md).
ACCURACY_FLOOR = {"dense": 0.90, "moe": 0.90, "idefics3": 0.85}
# Per question kind; the relations are barely learned (56% dense, 74% moe, 66% idefics3
# measured, chance 50%): their floor is chance. The idefics3 variant (2,000 steps from
# the dense decoder, its encoder from scratch) counts by shape at 58% (chance about 10%)
# and answers the other kinds at 87-100%.
# Per variant: the floor of every kind, then the kinds with floors of their own.
KIND_FLOOR_DEFAULT = {"dense": 0.85, "moe": 0.85, "idefics3": 0.80}
KIND_FLOOR = {"dense": {"relation": 0.5}, "moe": {"relation": 0.5},
              "idefics3": {"relation": 0.5, "count_shape": 0.45}}


@pytest.mark.parametrize("variant", VARIANTS)
def test_accuracy_on_the_test_set(variant, answers):
    qs = load_test_set()
    kiln = answers(variant)
    acc = accuracy(kiln, qs)
    assert acc >= ACCURACY_FLOOR[variant], f"{variant}: {acc:.3f} on {len(qs)} test questions"
    low = {}
    for kind in task.QUESTION_KINDS:
        k_acc = accuracy(kiln, [q for q in qs if q["kind"] == kind])
        if k_acc < KIND_FLOOR[variant].get(kind, KIND_FLOOR_DEFAULT[variant]):
            low[kind] = round(k_acc, 3)
    assert not low, f"{variant}: question kinds under their floor: {low}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_half_the_visual_tokens(variant, artifacts, answers):
    """--visual-tokens=50%: the artifact keeps 72 of the 144 image tokens it scores, at
    their original positions (the default), and its accuracy stays within
    HALF_TOKENS_MAX_LOSS of the whole model's."""
    info = json.loads(run([tool("kiln-inspect"), artifacts(variant, "--visual-tokens=50%"), "--json"]).stdout)
    assert (info["image"]["image_tokens"], info["image"]["image_tokens_scored"]) == (
        sm.NUM_IMAGE_TOKENS // 2, sm.NUM_IMAGE_TOKENS), info["image"]
    assert info["image"]["visual_token_positions"] == "original", info["image"]
    qs = load_test_set()
    acc = {"whole": accuracy(answers(variant), qs), "half": accuracy(answers(variant, "--visual-tokens=50%"), qs)}
    assert acc["half"] >= acc["whole"] - HALF_TOKENS_MAX_LOSS, (variant, acc)


# The bound (docs/pruning.md measures 0.2 points gained, dense: 94.8% to 95.0%).
# Both variants were trained with pruned pictures at original positions; at
# consecutive ones the dense model loses 20 points.
HALF_TOKENS_MAX_LOSS = 0.02


def test_the_test_set_is_refused_when_damaged(artifacts, tmp_path):
    bad = tmp_path / "bad.jsonl"
    q = load_test_set()[0]
    bad.write_text(json.dumps(dict(q, image="missing.png")) + "\n")
    p = subprocess.run([tool("kiln-run"), artifacts("dense"), "--batch", bad], capture_output=True, text=True)
    assert p.returncode != 0 and "missing.png" in p.stderr, p.stderr


def test_a_quarter_of_the_experts_merged(artifacts, answers, tmp_path):
    """--prune-experts=25% --prune-experts-merge on the MoE variant: the 2 experts of
    each layer with the least routing mass go into their most similar kept expert (the
    upcycled experts' partners: cosine about 0.995) or, where both of a pair go, are
    removed; the artifact shrinks as much as by removing them, and the accuracy stays
    within MERGED_MAX_LOSS of the whole model's, at least that of removing the same
    experts less MERGED_SLACK."""
    report = tmp_path / "merged.json"
    merged = artifacts("moe", "--prune-experts=25%", "--prune-experts-merge", "--report", str(report))
    layers = json.load(open(report))["pruned_experts"]
    assert len(layers) == 4
    for layer in layers:
        assert layer["kept"] == 6 and len(layer["pruned"]) == 2, layer
        gone = {e["expert"] for e in layer["pruned"]}
        for e in layer["pruned"]:
            # Experts e and e + 4 started as copies (train.py --upcycle).
            partner = (e["expert"] + 4) % 8
            assert e["merged_into"] == (None if partner in gone else partner), layer
    removed = artifacts("moe", "--prune-experts=25%")
    whole = artifacts("moe")
    removed_bytes = os.path.getsize(whole) - os.path.getsize(removed)
    assert os.path.getsize(whole) - os.path.getsize(merged) >= 0.99 * removed_bytes
    qs = load_test_set()
    acc = {flags: accuracy(answers("moe", *flags), qs)
           for flags in [(), ("--prune-experts=25%",), ("--prune-experts=25%", "--prune-experts-merge", "--report",
                                                           str(report))]}
    whole_acc, removed_acc, merged_acc = acc.values()
    assert merged_acc >= whole_acc - MERGED_MAX_LOSS, acc
    assert merged_acc >= removed_acc - MERGED_SLACK, acc


# Measured (docs/pruning.md, 500 questions, stage moe1): whole 96.8%, a quarter removed
# 95.8%, merged 96.6% (6 merged, 2 removed: layer 0 chose both of a pair).
MERGED_MAX_LOSS = 0.01
MERGED_SLACK = 0.0
