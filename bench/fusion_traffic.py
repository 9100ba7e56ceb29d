#!/usr/bin/env python3
"""Kernels and activation traffic per layer of compiled artifacts, from their memory
plans (kiln-inspect --json --ops: each op's f32 inputs and output as planned, the token
dimension counted as one row, so decoder figures are per token and vision figures per
image). Typically a fused artifact beside its `kiln-compile --no-fuse` twin:

    bench/fusion_traffic.py fused.kiln unfused.kiln [--json out.json]

Prints, per artifact and stage, the ops of its first layer, their count and the bytes
they read and write. The runners' scratch (a fused op's normalised rows, its products
before the residual is added) and the KV cache are not counted."""

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def inspect(artifact, bin_dir):
    out = subprocess.run([os.path.join(bin_dir, "kiln-inspect"), artifact, "--json", "--ops"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def first_layer(ops):
    """The ops of the first layer (names <...>.layers.<n>.<...>) in the stage."""
    layer = None
    out = []
    for op in ops:
        m = re.match(r"(.*\.layers\.\d+)\.", op["name"])
        if not m:
            continue
        layer = layer or m.group(1)
        if m.group(1) == layer:
            out.append(op)
    return layer, out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifacts", nargs="+")
    p.add_argument("--bin-dir", default=os.environ.get("KILN_BIN_DIR", os.path.join(ROOT, "build", "host", "bin")))
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()
    report = []
    for artifact in a.artifacts:
        info = inspect(artifact, a.bin_dir)
        for stage in info["stages"]:
            layer, ops = first_layer(stage.get("op_list", []))
            if not ops:
                continue
            row = {"artifact": artifact, "stage": stage["kind"], "layer": layer, "kernels": len(ops),
                   "activation_bytes": sum(op["activation_bytes"] for op in ops),
                   "ops": [op["kind"] for op in ops]}
            report.append(row)
            print(f"{os.path.basename(artifact):32s} {row['stage']:15s} {row['kernels']:2d} kernels "
                  f"{row['activation_bytes']:10d} B  {' '.join(row['ops'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
