#!/usr/bin/python3
"""Markdown tables from the JSON lines of bench/llamacpp.mjs bench and bench/ort.mjs.

    /usr/bin/python3 bench/report.py /tmp/kbench/llama-bench-q4_0.json ... /tmp/kbench/ort-siglip.json ...
"""

from __future__ import annotations

import json
import os
import sys


def load_str(loads) -> str:
    ones = [l[0] for l in loads]
    lo, hi = f"{min(ones):.1f}", f"{max(ones):.1f}"
    return lo if lo == hi else f"{lo}–{hi}"


def main(paths) -> int:
    llama_rows, ort_rows = [], []
    for p in paths:
        with open(p) as f:
            d = json.loads(f.read().strip().splitlines()[-1])
        if "bench" in d:
            name = os.path.basename(d["info"]["model"]).removesuffix(".gguf")
            for r in d["bench"]:
                what = f"{r['kind']} {r['tokens']}"
                spread = r.get("seconds") or r.get("rates")
                if r["kind"] == "prefill":
                    spread = [r["tokens"] / s for s in spread]
                llama_rows.append(f"| {name} | {what} | {r['threads']} | {r['tokens_per_s']:.1f} | "
                                  f"{min(spread):.1f}–{max(spread):.1f} | {load_str(r['loadavg'])} | {os.path.basename(p)} |")
        elif "runs" in d:
            m = d["info"]["meta"]
            name = f"{m['model']} ({m['layers']} layers, {m['input']['shape'][-1]}², out {m['output']['shape'][1:]})"
            for r in d["runs"]:
                ort_rows.append(f"| {name} | {r['threads']} | {r['seconds_median'] * 1e3:.0f} | "
                                f"{min(r['seconds']) * 1e3:.0f}–{max(r['seconds']) * 1e3:.0f} | "
                                f"{r['max_abs_err_vs_torch']:.2g} | {load_str(r['loadavg'])} |")
    if llama_rows:
        print("| model | measurement | threads | tokens/s (median) | range over reps | load avg (1 min) | run |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(llama_rows))
        print()
    if ort_rows:
        print("| encoder | intra-op threads | ms (median) | range | max \\|ORT − PyTorch\\| | load avg (1 min) |")
        print("|---|---|---|---|---|---|")
        print("\n".join(ort_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
