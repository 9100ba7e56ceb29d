#!/usr/bin/python3
"""Kiln beside its peers, in one run, repetitions interleaved (Kiln, peer, Kiln, peer, ...).

    # text decoder: Kiln artifact vs llama.cpp GGUF of the same checkpoint
    /usr/bin/python3 bench/compare.py llm --kiln A.kiln --gguf M.gguf --label int4-vs-q4_0 \\
        [--threads 1,2] [--prefill 128,512] [--decode 64] [--reps 5] [--json out.json]
    # vision encoder: Kiln VLM artifact (its vision stage) vs ONNX Runtime on the exported encoder
    /usr/bin/python3 bench/compare.py vision --kiln VLM.kiln --image photo.png --onnx enc.onnx \\
        [--threads 1,2] [--reps 5] [--json out.json]
    # time to first token: a Kiln artifact against another (e.g. the same model --target=portable)
    /usr/bin/python3 bench/compare.py ttft --kiln VLM.kiln --baseline VLM-portable.kiln --image photo.png \
        [--threads 2] [--reps 5] [--json out.json]
    # two Kiln artifacts of one model (e.g. fused vs --no-fuse): text prefill and decode
    # tokens/s, and with --image the vision encoder and time to first token
    /usr/bin/python3 bench/compare.py ab --kiln A.kiln --baseline B.kiln [--image photo.png] \
        [--threads 2] [--prefill 128,512] [--decode 64] [--reps 5] [--json out.json]
    # memory bandwidth (streaming read) of this machine, the decode roofline
    /usr/bin/python3 bench/compare.py membw [--threads 1,2] [--reps 5]

Kiln is timed through kiln-run's --json statistics: prefill = N prompt ids in one step
(prefill_ms), decode = tokens/s from the first to the last generated token after a 16-token
prompt (decode_tokens_per_s), vision = vision_encoder_ms. llama.cpp through bench/llamacpp.mjs
(one timed repetition after one warm-up per call), ONNX Runtime through bench/ort.mjs (the same).
Reported: median, min and max per measurement and the Kiln / peer ratio of medians. The
effective weight bandwidth of decode is the artifact's weight bytes x tokens/s. Never pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("KILN_BIN", os.path.join(ROOT, "build", "host", "bin"))


def run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare.py: {' '.join(cmd[:3])} ... failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def kiln_json(args: list[str]) -> dict:
    out = run([os.path.join(BIN, "kiln-run"), *args, "--json", "--quiet"])
    return json.loads(out.strip().splitlines()[-1])


def prompt_ids(n: int, vocab: int, seed: int) -> str:
    rng = random.Random(seed)
    # Ordinary tokens: away from the low byte tokens and the specials at the end.
    return ",".join(str(rng.randrange(300, max(301, vocab - 300))) for _ in range(n))


def kiln_vocab(artifact: str) -> int:
    out = run([os.path.join(BIN, "kiln-inspect"), artifact])
    for line in out.splitlines():
        if "vocab" in line:
            return int(line.split("vocab")[1].split(",")[0].strip())
    sys.exit(f"compare.py: {artifact}: no vocabulary size in kiln-inspect's output")


def kiln_weight_bytes(artifact: str) -> int:
    out = run([os.path.join(BIN, "kiln-inspect"), artifact, "--json"])
    return int(json.loads(out)["memory_plan"]["weight_bytes"])


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "values": xs}


def llamacpp(gguf: str, threads: int, prefill: list[int], decode: int) -> dict:
    out = run(["node", os.path.join(HERE, "llamacpp.mjs"), "bench", "--model", gguf, "--threads", str(threads),
               "--prefill", ",".join(map(str, prefill)), "--decode", str(decode), "--reps", "1", "--warmup", "1"])
    res = {}
    for line in out.splitlines():
        d = json.loads(line)
        for b in d.get("bench", []):
            res[f"prefill{b['tokens']}" if b["kind"] == "prefill" else "decode"] = b["tokens_per_s"]
    return res


def kiln_llm(artifact: str, threads: int, prefill: list[int], decode: int, vocab: int) -> dict:
    res = {}
    for n in prefill:
        s = kiln_json([artifact, "--input-ids", prompt_ids(n, vocab, 7 + n), "--max-new-tokens", "1",
                       "--threads", str(threads)])
        res[f"prefill{n}"] = n / (s["prefill_ms"] / 1000.0)
    s = kiln_json([artifact, "--input-ids", prompt_ids(16, vocab, 3), "--max-new-tokens", str(decode + 1),
                   "--threads", str(threads)])
    if s["generated_tokens"] < decode // 2:
        print(f"  note: kiln stopped after {s['generated_tokens']} tokens (end of sequence)", file=sys.stderr)
    res["decode"] = s["decode_tokens_per_s"]
    return res


def membw(threads: int) -> float:
    exe = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kiln-membw")
    if not os.path.exists(exe):
        run(["cc", "-O2", "-march=native", "-pthread", "-o", exe, os.path.join(HERE, "membw.c")])
    out = run([exe, "512", "3"])
    for line in out.splitlines():
        d = json.loads(line)
        if d["threads"] == threads:
            return d["gb_per_s_median"]
    sys.exit("compare.py: membw printed no result for %d threads" % threads)


def ort(onnx: str, threads: int) -> float:
    out = run(["node", os.path.join(HERE, "ort.mjs"), "--model", onnx, "--threads", str(threads), "--reps", "1",
               "--warmup", "1"])
    for line in out.splitlines():
        d = json.loads(line)
        for r in d.get("runs", []):
            if r.get("threads") == threads:
                return r["seconds_median"] * 1000.0
    sys.exit("compare.py: ort.mjs printed no timing")


def table(rows: list[tuple]) -> str:
    head = "| measurement | threads | Kiln (median, min-max) | peer (median, min-max) | Kiln / peer |\n|---|---|---|---|---|\n"
    body = ""
    for name, t, k, p, ratio in rows:
        body += (f"| {name} | {t} | {k['median']:.1f} ({k['min']:.1f}-{k['max']:.1f}) | "
                 f"{p['median']:.1f} ({p['min']:.1f}-{p['max']:.1f}) | {ratio:.2f}x |\n")
    return head + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["llm", "vision", "ttft", "membw", "ab"])
    ap.add_argument("--baseline")
    ap.add_argument("--kiln")
    ap.add_argument("--gguf")
    ap.add_argument("--onnx")
    ap.add_argument("--image")
    ap.add_argument("--label", default="")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill", default="128,512")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    result = {"mode": a.mode, "label": a.label, "reps": a.reps, "machine": os.uname().nodename,
              "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": []}
    rows = []
    if a.mode == "membw":
        for t in threads:
            xs = []
            for _ in range(a.reps):
                result["loadavg"].append(loadavg())
                xs.append(membw(t))
            result[f"membw_gb_s_{t}t"] = summary(xs)
            print(f"memory bandwidth, {t} thread(s): median {statistics.median(xs):.1f} GB/s "
                  f"({min(xs):.1f}-{max(xs):.1f})")
    elif a.mode == "llm":
        if not (a.kiln and a.gguf):
            ap.error("llm needs --kiln and --gguf")
        prefill = [int(n) for n in a.prefill.split(",") if n]
        vocab = kiln_vocab(a.kiln)
        wbytes = kiln_weight_bytes(a.kiln)
        result.update(kiln=a.kiln, gguf=a.gguf, kiln_weight_bytes=wbytes, gguf_bytes=os.path.getsize(a.gguf))
        for t in threads:
            ks: dict[str, list[float]] = {}
            ps: dict[str, list[float]] = {}
            for _ in range(a.reps):
                result["loadavg"].append(loadavg())
                for k, v in kiln_llm(a.kiln, t, prefill, a.decode, vocab).items():
                    ks.setdefault(k, []).append(v)
                result["loadavg"].append(loadavg())
                for k, v in llamacpp(a.gguf, t, prefill, a.decode).items():
                    ps.setdefault(k, []).append(v)
            for k in ks:
                kk, pp = summary(ks[k]), summary(ps[k])
                result[f"kiln_{k}_{t}t"] = kk
                result[f"llamacpp_{k}_{t}t"] = pp
                rows.append((f"{a.label} {k} (tokens/s)", t, kk, pp, kk["median"] / pp["median"]))
            dec = summary(ks["decode"])
            result[f"kiln_decode_weight_gb_s_{t}t"] = dec["median"] * wbytes / 1e9
        print(table(rows))
        for t in threads:
            print(f"Kiln decode effective weight bandwidth, {t} thread(s): "
                  f"{result[f'kiln_decode_weight_gb_s_{t}t']:.1f} GB/s ({wbytes / 1e6:.1f} MB x tokens/s)")
    elif a.mode == "ab":
        if not (a.kiln and a.baseline):
            ap.error("ab needs --kiln and --baseline")
        prefill = [int(n) for n in a.prefill.split(",") if n]
        vocab = kiln_vocab(a.kiln)
        result.update(kiln=a.kiln, baseline=a.baseline)

        def measure(artifact: str, t: int) -> dict:
            m = kiln_llm(artifact, t, prefill, a.decode, vocab)
            if a.image:
                s = kiln_json([artifact, "--image", a.image, "--prompt", "How do I install this?",
                               "--max-new-tokens", "1", "--threads", str(t)])
                m["vision_encoder_ms"] = s["vision_encoder_ms"]
                m["ttft_ms"] = s["ttft_ms"]
            return m

        for t in threads:
            ks: dict[str, list[float]] = {}
            bs: dict[str, list[float]] = {}
            for r in range(a.reps):
                # Alternate which artifact runs first, so that neither always follows the other.
                order = [(a.kiln, ks), (a.baseline, bs)] if r % 2 == 0 else [(a.baseline, bs), (a.kiln, ks)]
                for artifact, into in order:
                    result["loadavg"].append(loadavg())
                    for k, v in measure(artifact, t).items():
                        into.setdefault(k, []).append(v)
            for k in ks:
                kk, bb = summary(ks[k]), summary(bs[k])
                result[f"kiln_{k}_{t}t"] = kk
                result[f"baseline_{k}_{t}t"] = bb
                unit = "ms" if k.endswith("_ms") else "tokens/s"
                # Speed-up: higher tokens/s or lower ms is better.
                ratio = bb["median"] / kk["median"] if unit == "ms" else kk["median"] / bb["median"]
                rows.append((f"{a.label} {k} ({unit})", t, kk, bb, ratio))
        print(table(rows).replace("Kiln / peer", "speed-up over baseline").replace("peer (", "baseline ("))
    elif a.mode == "ttft":
        if not (a.kiln and a.baseline and a.image):
            ap.error("ttft needs --kiln, --baseline and --image")
        result.update(kiln=a.kiln, baseline=a.baseline)
        args = ["--image", a.image, "--prompt", "How do I install this?", "--max-new-tokens", "1"]
        for t in threads:
            ks, bs, stages = [], [], []
            for _ in range(a.reps):
                result["loadavg"].append(loadavg())
                s = kiln_json([a.kiln, *args, "--threads", str(t)])
                ks.append(s["ttft_ms"])
                stages.append({k: s[k] for k in ("image_preprocess_ms", "vision_encoder_ms", "projector_ms",
                                                  "prefill_ms", "first_token_ms")})
                result["loadavg"].append(loadavg())
                bs.append(kiln_json([a.baseline, *args, "--threads", str(t)])["ttft_ms"])
            kk, bb = summary(ks), summary(bs)
            result[f"kiln_ttft_ms_{t}t"] = kk
            result[f"baseline_ttft_ms_{t}t"] = bb
            result[f"kiln_stages_{t}t"] = stages
            rows.append((f"{a.label} time to first token (ms)", t, kk, bb, bb["median"] / kk["median"]))
        print(table(rows).replace("Kiln / peer", "speed-up over baseline").replace("peer (", "baseline ("))
    else:
        if not (a.kiln and a.onnx and a.image):
            ap.error("vision needs --kiln, --image and --onnx")
        result.update(kiln=a.kiln, onnx=a.onnx)
        for t in threads:
            ks, ps = [], []
            for _ in range(a.reps):
                result["loadavg"].append(loadavg())
                s = kiln_json([a.kiln, "--image", a.image, "--prompt", "Describe the picture.", "--max-new-tokens",
                               "1", "--threads", str(t)])
                ks.append(s["vision_encoder_ms"])
                result["loadavg"].append(loadavg())
                ps.append(ort(a.onnx, t))
            kk, pp = summary(ks), summary(ps)
            result[f"kiln_vision_ms_{t}t"] = kk
            result[f"ort_vision_ms_{t}t"] = pp
            rows.append((f"{a.label} vision encoder (ms)", t, kk, pp, pp["median"] / kk["median"]))
        print(table(rows).replace("Kiln / peer", "speed-up over peer"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
