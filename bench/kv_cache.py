#!/usr/bin/env python3
"""KV-cache encodings measured: bytes per token, quality against an f32 cache, decode
speed at a long context, and (for the "shapes" demo) exact-match accuracy.

    bench/kv_cache.py quality  --kiln M.kiln [--tokens 600] [--prompts 3] --json q.json
    bench/kv_cache.py speed    --kiln M.kiln --context 2048 --decode 64 --reps 5 --threads 2 --json s.json
    bench/kv_cache.py paging   --kiln M.kiln --context 2048 --decode 64 --reps 5 --threads 2 --json p.json
    bench/kv_cache.py artifacts --kiln M.kiln --compare N.kiln --compare O.kiln:int8 --context 2048 ... --json a.json
    bench/kv_cache.py accuracy --kiln shapes-dense.kiln --questions DIR/questions.jsonl --json a.json

Every encoding runs on the same artifact through kiln-run --kv-cache (a session may
choose any encoding; kiln-compile --kv-cache only sets the default), so nothing but
the cache differs.

quality: held-out prompts are the repository's docs (docs/*.md, README.md) cut into
--prompts windows of --tokens tokens (capped by the model's positions), tokenised
with the model's own tokenizer. For each window, kiln-run --dump-logits gives the
logits of every position with each encoding; reported: mean KL(p_f32 || p_enc) over
positions (nats), the share of positions whose top-1 token agrees with f32, and the
largest logit difference.

paging: the same for the artifact's encoding unpaged and paged (kiln-run --kv-pool,
--kv-block 16 to 256), to choose the block size.

artifacts: the same for --kiln and each --compare PATH[:ENCODING] (another artifact, its
session's cache encoding), e.g. two compilations of one checkpoint whose kernels differ,
runs alternating between them.

speed: decode tokens/s after a --context-token prompt, encodings alternating run by
run (--reps each), medians and the load average; never pass/fail.

accuracy: kiln-run --batch over a question list (tests/models/shapes/make_examples.py
--split test writes one), exact matches per encoding.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin"))
ENCODINGS = ["f32", "f16", "int8", "int4"]


def kiln(tool: str, *args: str) -> str:
    p = subprocess.run([os.path.join(BIN, tool), *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{tool} {' '.join(a[:60] for a in args[:3])} ...: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def inspect(artifact: str) -> dict:
    return json.loads(kiln("kiln-inspect", artifact, "--json"))


def bytes_per_token(artifact: str) -> dict:
    out = {}
    for enc in ENCODINGS:
        s = json.loads(kiln("kiln-run", artifact, "--input-ids", "1", "--max-new-tokens", "1", "--kv-cache", enc,
                            "--json", "--quiet", "--context", "16").strip().splitlines()[-1])
        out[enc] = s["kv_cache_token_bytes"]
    return out


def held_out_ids(artifact: str, tokens: int, prompts: int) -> list[list[int]]:
    text = "\n\n".join(open(f, encoding="utf-8").read()
                       for f in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")])
    # One argument stays under the kernel's 128 KiB limit.
    ids = json.loads(kiln("kiln-run", artifact, "--tokenize", text[:100000], "--json"))["ids"]
    windows = [ids[i * tokens:(i + 1) * tokens] for i in range(prompts)]
    return [w for w in windows if len(w) == tokens]


def softmax_log(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def quality(a: argparse.Namespace) -> dict:
    info = inspect(a.kiln)
    tokens = min(a.tokens, info["text"]["max_position_embeddings"] - 8)
    windows = held_out_ids(a.kiln, tokens, a.prompts)
    if not windows:
        sys.exit("not enough held-out text for one window")
    res = {"artifact": a.kiln, "tokens_per_prompt": tokens, "prompts": len(windows),
           "kv_cache_token_bytes": bytes_per_token(a.kiln), "encodings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        logits = {}
        for enc in ENCODINGS:
            logits[enc] = []
            for i, w in enumerate(windows):
                path = os.path.join(tmp, f"{enc}-{i}.npy")
                kiln("kiln-run", a.kiln, "--input-ids", ",".join(map(str, w)), "--dump-logits", path,
                     "--kv-cache", enc, "--context", str(tokens + 8), "--max-new-tokens", "1", "--threads", str(a.threads),
                     "--quiet")
                logits[enc].append(np.load(path).reshape(-1, np.load(path).shape[-1]))
        for enc in ENCODINGS:
            kls, agree, maxdiff = [], [], 0.0
            for ref, got in zip(logits["f32"], logits[enc]):
                lp, lq = softmax_log(ref), softmax_log(got)
                kls.extend((np.exp(lp) * (lp - lq)).sum(-1).tolist())
                agree.extend((ref.argmax(-1) == got.argmax(-1)).tolist())
                maxdiff = max(maxdiff, float(np.abs(ref - got).max()))
            res["encodings"][enc] = {"mean_kl": float(np.mean(kls)), "max_kl": float(np.max(kls)),
                                     "top1_agreement": float(np.mean(agree)), "max_logit_diff": maxdiff}
    return res


def timed(a: argparse.Namespace, configs: dict[str, list[str]], artifacts: dict[str, str] | None = None) -> dict:
    """Decode tokens/s and prefill ms after a --context-token prompt for each named set
    of extra kiln-run arguments (on artifacts[name], else --kiln), the configurations
    alternating run by run."""
    vocab = inspect(a.kiln)["text"]["vocab_size"]
    rng = np.random.default_rng(11)
    prompt = ",".join(str(int(x)) for x in rng.integers(1, vocab, a.context))
    names = list(configs)
    runs: dict[str, list[float]] = {n: [] for n in names}
    prefill: dict[str, list[float]] = {n: [] for n in names}
    load = []
    for r in range(a.reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            load.append(os.getloadavg()[0])
            out = kiln("kiln-run", (artifacts or {}).get(name, a.kiln), "--input-ids", prompt, "--max-new-tokens", str(a.decode + 1),
                       "--context", str(a.context + a.decode + 8), "--threads", str(a.threads),
                       "--json", "--quiet", *configs[name])
            s = json.loads(out.strip().splitlines()[-1])
            runs[name].append(s["decode_tokens_per_s"])
            prefill[name].append(s["prefill_ms"])
    return {"artifact": a.kiln, "context": a.context, "decode_tokens": a.decode, "threads": a.threads,
            "reps": a.reps, "loadavg": load,
            "decode_tokens_per_s": {n: {"median": statistics.median(v), "runs": v} for n, v in runs.items()},
            "prefill_ms": {n: {"median": statistics.median(v), "runs": v} for n, v in prefill.items()}}


def compare_artifacts(a: argparse.Namespace) -> dict:
    configs, artifacts = {os.path.basename(a.kiln): []}, {os.path.basename(a.kiln): a.kiln}
    for spec in a.compare or []:
        path, _, enc = spec.partition(":")
        name = os.path.basename(path) + (f":{enc}" if enc else "")
        configs[name] = ["--kv-cache", enc] if enc else []
        artifacts[name] = path
    return timed(a, configs, artifacts)


def speed(a: argparse.Namespace) -> dict:
    return timed(a, {e: ["--kv-cache", e] for e in ENCODINGS})


def paging(a: argparse.Namespace) -> dict:
    """The artifact's encoding unpaged and paged with blocks of 16-256 positions (one
    session, a pool of its context)."""
    pool = str(a.context + a.decode + 8)
    configs = {"unpaged": []}
    for block in a.blocks:
        configs[f"block{block}"] = ["--kv-pool", pool, "--kv-block", str(block)]
    return timed(a, configs)


def accuracy(a: argparse.Namespace) -> dict:
    questions = {q["id"]: q for q in map(json.loads, open(a.questions))}
    res = {"artifact": a.kiln, "questions": len(questions), "right": {}}
    for enc in ENCODINGS:
        out = kiln("kiln-run", a.kiln, "--batch", a.questions, "--kv-cache", enc, "--threads", str(a.threads))
        answers = [json.loads(line) for line in out.splitlines() if line.strip()]
        res["right"][enc] = sum(x["answer"].strip() == questions[x["id"]]["answer"] for x in answers)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["quality", "speed", "paging", "accuracy", "artifacts"])
    ap.add_argument("--compare", action="append", help="artifacts: another artifact, PATH[:ENCODING]")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128, 256],
                    help="paging: the block sizes (positions) to time beside the unpaged cache")
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--questions")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.mode == "accuracy" and not a.questions:
        ap.error("accuracy needs --questions")
    res = {"quality": quality, "speed": speed, "paging": paging, "accuracy": accuracy,
           "artifacts": compare_artifacts}[a.mode](a)
    cpu = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    res["machine"] = {"cpus": os.cpu_count(), "model": cpu[0] if cpu else ""}
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
