#!/usr/bin/env python3
"""Renders "shapes v2" pictures with questions: the bundled examples, the held-out
test set, or a calibration set.

    python3 tests/models/shapes_v2/make_examples.py --out tests/models/shapes_v2/test --count 500 \
        --list test.jsonl                                                     # the shipped test set
    python3 tests/models/shapes_v2/make_examples.py --out tests/models/shapes_v2/examples --count 9 \
        --one-per-kind --start 500                                            # the examples: past the test set
    python3 tests/models/shapes_v2/make_examples.py --out tests/models/shapes_v2/checkpoints/dense --count 32 \
        --split train --images calibration --list calibration.jsonl           # the bundled calibration set

Writes NNN.png and a question list, one {"id", "image", "prompt", "answer", "kind"}
per line (image paths relative to the list): the input kiln-run --batch reads and
the calibration input kiln-compile reads. Test questions come from the test split,
whose seeds training and calibration never use.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shapes import make_examples as v1  # noqa: E402
from shapes_v2 import model as sm  # noqa: E402
from shapes_v2 import task  # noqa: E402

if __name__ == "__main__":
    sys.exit(v1.main(task, task.QUESTION_KINDS, count=9, size=sm.EVAL_RENDER_SIZE, doc=__doc__))
