#!/usr/bin/env python3
"""Renders "shapes" pictures with questions: the bundled demo examples, or a fixed
evaluation set.

    python3 tests/models/shapes/make_examples.py --out tests/models/shapes/examples --count 6
    python3 tests/models/shapes/make_examples.py --out /tmp/eval --count 200 --split test
    python3 tests/models/shapes/make_examples.py --out CKPT --count 16 --split train \
        --size 128 --images calibration --list calibration.jsonl     # a calibration set

Writes NNN.png (256x256) and questions.jsonl, one {"id", "image", "prompt",
"answer", "kind"} per line — the input kiln-run --batch reads, and the calibration
input kiln-compile reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from shapes import task  # noqa: E402

# The bundled examples: one of each question kind, from the held-out test split.
EXAMPLE_KINDS = ["color_of_shape", "count_all", "position", "relation", "count_shape", "exists",
                 "shape_of_color", "count_color"]


def write_examples(task_module, out: str, count: int, split: str, start: int, size: int, images: str,
                   list_name: str, kinds=None) -> None:
    """Renders samples [start, start+count) of a split of task_module (a "shapes" task)
    and writes their question list; with `kinds`, sample i asks kinds[i % len(kinds)]."""
    os.makedirs(os.path.join(out, images), exist_ok=True)
    lines = []
    for i in range(count):
        kind = kinds[i % len(kinds)] if kinds else None
        s = task_module.sample_at(split, start + i, kind)
        name = os.path.join(images, f"{i:03d}.png") if images else f"{i:03d}.png"
        task_module.render(s.scene, size).save(os.path.join(out, name))
        lines.append({"id": str(i), "image": name, "prompt": s.question, "answer": s.answer, "kind": s.kind})
    with open(os.path.join(out, list_name), "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"wrote {len(lines)} pictures and {list_name} to {out}")


def main(task_module=task, kinds=EXAMPLE_KINDS, count: int = 8, size: int = 256, doc: str = __doc__) -> int:
    """The command line of a version of the task: its module, the kinds --one-per-kind
    cycles through, and the default count and picture size."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--split", default="test", choices=list(task_module.SPLITS))
    ap.add_argument("--start", type=int, default=0, help="first sample index of the split")
    ap.add_argument("--size", type=int, default=size, help="picture size in pixels")
    ap.add_argument("--one-per-kind", action="store_true", help="cycle through the question kinds")
    ap.add_argument("--images", default="", help="subdirectory of --out for the pictures")
    ap.add_argument("--list", default="questions.jsonl", help="file name of the question list in --out")
    args = ap.parse_args()
    write_examples(task_module, args.out, args.count, args.split, args.start, args.size, args.images, args.list,
                   kinds if args.one_per_kind else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
