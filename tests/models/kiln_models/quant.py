"""Kiln's weight storage encodings in NumPy: the reference the compiler's quantiser
and the runtime's dequantisation are checked against, bit for bit.

Every encoding stores a weight viewed as a matrix [rows, cols] (rows = the first
dimension, cols = the product of the others; a linear's [out_features, in_features]).
The byte layout of one tensor is the concatenation, in this order, of

    codes    rows * cols elements (fp8/int8: 1 byte each; int4: two per byte,
             element 2k in the low nibble of byte k, 2k+1 in the high nibble)
    scales   fp8, int8: one float32 per row; int4: one float16 per (row, group)
    zeros    int4 asymmetric only: one uint8 per (row, group)

with no padding between the parts (docs/precision.md). Rounding is
round-half-to-even everywhere (np.rint), as the C++ side (nearbyint) does.

    fp8_e4m3 / fp8_e5m2   w ~= decode(code) * scale[row]
                          scale = absmax(row) / FP8_MAX (448 / 57344); code = the
                          nearest fp8 value of w / scale, saturating
    int8                  w ~= q * scale[row], q in [-127, 127], scale = absmax(row) / 127
    int4 symmetric        w ~= (c - 8) * scale[row, g], c in [0, 15] (q = c - 8 in
                          [-8, 7]), scale = absmax(group) / 7
    int4 asymmetric       w ~= (c - zero[row, g]) * scale[row, g], c in [0, 15],
                          scale = (max - min) / 15, zero = rint(-min / scale) in [0, 15]

A row or group of zeros gets scale 1 (all codes 0 / zero point 0 -> exact zeros).
Scales of int4 are stored as float16: dequantisation uses the float16 value, and
quantisation divides by it too, so that codes and scales agree exactly.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

ENCODINGS = ("f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
FP8_MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


# ------------------------------------------------------------------------------ fp8

def _fp8_table(kind: str) -> np.ndarray:
    """The float32 value of every fp8 code (NaN codes included)."""
    exp_bits, man_bits, bias = (4, 3, 7) if kind == "fp8_e4m3" else (5, 2, 15)
    out = np.zeros(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if kind == "fp8_e4m3" and e == 15 and m == 7:
            out[code] = np.nan  # e4m3fn: only S.1111.111 is NaN, no infinities
        elif kind == "fp8_e5m2" and e == 31:
            out[code] = np.nan if m else sign * np.inf
        elif e == 0:
            out[code] = sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
        else:
            out[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


FP8_TABLES = {k: _fp8_table(k) for k in FP8_MAX}


def fp8_encode(x: np.ndarray, kind: str) -> np.ndarray:
    """Nearest fp8 code of each float32 (ties to the even code), saturating at +-max."""
    table = FP8_TABLES[kind]
    finite = np.where(np.isfinite(table) & (np.arange(256) < 128), table, np.inf)
    pos = np.sort(np.unique(finite[np.isfinite(finite)]))  # non-negative values, ascending
    codes_of = {float(v): int(np.where(table == v)[0][0]) for v in pos}
    a = np.minimum(np.abs(x.astype(np.float32)), pos[-1])
    idx = np.searchsorted(pos, a)  # first value >= a
    idx = np.clip(idx, 1, len(pos) - 1)
    lo, hi = pos[idx - 1], pos[idx]
    choose_hi = (hi - a < a - lo) | ((hi - a == a - lo) & (np.vectorize(lambda v: codes_of[float(v)] & 1)(hi) == 0))
    val = np.where(a <= pos[0], pos[0], np.where(choose_hi, hi, lo))
    code = np.vectorize(lambda v: codes_of[float(v)])(val).astype(np.uint8)
    return np.where((x < 0) & (val > 0), code | 0x80, code).astype(np.uint8)


# ------------------------------------------------------------------------------ quantise

def as_matrix(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float32)
    return w.reshape(w.shape[0], -1)


def quantize(w: np.ndarray, encoding: str, group: int = 0, symmetric: bool = True) -> Dict[str, np.ndarray]:
    """-> {"codes", "scales"[, "zeros"]} in storage dtypes (see module docstring)."""
    m = as_matrix(w)
    rows, cols = m.shape
    if encoding in FP8_MAX:
        absmax = np.abs(m).max(axis=1)
        scale = np.where(absmax > 0, absmax / np.float32(FP8_MAX[encoding]), 1.0).astype(np.float32)
        codes = fp8_encode((m / scale[:, None]).astype(np.float32), encoding)
        return {"codes": codes, "scales": scale}
    if encoding == "int8":
        absmax = np.abs(m).max(axis=1)
        scale = np.where(absmax > 0, absmax / np.float32(127), 1.0).astype(np.float32)
        q = np.clip(np.rint(m / scale[:, None]), -127, 127).astype(np.int8)
        return {"codes": q, "scales": scale}
    if encoding == "int4":
        if group <= 0 or cols % group:
            raise ValueError(f"int4 needs cols ({cols}) divisible by the group size ({group})")
        g = m.reshape(rows, cols // group, group)
        if symmetric:
            absmax = np.abs(g).max(axis=2)
            scale = np.where(absmax > 0, absmax / np.float32(7), 1.0).astype(np.float16)
            s = scale.astype(np.float32)[..., None]
            c = (np.clip(np.rint(g / s), -8, 7) + 8).astype(np.uint8)
            return {"codes": c.reshape(rows, cols), "scales": scale}
        lo, hi = g.min(axis=2), g.max(axis=2)
        scale = np.where(hi > lo, (hi - lo) / np.float32(15), 1.0).astype(np.float16)
        s = scale.astype(np.float32)
        zero = np.clip(np.rint(-lo / s), 0, 15).astype(np.uint8)
        c = np.clip(np.rint(g / s[..., None]) + zero[..., None], 0, 15).astype(np.uint8)
        return {"codes": c.reshape(rows, cols), "scales": scale, "zeros": zero}
    raise ValueError(f"{encoding} is not a quantised encoding")


def dequantize(q: Dict[str, np.ndarray], encoding: str, shape: Tuple[int, ...], group: int = 0,
               symmetric: bool = True) -> np.ndarray:
    rows = shape[0]
    cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if encoding in FP8_MAX:
        vals = FP8_TABLES[encoding][q["codes"].reshape(rows, cols)]
        return (vals * q["scales"][:, None]).astype(np.float32).reshape(shape)
    if encoding == "int8":
        return (q["codes"].astype(np.float32) * q["scales"][:, None]).reshape(shape)
    if encoding == "int4":
        c = q["codes"].reshape(rows, cols // group, group).astype(np.float32)
        s = q["scales"].astype(np.float32)[..., None]
        z = (np.float32(8) if symmetric else q["zeros"].astype(np.float32)[..., None])
        return ((c - z) * s).astype(np.float32).reshape(shape)
    raise ValueError(encoding)


def to_bytes(q: Dict[str, np.ndarray], encoding: str) -> bytes:
    """The storage bytes of a quantised tensor (codes, scales, zeros)."""
    if encoding == "int4":
        c = q["codes"].reshape(-1)
        packed = (c[0::2] & 0xF) | ((c[1::2] & 0xF) << 4)
        out = packed.astype(np.uint8).tobytes() + q["scales"].astype("<f2").tobytes()
        if "zeros" in q:
            out += q["zeros"].astype(np.uint8).tobytes()
        return out
    return q["codes"].tobytes() + q["scales"].astype("<f4").tobytes()


def _panels(rows: int):
    """(first, height) of each panel of 16 rows, the last holding the rows left over."""
    return [(first, min(16, rows - first)) for first in range(0, rows, 16)]


def to_packed_bytes(q: Dict[str, np.ndarray], encoding: str, layout: str) -> bytes:
    """The storage bytes of a quantised tensor in a packed layout (docs/precision.md,
    "Packed layouts"; formats/encoding.h RepackLayout is the C++ definition):

    int8_p16k4  int8: per panel of 16 rows, per step of 4 columns, each row's 4 codes;
                the f32 row scales after, in row order
    int4_p16k8  symmetric int4: per panel, per step of 8 columns, each row's 4 bytes,
                byte i = column 8s + i (low nibble) | column 8s + 4 + i (high); then
                the f16 scales, per panel, per group, the panel's rows
    panel16     fp8: per panel, per column, the panel's codes; the f32 row scales after
    row_major   to_bytes()
    """
    if layout == "row_major":
        return to_bytes(q, encoding)
    codes = q["codes"]
    rows, cols = codes.shape
    out = []
    if layout == "int8_p16k4" and encoding == "int8":
        for first, h in _panels(rows):
            out.append(codes[first:first + h].reshape(h, cols // 4, 4).transpose(1, 0, 2).tobytes())
        return b"".join(out) + q["scales"].astype("<f4").tobytes()
    if layout == "int4_p16k8" and encoding == "int4" and "zeros" not in q:
        for first, h in _panels(rows):
            c = codes[first:first + h].reshape(h, cols // 8, 8)
            words = (c[:, :, :4] & 0xF) | ((c[:, :, 4:] & 0xF) << 4)
            out.append(words.astype(np.uint8).transpose(1, 0, 2).tobytes())
        scales = q["scales"]
        for first, h in _panels(rows):
            out.append(np.ascontiguousarray(scales[first:first + h].T).astype("<f2").tobytes())
        return b"".join(out)
    if layout == "panel16" and encoding in FP8_MAX:
        for first, h in _panels(rows):
            out.append(np.ascontiguousarray(codes[first:first + h].T).tobytes())
        return b"".join(out) + q["scales"].astype("<f4").tobytes()
    raise ValueError(f"{encoding} cannot be stored {layout}")


def storage_bytes(shape: Tuple[int, ...], encoding: str, group: int = 0, symmetric: bool = True) -> int:
    rows = shape[0]
    cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    n = rows * cols
    if encoding == "f32":
        return 4 * n
    if encoding in ("f16", "bf16"):
        return 2 * n
    if encoding in FP8_MAX or encoding == "int8":
        return n + 4 * rows
    if encoding == "int4":
        groups = rows * (cols // group)
        return n // 2 + 2 * groups + (0 if symmetric else groups)
    raise ValueError(encoding)


def quantize_activations_int8(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token (per-row) symmetric int8 of activations [T, K]:
    q = rint(x / s) with s = absmax(row) / 127 (1 for an all-zero row)."""
    x = np.asarray(x, dtype=np.float32)
    absmax = np.abs(x).max(axis=1)
    s = np.where(absmax > 0, absmax / np.float32(127), 1.0).astype(np.float32)
    return np.clip(np.rint(x / s[:, None]), -127, 127).astype(np.int8), s
