#!/usr/bin/env python3
"""Measures what compile-time pruning costs and buys on the demo model, through Kiln
(kiln-compile + kiln-run + kiln-bench), on held-out test questions:

  * experts: the MoE demo model with 0, 1, 2 (25%) and 4 (50%) of its 8 experts per
    layer pruned (--prune-experts), and auto, each removed and merged
    (--prune-experts-merge): exact-match accuracy (per question kind too), artifact and
    weight bytes, and kiln-bench's prefill, TTFT, decode and peak RSS (medians of
    --reps runs, --threads);
  * visual-tokens: the dense and MoE demo models with 100, 75, 50 and 25% of their
    image tokens kept (--visual-tokens), by either score: accuracy, TTFT by stage;
  * smolvlm: LLM prefill and TTFT by stage at SmolVLM-256M's shapes (generated weights,
    int8 with int8 activations) with 64, 48, 32 and 16 of its 64 image tokens kept.

Writes JSON (and prints Markdown tables). Needs a host build (build/host/bin).

    /usr/bin/python3 scripts/eval_pruning.py --out build/eval-pruning.json [--questions 500] [--threads 2]
        [--reps 5] [--only experts|visual-tokens|smolvlm] [--demo v1|v2] [--checkpoints DIR]
        [--variants dense,moe] [--positions original|consecutive]

--demo v2 uses the shapes_v2 test set (tests/models/shapes_v2/test/test.jsonl) and
checkpoints (--checkpoints: a directory with dense/ and moe/ of a run in training).
"""

import argparse
import collections
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eval_precision import BIN, PY, ROOT, run  # noqa: E402

MODELS = os.path.join(ROOT, "tests", "models")
# The demo models: v1 ("shapes", 16 image tokens) renders its test questions from the
# task's test split; v2 ("shapes_v2", 144 image tokens) ships them.
DEMOS = {"v1": os.path.join(MODELS, "shapes"), "v2": os.path.join(MODELS, "shapes_v2")}
V2_TEST = os.path.join(DEMOS["v2"], "test", "test.jsonl")


def demo_questions(demo, count, tmp, start=0):
    """A question list of `count` held-out test questions of the demo model `demo`."""
    if demo == "v2":
        lines = open(V2_TEST).readlines()[start:start + count]
        if len(lines) < count:
            sys.exit(f"{V2_TEST}: has {len(lines) + start} questions, {start + count} asked for")
        qfile = os.path.join(tmp, "test.jsonl")
        base = os.path.dirname(V2_TEST)
        with open(qfile, "w") as f:
            for line in lines:
                q = json.loads(line)
                q["image"] = os.path.join(base, q["image"])
                f.write(json.dumps(q) + "\n")
        return qfile
    qdir = os.path.join(tmp, "test")
    run([PY, os.path.join(DEMOS["v1"], "make_examples.py"), "--out", qdir, "--count", str(count),
         "--split", "test", "--start", str(start)])
    return os.path.join(qdir, "questions.jsonl")


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
    ckpt = os.path.join(args.checkpoints or os.path.join(DEMOS[args.demo], "checkpoints"), "moe")
    rows = []
    # Removed (the default), then merged into the most similar kept expert.
    for prune, merge in [(p, False) for p in ["0", "1", "2", "4", "auto"]] + [(p, True) for p in ["1", "2", "4", "auto"]]:
        name = f"moe-prune-{prune}{'-merge' if merge else ''}"
        artifact = os.path.join(tmp, name + ".kiln")
        flags = [] if prune == "0" else [f"--prune-experts={prune}"]
        if merge:
            flags.append("--prune-experts-merge")
        report = os.path.join(tmp, name + ".json")
        run([f"{BIN}/kiln-compile", ckpt, "-o", artifact, "--report", report, *flags])
        pruned = json.load(open(report))["pruned_experts"]
        row = {"prune_experts": prune,
               "merge": merge,
               "experts_kept": sorted({e["kept"] for e in pruned}) or [8],
               "merged": sum(1 for layer in pruned for e in layer["pruned"] if e.get("merged_into") is not None),
               "removed": sum(1 for layer in pruned for e in layer["pruned"] if e.get("merged_into") is None),
               **accuracy(artifact, qfile, args.threads),
               **bench(artifact, args.threads, args.reps, tmp)}
        rows.append(row)
        print(f"experts --prune-experts={prune}{' --prune-experts-merge' if merge else ''}: kept {row['experts_kept']}, "
              f"{row['accuracy']:.1f}%, {row['file_bytes']} bytes", file=sys.stderr)
    return rows


def visual_tokens(args, tmp, qfile):
    rows = []
    for variant in args.variants.split(","):
        ckpt = os.path.join(args.checkpoints or os.path.join(DEMOS[args.demo], "checkpoints"), variant)
        for score in ["distinct", "norm"]:
            for keep in ["100%", "75%", "50%", "25%"]:
                if keep == "100%" and score == "norm":
                    continue  # the same artifact as distinct's
                artifact = os.path.join(tmp, f"{variant}-vt.kiln")
                flags = [] if keep == "100%" else [f"--visual-tokens={keep}", f"--visual-token-score={score}",
                                                   f"--visual-token-positions={args.positions}"]
                run([f"{BIN}/kiln-compile", ckpt, "-o", artifact, *flags])
                row = {"model": variant, "visual_tokens": keep, "score": score if keep != "100%" else None,
                       "positions": args.positions if keep != "100%" else None,
                       **accuracy(artifact, qfile, args.threads), **bench(artifact, args.threads, args.reps, tmp)}
                rows.append(row)
                print(f"visual tokens {variant} {keep} {score}: {row['accuracy']:.1f}%", file=sys.stderr)
    return rows


def smolvlm_prefill(args, tmp):
    """LLM prefill and TTFT by stage at SmolVLM-256M's shapes (generated weights: speed only)."""
    ckpt = os.path.join(tmp, "smolvlm-256m")
    run([PY, os.path.join(ROOT, "tests", "models", "generate.py"), "--preset", "smolvlm-256m", "--out", ckpt])
    rows = []
    for keep in ["64", "48", "32", "16"]:
        artifact = os.path.join(tmp, "smol.kiln")
        flags = [] if keep == "64" else [f"--visual-tokens={keep}"]
        run([f"{BIN}/kiln-compile", ckpt, "-o", artifact, "--precision=.*=int8_a8", *flags])
        rows.append({"visual_tokens": int(keep), **bench(artifact, args.threads, args.reps, tmp)})
        print(f"smolvlm {keep} tokens: prefill {rows[-1]['prefill_ms']:.1f} ms", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--questions", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--demo", choices=sorted(DEMOS), default="v1", help="demo model (default v1)")
    ap.add_argument("--checkpoints", help="directory holding the demo model's variants (default: the demo's)")
    ap.add_argument("--variants", default="dense,moe", help="demo variants of the visual-token table")
    ap.add_argument("--positions", choices=["original", "consecutive"], default="original",
                    help="--visual-token-positions of the visual-token table")
    ap.add_argument("--only", choices=["experts", "visual-tokens", "smolvlm"], action="append",
                    help="run only these parts (repeatable; default: all)")
    args = ap.parse_args()
    parts = set(args.only or ["experts", "visual-tokens", "smolvlm"])
    with tempfile.TemporaryDirectory() as tmp:
        qfile = demo_questions(args.demo, args.questions, tmp)
        result = {"demo": args.demo, "questions": args.questions, "threads": args.threads, "reps": args.reps,
                  "load_average": os.getloadavg()[0]}
        if "experts" in parts:
            result["experts"] = experts(args, tmp, qfile)
        if "visual-tokens" in parts:
            result["visual_tokens"] = visual_tokens(args, tmp, qfile)
        if "smolvlm" in parts:
            result["smolvlm"] = smolvlm_prefill(args, tmp)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    if "experts" in result:
        print(f"| --prune-experts | pruned experts (all layers) | experts kept per layer "
              f"| accuracy ({args.questions} test questions) "
              f"| artifact bytes | prefill tok/s | TTFT ms | decode tok/s | peak RSS MB |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in result["experts"]:
            how = "-" if r["prune_experts"] == "0" else (
                f"{r['merged']} merged, {r['removed']} removed" if r.get("merge") else f"{r['removed']} removed")
            print(f"| {r['prune_experts']}{' merge' if r.get('merge') else ''} | {how} "
                  f"| {'/'.join(map(str, r['experts_kept']))} | {r['accuracy']:.1f}% "
                  f"({r['correct']}/{r['questions']}) | {r['file_bytes']:,} | {r['prefill_tokens_per_s']:.0f} "
                  f"| {r['ttft_ms']:.2f} | {r['decode_tokens_per_s']:.0f} | {r['peak_rss_bytes'] / 1e6:.1f} |")
    if "visual_tokens" in result:
        print(f"\n| model | --visual-tokens | score | accuracy ({args.questions} test questions) | prompt tokens "
              f"| vision encoder ms | projector ms | LLM prefill ms | TTFT ms |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in result["visual_tokens"]:
            print(f"| {r['model']} | {r['visual_tokens']} | {r['score'] or '-'} | {r['accuracy']:.1f}% "
                  f"({r['correct']}/{r['questions']}) | {r['prompt_tokens']:.0f} | {r['vision_encoder_ms']:.2f} "
                  f"| {r['projector_ms']:.3f} | {r['prefill_ms']:.2f} | {r['ttft_ms']:.2f} |")
    if "smolvlm" in result:
        base = result["smolvlm"][0]["prefill_ms"]
        print("\n| image tokens kept | prompt tokens | vision encoder ms | LLM prefill ms | prefill speed-up | TTFT ms |")
        print("|---|---|---|---|---|---|")
        for r in result["smolvlm"]:
            print(f"| {r['visual_tokens']} | {r['prompt_tokens']:.0f} | {r['vision_encoder_ms']:.0f} "
                  f"| {r['prefill_ms']:.1f} | {base / r['prefill_ms']:.2f}x | {r['ttft_ms']:.0f} |")


if __name__ == "__main__":
    main()
