#!/usr/bin/env python3
"""Renders "shapes v2" pictures with questions: the bundled examples, the held-out
test set, or a calibration set.

    python3 tests/models/shapes_v2/make_examples.py --out tests/models/shapes_v2/examples --count 9 --one-per-kind
    python3 tests/models/shapes_v2/make_examples.py --out tests/models/shapes_v2/test --count 500 \
        --list test.jsonl                                                     # the shipped test set
    python3 tests/models/shapes_v2/make_examples.py --out CKPT --count 64 --split train \
        --images calibration --list calibration.jsonl                         # a calibration set

Writes NNN.png and a question list, one {"id", "image", "prompt", "answer", "kind"}
per line (image paths relative to the list): the input kiln-run --batch reads and
the calibration input kiln-compile reads. Test questions come from the test split,
whose seeds training and calibration never use.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shapes.make_examples import write_examples  # noqa: E402
from shapes_v2 import model as sm  # noqa: E402
from shapes_v2 import task  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=9)
    ap.add_argument("--split", default="test", choices=list(task.SPLITS))
    ap.add_argument("--start", type=int, default=0, help="first sample index of the split")
    ap.add_argument("--size", type=int, default=sm.EVAL_RENDER_SIZE, help="picture size in pixels")
    ap.add_argument("--one-per-kind", action="store_true", help="cycle through the question kinds")
    ap.add_argument("--images", default="", help="subdirectory of --out for the pictures")
    ap.add_argument("--list", default="questions.jsonl", help="file name of the question list in --out")
    args = ap.parse_args()
    write_examples(task, args.out, args.count, args.split, args.start, args.size, args.images, args.list,
                   task.QUESTION_KINDS if args.one_per_kind else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
