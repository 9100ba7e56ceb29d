#!/usr/bin/env python3
"""Measures what per-layer precision buys, through Kiln (kiln-compile + kiln-run):

  * the demo model (dense and MoE), on held-out questions: exact-match accuracy of
    the generated answers, the questions whose correctness changed against fp32,
    and, scoring the reference answers (kiln-run --score), the mean KL divergence
    of every answer token's distribution from fp32's and the answers' mean
    negative log-likelihood. For fp32, uniform int4 (round to nearest and GPTQ),
    and the solved mix (round to nearest and GPTQ) at about 4.5 bits per weight
    and at the bytes of uniform int4;
  * a tiny generated Llama and LLaVA: mean KL of the next-token distributions
    against fp32 for uniform int8, uniform int4 and the solved mix at the bytes of
    uniform int4.

Writes JSON (and prints a Markdown table). Needs a host build (build/host/bin).

    /usr/bin/python3 scripts/eval_precision.py --out build/eval-precision.json [--questions 1000]
    /usr/bin/python3 scripts/eval_precision.py --out build/eval-vision.json --vision-encoder
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODELS = os.path.join(ROOT, "tests", "models")
BIN = os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin"))
PY = "/usr/bin/python3"


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{p.stderr}")
    return p


def weight_bytes(artifact):
    info = json.loads(run([f"{BIN}/kiln-inspect", artifact, "--json"]).stdout)
    params = sum(int(np.prod(r["shape"])) for r in info["precision"])
    total = sum(r["bytes"] for r in info["precision"])
    return total, 8.0 * total / params


def compile_(ckpt, out, *flags):
    run([f"{BIN}/kiln-compile", ckpt, "-o", out, *flags])
    return out


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def mean_kl_rows(logp_ref, logp):
    """Mean over rows of KL(ref || other), both given as log-probabilities."""
    return float((np.exp(logp_ref) * (logp_ref - logp)).sum(-1).mean())


def demo_metrics(artifact, qfile, threads, tmp):
    """Generated answers (exact match per question of the list `qfile`) and the scored
    reference answers (log-probabilities and the log-softmax of every scored position)."""
    answers = run([f"{BIN}/kiln-run", artifact, "--batch", qfile, "--threads", str(threads)]).stdout
    got = {a["id"]: a["answer"].strip() for a in map(json.loads, answers.splitlines())}
    qs = [json.loads(l) for l in open(qfile)]
    logits = os.path.join(tmp, "scored.npy")
    scores = run([f"{BIN}/kiln-run", artifact, "--batch", qfile, "--score", "--answer-suffix", "</s>",
                  "--dump-logits", logits, "--threads", str(threads)]).stdout
    scored = {s["id"]: s for s in map(json.loads, scores.splitlines())}
    return {
        "correct": [got[q["id"]] == q["answer"] for q in qs],
        "nll": float(-np.mean([scored[q["id"]]["logprob"] for q in qs])),
        "logp": log_softmax(np.load(logits)),
    }


def mean_kl(reference, artifact, prompts_ids, pixels, tmp):
    kls = []
    for i, ids in enumerate(prompts_ids):
        ids_path = os.path.join(tmp, f"ids{i}.npy")
        np.save(ids_path, np.array(ids, dtype=np.int64))
        outs = []
        for art in (reference, artifact):
            path = os.path.join(tmp, f"logits{i}.npy")
            cmd = [f"{BIN}/kiln-run", art, "--input-ids", ids_path, "--dump-logits", path, "--max-new-tokens", "1",
                   "--quiet"]
            if pixels is not None:
                cmd += ["--pixel-values", pixels]
            run(cmd)
            outs.append(np.load(path)[0])
        kls.append(mean_kl_rows(*map(log_softmax, outs)))
    return float(np.mean(kls))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--questions", type=int, default=1000)
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, "build", "eval-precision-cache"),
                    help="sensitivity cache (kept between runs)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--demo", choices=["v1", "v2"], default="v1",
                    help="demo model: v1 (tests/models/shapes) or v2 (tests/models/shapes_v2, its shipped test set)")
    ap.add_argument("--checkpoints", help="directory holding the demo model's variants (default: the demo's)")
    ap.add_argument("--variants", default="dense,moe")
    ap.add_argument("--skip-tiny", action="store_true", help="only the demo model")
    ap.add_argument("--vision-encoder", action="store_true",
                    help="only the demo model, fp32 against its vision encoder quantised (int8_a8, int8, "
                         "int4_g32) and the rest fp32")
    ap.add_argument("--keep", action="store_true", help="keep the compiled artifacts (their directory is printed)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-eval-")
    try:
        evaluate(args, tmp)
    finally:
        if args.keep:
            print(f"artifacts kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def evaluate_demo(args, tmp, qfile, variant, arts, res, rows):
    """Each artifact of the demo `variant` on the questions of `qfile`, against the first."""
    ref = None
    for name, art in arts.items():
        b, bpw = weight_bytes(art)
        m = demo_metrics(art, qfile, args.threads, tmp)
        if ref is None:
            ref = m
        kl = mean_kl_rows(ref["logp"], m["logp"])
        lost = sum(r and not x for r, x in zip(ref["correct"], m["correct"]))
        gained = sum(x and not r for r, x in zip(ref["correct"], m["correct"]))
        acc = float(np.mean(m["correct"]))
        res[name] = {"accuracy": acc, "lost_vs_fp32": lost, "gained_vs_fp32": gained, "mean_kl": kl,
                     "answer_nll": m["nll"], "bytes": b, "bits_per_weight": bpw}
        rows.append(f"| demo {variant} | {name} | {b / 1e6:.2f} MB | {bpw:.2f} | {100 * acc:.1f}% "
                    f"(−{lost} +{gained}) | {kl:.2e} | {m['nll']:.4f} |")
        print(rows[-1], file=sys.stderr, flush=True)


def evaluate(args, tmp):
    cache = os.path.join(tmp, "cache")
    results = {"demo": {}, "tiny": {}}
    rows = []

    from eval_pruning import DEMOS, demo_questions
    # v1 renders questions past the pruning tables' (start 5000); v2 ships its test set
    qfile = demo_questions(args.demo, args.questions, tmp, 5000 if args.demo == "v1" else 0)
    checkpoints = args.checkpoints or os.path.join(DEMOS[args.demo], "checkpoints")
    for variant in [v for v in args.variants.split(",") if v]:
        ckpt = os.path.join(checkpoints, variant)
        res = {}
        if args.vision_encoder:
            arts = {"fp32": compile_(ckpt, os.path.join(tmp, f"{variant}-fp32.kiln"), "--precision", ".*=f32")}
            for enc in ("int8_a8", "int8", "int4_g32"):
                arts[f"vision encoder {enc}, the rest fp32"] = compile_(
                    ckpt, os.path.join(tmp, f"{variant}-vision-{enc}.kiln"), "--precision", f".*vision_tower\\..*={enc}",
                    "--precision", ".*=f32")
            evaluate_demo(args, tmp, qfile, variant, arts, res, rows)
            results["demo"][variant] = res
            continue
        arts = {
            "fp32": compile_(ckpt, os.path.join(tmp, f"{variant}-fp32.kiln"), "--precision", ".*=f32"),
            "int4 g32, round to nearest": compile_(ckpt, os.path.join(tmp, f"{variant}-int4.kiln"), "--precision",
                                                   ".*=int4_g32"),
            "int4 g32, GPTQ": compile_(ckpt, os.path.join(tmp, f"{variant}-int4-gptq.kiln"), "--precision",
                                       ".*=int4_g32", "--quantizer", "gptq"),
        }
        int4_bytes, _ = weight_bytes(arts["int4 g32, round to nearest"])
        for q in ("rtn", "gptq"):
            label = "round to nearest" if q == "rtn" else "GPTQ"
            arts[f"solved mix, 4.5 bits/weight, {label}"] = compile_(
                ckpt, os.path.join(tmp, f"{variant}-mix45-{q}.kiln"), "--bits-per-weight", "4.5", "--quantizer", q,
                "--cache-dir", args.cache_dir)
            arts[f"solved mix at int4's bytes, {label}"] = compile_(
                ckpt, os.path.join(tmp, f"{variant}-mixeq-{q}.kiln"), "--memory-budget", str(int4_bytes),
                "--quantizer", q, "--cache-dir", args.cache_dir)
        evaluate_demo(args, tmp, qfile, variant, arts, res, rows)
        results["demo"][variant] = res

    sys.path.insert(0, MODELS)
    skip_tiny = args.skip_tiny or args.vision_encoder
    for preset, vlm in () if skip_tiny else (("tiny-llama", False), ("tiny-llava", True)):
        ckpt = os.path.join(tmp, preset)
        run([PY, os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", ckpt])
        # Calibration and evaluation prompts are different texts.
        from kiln_models.tokenizer import corpus_text
        sentences = [s.strip() + "." for s in corpus_text().split(".") if len(s.strip()) > 20]
        calib = [{"prompt": s} for s in sentences[:8]]
        held_out = sentences[20:28]
        pixels = None
        if vlm:
            from PIL import Image
            rng = np.random.default_rng(0)
            for i in range(len(calib)):
                Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).resize((48, 48)).save(
                    os.path.join(ckpt, f"calib{i}.png"))
                calib[i]["image"] = f"calib{i}.png"
            img = os.path.join(tmp, "eval.png")
            Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).resize((48, 48)).save(img)
        with open(os.path.join(ckpt, "calibration.jsonl"), "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in calib)
        prompts = []
        for s in held_out:
            cmd = [PY, os.path.join(MODELS, "golden.py"), ckpt, "--out", os.path.join(tmp, "g"), "--prompt", s,
                   "--max-new-tokens", "1"]
            if vlm:
                cmd += ["--image", img]
            run(cmd)
            prompts.append([int(t) for t in np.load(os.path.join(tmp, "g", "input_ids.npy")).reshape(-1)])
            if vlm and pixels is None:
                px = np.load(os.path.join(tmp, "g", "pixel_values.npy")).astype(np.float32)
                pixels = os.path.join(tmp, preset + "-px.npy")
                np.save(pixels, px.reshape(px.shape[-3:]))
        ref = compile_(ckpt, os.path.join(tmp, f"{preset}-fp32.kiln"), "--precision", ".*=f32")
        arts = {
            "int8": compile_(ckpt, os.path.join(tmp, f"{preset}-int8.kiln"), "--precision", ".*=int8"),
            "int4 RTN": compile_(ckpt, os.path.join(tmp, f"{preset}-int4.kiln"), "--precision", ".*=int4_g32"),
        }
        int4_bytes, _ = weight_bytes(arts["int4 RTN"])
        arts["int4 GPTQ"] = compile_(ckpt, os.path.join(tmp, f"{preset}-int4-gptq.kiln"), "--precision",
                                     ".*=int4_g32", "--quantizer", "gptq")
        for q in ("rtn", "gptq"):
            arts[f"mix @ int4 bytes, {'RTN' if q == 'rtn' else 'GPTQ'}"] = compile_(
                ckpt, os.path.join(tmp, f"{preset}-mix-{q}.kiln"), "--memory-budget", str(int4_bytes), "--quantizer",
                q, "--cache-dir", cache)
        res = {}
        for name, art in arts.items():
            b, bpw = weight_bytes(art)
            kl = mean_kl(ref, art, prompts, pixels, tmp)
            res[name] = {"mean_kl": kl, "bytes": b, "bits_per_weight": bpw}
            rows.append(f"| {preset} | {name} | {b / 1e3:.1f} KB | {bpw:.2f} | | {kl:.2e} | |")
            print(rows[-1], file=sys.stderr, flush=True)
        results["tiny"][preset] = res

    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print("| model | precision | weights | bits/weight | accuracy (lost, gained vs fp32) | mean KL | answer NLL |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
