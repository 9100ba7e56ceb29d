#!/usr/bin/env python3
"""An experiment with the PyTorch reference: visual-token pruning as Kiln does it (the
`distinct` score keeps K of the 144 projected image tokens, in their order) with the kept
tokens at consecutive positions (kiln-compile --visual-token-positions=consecutive)
against each kept token at its original RoPE position and the text after the image at
the positions it has unpruned (=original, the default). Greedy answers on the shipped
test set, exact match per question kind.

    /usr/bin/python3 tests/models/shapes_v2/pruning_positions.py tests/models/shapes_v2/checkpoints/dense 72
"""

import collections
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kiln_models.image_processing import load_image  # noqa: E402
from kiln_models.registry import load_checkpoint  # noqa: E402
from kiln_models.tokenizer import ByteLevelBPE  # noqa: E402
from shapes_v2 import model as sm  # noqa: E402

TEST_SET = os.path.join(HERE, "test", "test.jsonl")


def answer(model, tok, features, kept, prompt, original_positions, max_new_tokens=6):
    lm = model.language_model
    image_id = model.image_token_index
    ids = sm.prompt_ids(tok, prompt, len(kept))
    first = ids.index(image_id)
    removed = features.shape[0] - len(kept)
    out = []
    for _ in range(max_new_tokens):
        t = torch.tensor([ids])
        mask = t == image_id
        embeds = lm.model.embed(torch.where(mask, torch.zeros_like(t), t) if image_id >= lm.cfg.vocab_size else t)
        embeds[mask] = features[kept].to(embeds.dtype)
        positions = list(range(len(ids)))
        if original_positions:
            positions = [i if i < first else first + kept[i - first] if i < first + len(kept) else i + removed
                         for i in range(len(ids))]
        logits = lm.logits(lm.model(inputs_embeds=embeds, position_ids=torch.tensor([positions])))
        nxt = int(torch.argmax(logits[0, -1]))
        if nxt == sm.SPECIALS["</s>"]:
            break
        out.append(nxt)
        ids.append(nxt)
    return tok.decode(out).strip()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ckpt, keep = sys.argv[1], int(sys.argv[2])
    model, _ = load_checkpoint(ckpt)
    model.eval()
    tok = ByteLevelBPE.load(ckpt)
    pipe = sm.Pipeline(tok)
    right = {False: collections.Counter(), True: collections.Counter()}
    asked = collections.Counter()
    with torch.no_grad():
        for q in map(json.loads, open(TEST_SET)):
            px = torch.from_numpy(pipe.pixels(load_image(os.path.join(HERE, "test", q["image"]))))
            features = model.get_image_features(px[None])[0]
            kept = sm.kept_rows(features, keep)
            asked[q["kind"]] += 1
            for original in right:
                right[original][q["kind"]] += answer(model, tok, features, kept, q["prompt"], original) == q["answer"]
    for original, c in right.items():
        label = "original positions" if original else "consecutive positions"
        print(f"{label}: {sum(c.values())}/{sum(asked.values())} "
              + " ".join(f"{k} {c[k]}/{asked[k]}" for k in sorted(asked)))


if __name__ == "__main__":
    main()
