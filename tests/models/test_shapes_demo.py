"""The bundled demo model ("shapes"): its tokenizer and configs are what the scripts
build, and its exact-match accuracy, re-measured with the PyTorch reference on a
small fixed set of held-out questions, stays at or above 90%."""

import os

import pytest
import torch

from kiln_models.registry import load_checkpoint
from kiln_models.tokenizer import ByteLevelBPE
from shapes import model as sm
from shapes import task
from shapes.evaluate import accuracy

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKPOINTS = os.path.join(HERE, "shapes", "checkpoints")
FIXED_SET = 150  # test-split samples 0..149


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_demo_accuracy_at_least_90_percent(variant):
    ckpt = os.path.join(CHECKPOINTS, variant)
    model, config = load_checkpoint(ckpt)
    model.eval()
    tok = ByteLevelBPE.load(ckpt)
    with torch.no_grad():
        acc, per_kind = accuracy(model, tok, sm.Pipeline(tok), "test", FIXED_SET)
    assert acc >= 0.90, f"{variant}: exact-match {acc:.3f} on {FIXED_SET} test questions; per kind {per_kind}"


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_checkpoint_matches_the_training_scripts(variant):
    """The committed tokenizer and config are the ones shapes/model.py builds."""
    ckpt = os.path.join(CHECKPOINTS, variant)
    tok = ByteLevelBPE.load(ckpt)
    built = sm.build_tokenizer()
    assert tok.vocab == built.vocab and tok.merges == built.merges and tok.added_tokens == built.added_tokens
    _, config = load_checkpoint(ckpt)
    expected = sm.model_config(built, variant)
    for key in ("vision_feature_layer", "image_token_index"):
        assert config[key] == expected[key]
    assert config["text_config"]["model_type"] == ("mixtral" if variant == "moe" else "llama")


def test_splits_are_disjoint():
    """No held-out question appears in the training stream (same picture and question)."""
    train = {(s.scene, s.question) for s in (task.sample_at("train", i) for i in range(3000))}
    test = [task.sample_at("test", i) for i in range(FIXED_SET)]
    assert not [s for s in test if (s.scene, s.question) in train]
