#!/usr/bin/env python3
"""Measures what compile-time pruning costs and buys on the demo model, through Kiln
(kiln-compile + kiln-run + kiln-bench), on held-out test questions:

  * experts (--experts): the MoE demo model with 0, 1, 2 (25%) and 4 (50%) of its 8
    experts per layer pruned, and --prune-experts=auto: exact-match accuracy (per
    question kind too), artifact and weight bytes, and kiln-bench's prefill, TTFT,
    decode and peak RSS (medians, --threads, --reps);
  * visual tokens (--visual-tokens): the dense and MoE demo models with 100, 75, 50
    and 25% of the image tokens kept: accuracy, TTFT by stage and LLM prefill.

Writes JSON (and prints Markdown tables). Needs a host build (build/host/bin).

    /usr/bin/python3 scripts/eval_pruning.py --out build/eval-pruning.json [--questions 500] [--threads 2]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SHAPES = os.path.join(ROOT, "tests", "models", "shapes")
BIN = os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin"))
PY = "/usr/bin/python3"


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{p.stderr}")
    return p


def accuracy(artifact, qfile, threads):
    questions = {q["id"]: q for q in map(json.loads, open(qfile))}
    out = run([f"{BIN}/kiln-run", artifact, "--batch", qfile, "--threads", str(threads)]).stdout
    right, kinds, kinds_right = 0, collections.Counter(), collections.Counter()
    for line in out.splitlines():
        a = json.loads(line)
        q = questions[a["id"]]
        ok = a["answer"].strip() == q["answer"]
        right += ok
        kinds[q["kind"]] += 1
        kinds_right[q["kind"]] += ok
    n = sum(kinds.values())
    return {"questions": n, "correct": right, "accuracy": 100.0 * right / n,
            "by_kind": {k: f"{kinds_right[k]}/{kinds[k]}" for k in sorted(kinds)}}


def bench(artifact, threads, reps, tmp, extra=()):
    path = os.path.join(tmp, "bench.json")
    run([f"{BIN}/kiln-bench", artifact, "--threads", str(threads), "-r", str(reps), "--gen-tokens", "32",
         "--output", "json", "-o", path, *extra])
    r = json.load(open(path))["results"][0]
    s = r["stats"]
    keys = ["vision_encoder_ms", "projector_ms", "prefill_ms", "prefill_tokens_per_s", "ttft_ms",
            "decode_tokens_per_s", "peak_rss_bytes", "prompt_tokens", "image_tokens"]
    out = {k: s[k]["median"] for k in keys if k in s}
    out["file_bytes"] = r["artifact"]["file_bytes"]
    out["weight_bytes"] = r["artifact"]["weight_bytes"]
    return out


def experts(args, tmp, qfile):
    ckpt = os.path.join(SHAPES, "checkpoints", "moe")
    rows = []
    for prune in ["0", "1", "2", "4", "auto"]:
        artifact = os.path.join(tmp, f"moe-prune-{prune}.kiln")
        flags = [] if prune == "0" else [f"--prune-experts={prune}"]
        report = os.path.join(tmp, f"moe-prune-{prune}.json")
        run([f"{BIN}/kiln-compile", ckpt, "-o", artifact, "--report", report, *flags])
        pruned = json.load(open(report))["pruned_experts"]
        row = {"prune_experts": prune,
               "experts_kept": sorted({e["kept"] for e in pruned}) or [8],
               **accuracy(artifact, qfile, args.threads),
               **bench(artifact, args.threads, args.reps, tmp)}
        rows.append(row)
        print(f"experts --prune-experts={prune}: kept {row['experts_kept']}, {row['accuracy']:.1f}%, "
              f"{row['file_bytes']} bytes", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        qdir = os.path.join(tmp, "test")
        run([PY, os.path.join(SHAPES, "make_examples.py"), "--out", qdir, "--count", str(args.questions),
             "--split", "test"])
        qfile = os.path.join(qdir, "questions.jsonl")
        result = {"questions": args.questions, "threads": args.threads, "reps": args.reps,
                  "load_average": os.getloadavg()[0], "experts": experts(args, tmp, qfile)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"| --prune-experts | experts kept per layer | accuracy ({args.questions} test questions) | artifact bytes "
          f"| prefill tok/s | TTFT ms | decode tok/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in result["experts"]:
        print(f"| {r['prune_experts']} | {'/'.join(map(str, r['experts_kept']))} | {r['accuracy']:.1f}% "
              f"({r['correct']}/{r['questions']}) | {r['file_bytes']:,} | {r['prefill_tokens_per_s']:.0f} "
              f"| {r['ttft_ms']:.2f} | {r['decode_tokens_per_s']:.0f} | {r['peak_rss_bytes'] / 1e6:.1f} |")


if __name__ == "__main__":
    main()
