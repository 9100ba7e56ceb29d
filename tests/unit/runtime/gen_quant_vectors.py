#!/usr/bin/env python3
"""Test vectors for the runtime's weight encodings, from the NumPy reference
(tests/models/kiln_models/quant.py): for each encoding, random weights quantised to
the storage bytes, their dequantised values, and the output of a matrix product with
int8 per-token activations (W8A8 / W4A8) computed in the runtime's documented order.

usage: gen_quant_vectors.py OUT_DIR
Writes OUT_DIR/NAME.{bin,dequant.npy,x.npy,y.npy} and OUT_DIR/cases.txt, one line per
case: "NAME ENCODING GROUP SYMMETRIC ROWS COLS HAS_Y".
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
from kiln_models import quant  # noqa: E402


def int8_act_matmul(x, q, encoding, group, symmetric):
    xq, sx = quant.quantize_activations_int8(x)
    rows, k = x.shape
    n = q["codes"].shape[0]
    y = np.zeros((rows, n), dtype=np.float32)
    codes = q["codes"].astype(np.int32)
    for r in range(rows):
        xr = xq[r].astype(np.int32)
        for j in range(n):
            if encoding == "int8":
                acc = int(np.dot(xr, codes[j]))
                y[r, j] = np.float32(acc) * sx[r] * q["scales"][j]
            else:
                groups = k // group
                s = np.float32(0)
                for g in range(groups):
                    z = 8 if symmetric else int(q["zeros"][j, g])
                    acc = int(np.dot(xr[g * group:(g + 1) * group], codes[j, g * group:(g + 1) * group] - z))
                    s = np.float32(s + np.float32(acc) * np.float32(q["scales"][j, g]))
                y[r, j] = s * sx[r]
    return y


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(42)
    cases = [
        ("fp8_e4m3", 0, True), ("fp8_e5m2", 0, True), ("int8", 0, True),
        ("int4_g32", 32, True), ("int4_g64", 64, True), ("int4_g128", 128, True),
        ("int4_g32_asym", 32, False), ("int4_g128_asym", 128, False),
    ]
    lines = []
    for name, group, sym in cases:
        enc = name.split("_g")[0] if name.startswith("int4") else name
        rows, cols = 24, 256
        w = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.05)
        w[3] = 0.0                      # an all-zero row: scale 1, exact zeros
        w[5, :7] = np.float32(1e-9)     # tiny values next to normal ones
        w[7] *= np.float32(40.0)        # a row with a large range
        q = quant.quantize(w, enc, group, sym)
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(quant.to_bytes(q, enc))
        np.save(os.path.join(out, name + ".dequant.npy"), quant.dequantize(q, enc, w.shape, group, sym))
        has_y = enc in ("int8", "int4")
        if has_y:
            x = rng.standard_normal((5, cols)).astype(np.float32)
            x[2] = 0.0
            np.save(os.path.join(out, name + ".x.npy"), x)
            np.save(os.path.join(out, name + ".y.npy"), int8_act_matmul(x, q, enc, group, sym))
        assert len(quant.to_bytes(q, enc)) == quant.storage_bytes(w.shape, enc, group, sym)
        lines.append(f"{name} {enc} {group} {int(sym)} {rows} {cols} {int(has_y)}")
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
