#!/usr/bin/env python3
"""Exact-match accuracy of a "shapes" checkpoint on a split of the task, with the
PyTorch reference (fp32 arithmetic on the stored weights).

    python3 tests/models/shapes/evaluate.py tests/models/shapes/checkpoints/dense [--split test] [-n 500]

A prediction is the greedy continuation of the prompt up to </s>, decoded and
stripped; it must equal the answer string exactly. Images are rendered at 256x256
(as the bundled examples) and go through the checkpoint's image processor.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from shapes import model as sm  # noqa: E402
from shapes import task  # noqa: E402

EVAL_RENDER_SIZE = 256


def generate(model, px: torch.Tensor, prompt: List[int], eos: int, max_new_tokens: int = 8) -> List[int]:
    """Greedy decoding; recomputes the whole sequence each step (no KV cache)."""
    ids = list(prompt)
    out: List[int] = []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids]), pixel_values=px[None])
        nxt = int(torch.argmax(logits[0, -1]))
        if nxt == eos:
            break
        out.append(nxt)
        ids.append(nxt)
    return out


def accuracy(model, tok, pipe, split: str, n: int, render_size: int = EVAL_RENDER_SIZE,
             records: list = None) -> Tuple[float, Dict[str, Tuple[int, int]]]:
    eos = sm.SPECIALS["</s>"]
    per_kind: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
    correct = 0
    for i in range(n):
        px, prompt, _, s = pipe.example(split, i, render_size)
        pred = tok.decode(generate(model, torch.from_numpy(px), prompt, eos)).strip()
        ok = pred == s.answer
        correct += ok
        per_kind[s.kind][0] += ok
        per_kind[s.kind][1] += 1
        if records is not None:
            records.append({"index": i, "question": s.question, "answer": s.answer, "prediction": pred})
    return correct / n, {k: tuple(v) for k, v in per_kind.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--split", default="test", choices=list(task.SPLITS))
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write per-sample predictions here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from kiln_models.registry import load_checkpoint
    from kiln_models.tokenizer import ByteLevelBPE

    model, _ = load_checkpoint(args.checkpoint)
    model.eval()
    tok = ByteLevelBPE.load(args.checkpoint)
    pipe = sm.Pipeline(tok)
    records: list = []
    with torch.no_grad():
        acc, per_kind = accuracy(model, tok, pipe, args.split, args.n, records=records)
    print(f"{args.checkpoint}: exact-match {acc * 100:.1f}% on {args.n} {args.split} samples")
    for k, (c, n) in sorted(per_kind.items()):
        print(f"  {k:16s} {c:4d}/{n:<4d} {100 * c / n:5.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"accuracy": acc, "samples": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
