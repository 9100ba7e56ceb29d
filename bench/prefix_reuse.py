#!/usr/bin/env python3
"""Time to first token of follow-up questions about the same photo, with and without
prefix reuse (kiln_generate_options_t.reuse_prefix; kiln-run --no-prefix-reuse).

    bench/prefix_reuse.py --kiln M.kiln --image photo.png --reps 5 --threads 2 --json out.json

One kiln-run --batch per repetition asks the questions below about the image in a
row; with reuse the first question is a cold start and the others reuse the encoded
image and the cached prompt prefix, without it every question starts over. The two
modes alternate run by run. Reported per mode: medians over repetitions of the first
question's TTFT and of the follow-ups' TTFT (each repetition's median over its
follow-ups), the prefill tokens of a follow-up, and the load average. Never
pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin"))
QUESTIONS = [
    "What is shown in this picture? Describe it.",
    "How do I install this part?",
    "What colour is it?",
    "Which tool do I need?",
    "Is anything missing?",
]


def batch(artifact: str, path: str, threads: int, max_new: int, reuse: bool) -> list[dict]:
    cmd = [os.path.join(BIN, "kiln-run"), artifact, "--batch", path, "--threads", str(threads),
           "--max-new-tokens", str(max_new)]
    if not reuse:
        cmd.append("--no-prefix-reuse")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kiln-run: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return [json.loads(l) for l in p.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "questions.jsonl")
        with open(path, "w") as f:
            for i, q in enumerate(QUESTIONS):
                f.write(json.dumps({"id": str(i), "image": os.path.abspath(a.image), "prompt": q}) + "\n")
        runs = {"reuse": [], "no_reuse": []}
        for _ in range(a.reps):
            for mode in runs:
                runs[mode].append(batch(a.kiln, path, a.threads, a.max_new_tokens, mode == "reuse"))
    result = {"artifact": a.kiln, "image": a.image, "threads": a.threads, "reps": a.reps,
              "questions": QUESTIONS, "load_average": os.getloadavg(), "modes": {}}
    for mode, reps in runs.items():
        first = [r[0]["ttft_ms"] for r in reps]
        follow = [statistics.median(l["ttft_ms"] for l in r[1:]) for r in reps]
        result["modes"][mode] = {
            "first_ttft_ms": statistics.median(first),
            "followup_ttft_ms": statistics.median(follow),
            "followup_vision_encoder_ms": statistics.median(l["vision_encoder_ms"] for r in reps for l in r[1:]),
            "followup_prefill_ms": statistics.median(l["prefill_ms"] for r in reps for l in r[1:]),
            "followup_prompt_tokens": statistics.median(l["prompt_tokens"] for r in reps for l in r[1:]),
            "followup_reused_tokens": statistics.median(l["reused_tokens"] for r in reps for l in r[1:]),
            "answers": [l["answer"] for l in reps[0]],
        }
    m = result["modes"]
    result["followup_ttft_ratio"] = m["no_reuse"]["followup_ttft_ms"] / max(m["reuse"]["followup_ttft_ms"], 1e-9)
    text = json.dumps(result, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
