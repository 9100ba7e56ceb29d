#!/usr/bin/env python3
"""Time to first token of follow-up questions about the same photo, with and without
prefix reuse (kiln_generate_options_t.reuse_prefix; kiln-run --no-prefix-reuse).

    bench/prefix_reuse.py --kiln M.kiln --image photo.png --reps 5 --threads 2 --json out.json
    bench/prefix_reuse.py --kiln M.kiln --image photo.png --other-image b.png ... --json return.json

With --other-image: a question about the photo, one about the other image, then
another about the photo again, a new conversation (kiln-run resets the session when
the image changes), with reuse, without, and with a paged cache (--kv-pool 8192),
whose published blocks the return finds; the "follow-up" figures are the return's.

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


def batch(artifact: str, path: str, threads: int, max_new: int, flags: list[str]) -> list[dict]:
    cmd = [os.path.join(BIN, "kiln-run"), artifact, "--batch", path, "--threads", str(threads),
           "--max-new-tokens", str(max_new), *flags]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kiln-run: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return [json.loads(l) for l in p.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--other-image", help="also time a return to --image after a question about this one")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    modes = {"reuse": [], "no_reuse": ["--no-prefix-reuse"]}
    lines = [{"id": str(i), "image": os.path.abspath(a.image), "prompt": q} for i, q in enumerate(QUESTIONS)]
    if a.other_image:
        # image, other image, image again (a new conversation: kiln-run resets the
        # session when the image changes): only a KV pool still has the first one.
        modes["pool"] = ["--kv-pool", "8192"]
        lines = [{"id": "first", "image": os.path.abspath(a.image), "prompt": QUESTIONS[0]},
                 {"id": "other", "image": os.path.abspath(a.other_image), "prompt": QUESTIONS[0]},
                 {"id": "return", "image": os.path.abspath(a.image), "prompt": QUESTIONS[1]}]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "questions.jsonl")
        with open(path, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        runs = {m: [] for m in modes}
        for _ in range(a.reps):
            for mode, flags in modes.items():
                runs[mode].append(batch(a.kiln, path, a.threads, a.max_new_tokens, flags))
    result = {"artifact": a.kiln, "image": a.image, "other_image": a.other_image, "threads": a.threads,
              "reps": a.reps, "questions": [l["prompt"] for l in lines], "load_average": os.getloadavg(), "modes": {}}
    for mode, reps in runs.items():
        later = [r[-1:] if a.other_image else r[1:] for r in reps]  # the lines after the first
        result["modes"][mode] = {
            "first_ttft_ms": statistics.median(r[0]["ttft_ms"] for r in reps),
            "followup_ttft_ms": statistics.median(statistics.median(l["ttft_ms"] for l in r) for r in later),
            "followup_vision_encoder_ms": statistics.median(l["vision_encoder_ms"] for r in later for l in r),
            "followup_prefill_ms": statistics.median(l["prefill_ms"] for r in later for l in r),
            "followup_prompt_tokens": statistics.median(l["prompt_tokens"] for r in later for l in r),
            "followup_reused_tokens": statistics.median(l["reused_tokens"] for r in later for l in r),
            "answers": [l["answer"] for l in reps[0]],
        }
    m = result["modes"]
    result["followup_ttft_ratio"] = m["no_reuse"]["followup_ttft_ms"] / max(m["reuse"]["followup_ttft_ms"], 1e-9)
    if "pool" in m:
        result["return_ttft_ratio_pool"] = m["no_reuse"]["followup_ttft_ms"] / max(m["pool"]["followup_ttft_ms"], 1e-9)
    text = json.dumps(result, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
