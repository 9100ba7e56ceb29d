#!/usr/bin/python3
"""Convert a Llama-architecture Hugging Face checkpoint (safetensors) to a GGUF v3 file for llama.cpp.

    /usr/bin/python3 bench/gguf.py CKPT_DIR OUT.gguf --type f32|f16|q8_0|q4_0

Written for the peer benchmarks (bench/README.md): it reads the layout tests/models/generate.py
writes (config.json, model.safetensors or shards + index, tokenizer.json with a byte-level BPE
model) through tests/models/kiln_models/safetensors_io.py and writes what llama.cpp's `llama`
architecture loader expects. Our own code; the reference for the file format and the conventions is
llama.cpp's gguf-py (gguf/constants.py, gguf/gguf_writer.py, gguf/quants.py) and
convert_hf_to_gguf.py (class LlamaModel) in github.com/ggml-org/llama.cpp.

File layout (gguf-py / ggml/include/gguf.h, version 3, little-endian):

    "GGUF" u32 version=3  u64 n_tensors  u64 n_kv
    n_kv x   (string key, u32 value type, value)             string = u64 length + UTF-8 bytes
    n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
    padding to general.alignment (32), then the tensor data, each tensor padded to 32

ne[] is in ggml order (innermost first), i.e. the reversed numpy shape: a torch Linear weight
[out, in] becomes ne = [in, out].

Conventions copied (as behaviour) from convert_hf_to_gguf.py's LlamaModel:
  * q_proj / k_proj weights (and biases) are permuted from Hugging Face's rotate-half rotary layout
    to GGML's interleaved (NORM) rope layout: per head, rows [0..d/2) and [d/2..d) are interleaved.
    k uses num_key_value_heads.
  * rope_scaling type llama3 is not a GGUF key: a `rope_freqs.weight` F32 tensor [head_dim/2] holds
    the per-frequency divisors (1, factor, or the smooth interpolation); type linear is written as
    rope.scaling.type/factor.
  * 1-D tensors (norms, biases, rope_freqs) stay F32 in every file type.
  * Tied embeddings: no `output.weight`; llama.cpp then reuses token_embd.

Block encodings (ggml-quants.c, quantize_row_q8_0_ref / quantize_row_q4_0_ref):
  Q8_0  32 weights: f16 d = max|x| / 127, int8 q = roundf(x / d)                 (34 bytes)
  Q4_0  32 weights: f16 d = m / -8 where m is the signed value of largest |x|,
        q = min(15, (int8)(x / d + 8.5)), byte j = q[j] | q[j + 16] << 4       (18 bytes)
A 2-D tensor whose row length is not a multiple of 32 cannot use those blocks; it is written F16
instead (and reported on stderr), as llama-quantize also falls back for incompatible rows.

Tokenizer: "gpt2" (byte-level BPE) from tokenizer.json: tokens by id (added tokens included, holes
and ids up to the model's vocab_size filled with "[PAD<id>]", type UNUSED), token types (NORMAL 1,
CONTROL 3 for special added tokens, USER_DEFINED 4 for other added tokens), merges as "a b",
bos / eos / unk / pad ids and add_bos_token from tokenizer_config.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))

from kiln_models.safetensors_io import Checkpoint  # noqa: E402

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf value types (gguf-py GGUFValueType)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

# ggml tensor types (ggml.h enum ggml_type) and their block geometry (block size, bytes per block)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
GGML_BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34)}
GGML_NAMES = {GGML_F32: "F32", GGML_F16: "F16", GGML_Q4_0: "Q4_0", GGML_Q8_0: "Q8_0"}

# llama_ftype (general.file_type) of each --type
FILE_TYPES = {"f32": (0, GGML_F32), "f16": (1, GGML_F16), "q4_0": (2, GGML_Q4_0), "q8_0": (7, GGML_Q8_0)}

# tokenizer token types (llama.cpp llama_token_type / gguf-py TokenType)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


# ------------------------------------------------------------------------------------------------
# block encodings
# ------------------------------------------------------------------------------------------------

def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % 32:
        raise ValueError(f"row length {x.shape[-1]} is not a multiple of 32")
    return x.reshape(-1, 32)


def quantize_q8_0(x: np.ndarray) -> bytes:
    """ggml quantize_row_q8_0_ref: per 32 weights, f16 scale + 32 int8."""
    b = _blocks(x)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float32).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)  # roundf: half away from zero
    out = np.empty((b.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quantize_q4_0(x: np.ndarray) -> bytes:
    """ggml quantize_row_q4_0_ref: per 32 weights, f16 scale + 16 bytes of 4-bit codes (+8 offset)."""
    b = _blocks(x)
    idx = np.abs(b).argmax(axis=1)  # first index of the largest |x|, like the strict '<' scan in C
    mx = b[np.arange(b.shape[0]), idx]
    d = (mx / np.float32(-8.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float32) + np.float32(8.5)
    q = np.minimum(15, np.trunc(v).astype(np.int32)).astype(np.uint8)  # (int8_t) cast truncates
    out = np.empty((b.shape[0], 18), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def dequantize(data: bytes, ggml_type: int, shape: Tuple[int, ...]) -> np.ndarray:
    """Inverse of the encodings above (ggml dequantize_row_*), for checks."""
    n = math.prod(shape)
    if ggml_type == GGML_F32:
        return np.frombuffer(data, dtype="<f4", count=n).reshape(shape).copy()
    if ggml_type == GGML_F16:
        return np.frombuffer(data, dtype="<f2", count=n).astype(np.float32).reshape(shape)
    blk = np.frombuffer(data, dtype=np.uint8).reshape(-1, GGML_BLOCK[ggml_type][1])
    d = blk[:, :2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    if ggml_type == GGML_Q8_0:
        q = blk[:, 2:].view(np.int8).astype(np.float32)
    elif ggml_type == GGML_Q4_0:
        qs = blk[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
    else:
        raise ValueError(f"unknown ggml type {ggml_type}")
    return (q * d).astype(np.float32).reshape(shape)


def encode(x: np.ndarray, ggml_type: int) -> bytes:
    if ggml_type == GGML_F32:
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if ggml_type == GGML_F16:
        return np.ascontiguousarray(x, dtype="<f2").tobytes()
    if ggml_type == GGML_Q8_0:
        return quantize_q8_0(x)
    if ggml_type == GGML_Q4_0:
        return quantize_q4_0(x)
    raise ValueError(f"unknown ggml type {ggml_type}")


def nbytes_of(shape: Tuple[int, ...], ggml_type: int) -> int:
    bs, bb = GGML_BLOCK[ggml_type]
    return math.prod(shape) // bs * bb


def tensor_type_for(shape: Tuple[int, ...], wanted: int) -> int:
    """The ggml type one tensor gets in a file of type `wanted` (convert_hf_to_gguf rules)."""
    if len(shape) == 1:
        return GGML_F32
    if wanted in (GGML_Q8_0, GGML_Q4_0) and shape[-1] % 32:
        return GGML_F16
    return wanted


# ------------------------------------------------------------------------------------------------
# Llama specifics
# ------------------------------------------------------------------------------------------------

def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half -> GGML interleaved rows (convert_hf_to_gguf.py LlamaModel.permute).

    Per head the d output rows [x0..x(d/2-1), y0..y(d/2-1)] become [x0, y0, x1, y1, ...].
    Works for weights [n_head*d, in] and biases [n_head*d].
    """
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def llama3_rope_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """rope_freqs for rope_type llama3 (convert_hf_to_gguf.py LlamaModel.generate_extra_tensors):
    llama.cpp divides each base frequency by this factor."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> Optional[str]:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if len(parts) >= 5 and parts[0] == "model" and parts[1] == "layers":
        i, mod, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
        if mod in HF_TO_GGUF:
            return f"blk.{i}.{HF_TO_GGUF[mod]}.{kind}"
    if hf.endswith("rotary_emb.inv_freq"):
        return None  # legacy buffer
    raise ValueError(f"no GGUF name for tensor {hf!r}")


# ------------------------------------------------------------------------------------------------
# GGUF writer
# ------------------------------------------------------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def _value(vtype: int, v) -> bytes:
    if vtype == STRING:
        return _str(v)
    return struct.pack(_SCALAR[vtype], v)


class KV:
    def __init__(self):
        self.items: List[Tuple[str, int, object, Optional[int]]] = []

    def add(self, key: str, vtype: int, value, item_type: Optional[int] = None):
        self.items.append((key, vtype, value, item_type))

    def encode(self) -> bytes:
        out = bytearray()
        for key, vtype, value, item_type in self.items:
            out += _str(key) + struct.pack("<I", vtype)
            if vtype == ARRAY:
                out += struct.pack("<IQ", item_type, len(value))
                if item_type == STRING:
                    for s in value:
                        out += _str(s)
                else:
                    out += np.asarray(value, dtype=_SCALAR[item_type]).tobytes()
            else:
                out += _value(vtype, value)
        return bytes(out)


def _pad(n: int) -> int:
    return (-n) % ALIGNMENT


def tokenizer_kv(kv: KV, ckpt: str, vocab_size: int, config: dict) -> dict:
    with open(os.path.join(ckpt, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{ckpt}/tokenizer.json: model type {model.get('type')!r}, only BPE (byte-level) is supported")
    tokens: Dict[int, Tuple[str, int]] = {i: (t, TOKEN_NORMAL) for t, i in model["vocab"].items()}
    for at in tj.get("added_tokens", []):
        tokens[at["id"]] = (at["content"], TOKEN_CONTROL if at.get("special") else TOKEN_USER_DEFINED)
    n = max(vocab_size, max(tokens) + 1)
    if n != vocab_size:
        raise ValueError(f"tokenizer id {max(tokens)} does not fit vocab_size {vocab_size}")
    names, types = [], []
    for i in range(n):
        t, ty = tokens.get(i, (f"[PAD{i}]", TOKEN_UNUSED))
        names.append(t)
        types.append(ty)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    tc = {}
    p = os.path.join(ckpt, "tokenizer_config.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            tc = json.load(f)
    ids = {t: i for i, t in enumerate(names)}

    def special_id(key):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v) if isinstance(v, str) else None

    # pre-tokenizer regex: Llama-3's split (tests/models "llama3" pretokenizer) or GPT-2's
    pre = "gpt-2"
    if "\\p{N}{1,3}" in json.dumps(tj.get("pre_tokenizer")):
        pre = "llama-bpe"
    kv.add("tokenizer.ggml.model", STRING, "gpt2")
    kv.add("tokenizer.ggml.pre", STRING, pre)
    kv.add("tokenizer.ggml.tokens", ARRAY, names, STRING)
    kv.add("tokenizer.ggml.token_type", ARRAY, types, INT32)
    kv.add("tokenizer.ggml.merges", ARRAY, merges, STRING)
    bos = special_id("bos_token")
    eos = special_id("eos_token")
    if bos is None and isinstance(config.get("bos_token_id"), int):
        bos = config["bos_token_id"]
    if eos is None:
        e = config.get("eos_token_id")
        eos = e if isinstance(e, int) else (e[0] if isinstance(e, list) and e else None)
    for key, val in (("bos", bos), ("eos", eos), ("unknown", special_id("unk_token")),
                     ("padding", special_id("pad_token"))):
        if val is not None:
            kv.add(f"tokenizer.ggml.{key}_token_id", UINT32, int(val))
    kv.add("tokenizer.ggml.add_bos_token", BOOL, bool(tc.get("add_bos_token", False)))
    kv.add("tokenizer.ggml.add_eos_token", BOOL, bool(tc.get("add_eos_token", False)))
    return {"tokens": n, "merges": len(merges), "pre": pre, "bos": bos, "eos": eos}


def convert(ckpt: str, out: str, ftype: str = "f32", quiet: bool = False) -> dict:
    with open(os.path.join(ckpt, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") != "llama":
        raise ValueError(f"{ckpt}: model_type {config.get('model_type')!r}; this converter handles llama only")
    file_type, wanted = FILE_TYPES[ftype]
    hidden = int(config["hidden_size"])
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = int(config.get("head_dim") or hidden // n_head)
    vocab = int(config["vocab_size"])
    theta = float(config.get("rope_theta", 10000.0))
    scaling = config.get("rope_scaling")
    rope_type = None if not scaling else scaling.get("rope_type", scaling.get("type"))
    if rope_type not in (None, "default", "linear", "llama3"):
        raise ValueError(f"rope_scaling type {rope_type!r} not supported")

    kv = KV()
    arch = "llama"
    kv.add("general.architecture", STRING, arch)
    kv.add("general.name", STRING, os.path.basename(os.path.normpath(ckpt)))
    kv.add("general.file_type", UINT32, file_type)
    kv.add("general.quantization_version", UINT32, 2)
    kv.add("general.alignment", UINT32, ALIGNMENT)
    kv.add(f"{arch}.vocab_size", UINT32, vocab)
    kv.add(f"{arch}.context_length", UINT32, int(config.get("max_position_embeddings", 2048)))
    kv.add(f"{arch}.embedding_length", UINT32, hidden)
    kv.add(f"{arch}.block_count", UINT32, int(config["num_hidden_layers"]))
    kv.add(f"{arch}.feed_forward_length", UINT32, int(config["intermediate_size"]))
    kv.add(f"{arch}.attention.head_count", UINT32, n_head)
    kv.add(f"{arch}.attention.head_count_kv", UINT32, n_kv)
    kv.add(f"{arch}.attention.key_length", UINT32, head_dim)
    kv.add(f"{arch}.attention.value_length", UINT32, head_dim)
    kv.add(f"{arch}.rope.dimension_count", UINT32, head_dim)
    kv.add(f"{arch}.rope.freq_base", FLOAT32, theta)
    kv.add(f"{arch}.attention.layer_norm_rms_epsilon", FLOAT32, float(config.get("rms_norm_eps", 1e-6)))
    if rope_type == "linear":
        kv.add(f"{arch}.rope.scaling.type", STRING, "linear")
        kv.add(f"{arch}.rope.scaling.factor", FLOAT32, float(scaling["factor"]))
    tok = tokenizer_kv(kv, ckpt, vocab, config)

    ck = Checkpoint(ckpt)
    try:
        # (gguf name, hf name or None, shape in numpy order, ggml type)
        plan: List[Tuple[str, Optional[str], Tuple[int, ...], int]] = []
        if rope_type == "llama3":
            plan.append(("rope_freqs.weight", None, (head_dim // 2,), GGML_F32))
        for hf in ck.keys():
            name = gguf_name(hf)
            if name is None:
                continue
            shape = tuple(ck.info(hf).shape)
            plan.append((name, hf, shape, tensor_type_for(shape, wanted)))
        if config.get("tie_word_embeddings") and any(p[0] == "output.weight" for p in plan):
            plan = [p for p in plan if p[0] != "output.weight"]  # transformers re-ties it
        fallbacks = [p[0] for p in plan if len(p[2]) == 2 and p[3] != wanted]

        infos = bytearray()
        offset = 0
        offsets = []
        for name, _, shape, t in plan:
            infos += _str(name) + struct.pack("<I", len(shape))
            infos += b"".join(struct.pack("<Q", d) for d in reversed(shape))
            infos += struct.pack("<IQ", t, offset)
            offsets.append(offset)
            n = nbytes_of(shape, t)
            offset += n + _pad(n)

        header = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(plan), len(kv.items)) + kv.encode() + bytes(infos)
        tmp = out + ".tmp"
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(b"\0" * _pad(len(header)))
            for name, hf, shape, t in plan:
                if hf is None:
                    x = llama3_rope_factors(theta, head_dim, scaling)
                else:
                    x = ck.get_numpy(hf)  # F32 (BF16/F16 widened exactly)
                    if ".attn_q." in name:
                        x = permute_rope(x, n_head)
                    elif ".attn_k." in name:
                        x = permute_rope(x, n_kv)
                data = encode(x, t)
                assert len(data) == nbytes_of(shape, t), name
                f.write(data)
                f.write(b"\0" * _pad(len(data)))
        os.replace(tmp, out)
    finally:
        ck.close()
    summary = {"out": out, "type": ftype, "tensors": len(plan), "bytes": os.path.getsize(out),
               "types": {GGML_NAMES[t]: sum(1 for p in plan if p[3] == t) for t in sorted({p[3] for p in plan})},
               "f16_fallback": fallbacks, "tokenizer": tok}
    if not quiet:
        print(json.dumps(summary))
        if fallbacks:
            print(f"note: {len(fallbacks)} tensor(s) have rows not a multiple of 32 and are F16: "
                  f"{', '.join(fallbacks)}", file=sys.stderr)
    return summary


# ------------------------------------------------------------------------------------------------
# reader (for checks)
# ------------------------------------------------------------------------------------------------

def read_gguf(path: str) -> Tuple[dict, Dict[str, Tuple[int, Tuple[int, ...], bytes]]]:
    """-> (metadata dict, {tensor name: (ggml type, numpy shape, raw bytes)})."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == STRING:
            return string()
        if t == ARRAY:
            it, n = take("<I"), take("<Q")
            return [value(it) for _ in range(n)]
        return take(_SCALAR[t])

    assert buf[:4] == GGUF_MAGIC, "not a GGUF file"
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    meta = {"version": version}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        t, off = take("<I"), take("<Q")
        infos.append((name, t, tuple(reversed(ne)), off))
    align = meta.get("general.alignment", ALIGNMENT)
    base = pos + (-pos) % align
    tensors = {name: (t, shape, buf[base + off: base + off + nbytes_of(shape, t)]) for name, t, shape, off in infos}
    return meta, tensors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="Hugging Face checkpoint directory (model_type llama)")
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--type", default="f32", choices=sorted(FILE_TYPES), help="tensor type of 2-D weights")
    a = ap.parse_args(argv)
    convert(a.checkpoint, a.out, a.type)
    return 0


if __name__ == "__main__":
    sys.exit(main())
