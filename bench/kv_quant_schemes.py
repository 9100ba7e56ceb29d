#!/usr/bin/env python3
"""Which int4/int8 KV-cache scheme: the runtime's (per token) or KIVI's (keys per channel)?

Both run in the PyTorch reference of a checkpoint (the demo by default), in a decoder
whose attention quantises its keys and values as a streaming cache would hold them:

  per-token   the runtime's scheme (formats/kv_codec.h): every position's keys and values
              get one symmetric scale per group of 32 channels (x = code x scale, scale =
              max|x| / 7 for int4, / 127 for int8), written as the position arrives.
  kivi        KIVI (Liu et al., 2024): keys get one scale and zero point per channel over
              each group of 32 positions (asymmetric min/max), values one per group of 32
              channels of a position; the positions of the group being filled stay at full
              precision until it is complete. Exact streaming: the query at position t sees
              the complete groups before it quantised and the rest of its own group not.
  per-token-residual  the per-token scheme with KIVI's full-precision group being filled:
              what the residual alone is worth.
  kivi-symmetric  KIVI with one symmetric scale per channel (max|x| / 7 or / 127, no zero
              point): what the runtime does since schema 1.8 (formats/kv_codec.h spans).
  per-token-asym-residual, per-token-signed-max-residual, per-token-signed-max  other
              per-position scales (asymmetric min/max; ggml q4_0's signed maximum using
              all 16 codes), with and without the residual, for comparison.

Measured: the mean KL divergence of every next-token distribution from the unquantised
model's, over held-out text windows (docs/*.md and README.md, as bench/kv_cache.py
quality), and the top-1 agreement. JSON on stdout.

  /usr/bin/python3 bench/kv_quant_schemes.py [--checkpoint DIR] [--tokens 240] [--prompts 12]
      [--schemes kivi:4,per-token:4,...]
"""

import argparse
import glob
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

from kiln_models import llama  # noqa: E402
from kiln_models.common import apply_rotary, repeat_kv  # noqa: E402
from kiln_models.registry import load_checkpoint  # noqa: E402
from kiln_models.tokenizer import ByteLevelBPE  # noqa: E402

GROUP = 32


def per_token(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [B, H, T, D]: one symmetric scale per GROUP channels of each position."""
    b, h, t, d = x.shape
    g = GROUP if d % GROUP == 0 else d
    xs = x.reshape(b, h, t, d // g, g)
    qmax = 2 ** (bits - 1) - 1
    scale = xs.abs().amax(-1, keepdim=True) / qmax
    codes = torch.where(scale > 0, torch.round(xs / torch.where(scale > 0, scale, torch.ones_like(scale))),
                        torch.zeros_like(xs)).clamp(-qmax, qmax)
    return (codes * scale).reshape(b, h, t, d)


def per_token_asym(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [B, H, T, D]: one asymmetric scale and minimum per GROUP channels of each
    position (2^bits levels from min to max)."""
    b, h, t, d = x.shape
    g = GROUP if d % GROUP == 0 else d
    xs = x.reshape(b, h, t, d // g, g)
    lo, hi = xs.amin(-1, keepdim=True), xs.amax(-1, keepdim=True)
    levels = 2 ** bits - 1
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((xs - lo) / safe).clamp(0, levels)
    return torch.where(scale > 0, codes * scale + lo, xs).reshape(b, h, t, d)


def per_token_signed_max(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [B, H, T, D]: one symmetric scale per GROUP channels of each position, the
    element of largest magnitude mapped to the most negative code (-2^(bits-1)) so all
    2^bits codes are used (ggml's q4_0 rule)."""
    b, h, t, d = x.shape
    g = GROUP if d % GROUP == 0 else d
    xs = x.reshape(b, h, t, d // g, g)
    idx = xs.abs().argmax(-1, keepdim=True)
    mx = torch.gather(xs, -1, idx)
    lo = -(2 ** (bits - 1))
    scale = mx / lo
    safe = torch.where(scale != 0, scale, torch.ones_like(scale))
    codes = torch.where(scale != 0, torch.round(xs / safe), torch.zeros_like(xs)).clamp(lo, -lo - 1)
    return (codes * scale).reshape(b, h, t, d)


def per_channel_symmetric(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [B, H, T, D]: complete groups of GROUP positions, one symmetric scale per channel
    each (max|x| / (2^(bits-1) - 1)); the rest unchanged."""
    b, h, t, d = x.shape
    full = t // GROUP * GROUP
    out = x.clone()
    if full:
        xs = x[:, :, :full].reshape(b, h, full // GROUP, GROUP, d)
        qmax = 2 ** (bits - 1) - 1
        scale = xs.abs().amax(3, keepdim=True) / qmax
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round(xs / safe).clamp(-qmax, qmax)
        out[:, :, :full] = (codes * scale).reshape(b, h, full, d)
    return out


def per_channel(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [B, H, T, D]: complete groups of GROUP positions, one asymmetric scale per channel
    each; the rest (the group being filled) unchanged."""
    b, h, t, d = x.shape
    full = t // GROUP * GROUP
    out = x.clone()
    if full:
        xs = x[:, :, :full].reshape(b, h, full // GROUP, GROUP, d)
        lo, hi = xs.amin(3, keepdim=True), xs.amax(3, keepdim=True)
        levels = 2 ** bits - 1
        scale = (hi - lo) / levels
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round((xs - lo) / safe).clamp(0, levels)
        out[:, :, :full] = torch.where(scale > 0, codes * scale + lo, xs).reshape(b, h, full, d)
    return out


def kivi_attention(q, k, v, mask, scaling, bits, keys=per_channel, values=per_token):
    """softmax(q k^T) v where the query at t reads keys and values of complete groups
    (positions < GROUP * floor((t + 1) / GROUP)) quantised, the others at full precision."""
    t = q.shape[2]
    full = t // GROUP * GROUP
    kq = k.clone()
    if full:
        kq[:, :, :full] = keys(k[:, :, :full], bits)
    vq = v.clone()
    if full:
        vq[:, :, :full] = values(v[:, :, :full], bits)
    pos = torch.arange(t)
    quantised = pos[None, :] < (GROUP * ((pos[:, None] + 1) // GROUP))  # [t, t]: key j quantised for query t
    scores = torch.where(quantised, q @ kq.transpose(2, 3), q @ k.transpose(2, 3)) * scaling
    if mask is not None:
        scores = scores + mask
    p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return (p * quantised) @ vq + (p * ~quantised) @ v


SCHEME = {"name": "f32", "bits": 0}
# Schemes that quantise every position as it arrives.
STREAMING = {"per-token": per_token, "per-token-signed-max": per_token_signed_max}
# Schemes that keep the group being filled at full precision: their keys' and values'
# quantisers.
RESIDUAL = {
    "kivi": (per_channel, per_token),
    "kivi-symmetric": (per_channel_symmetric, per_token),
    "per-token-residual": (per_token, per_token),
    "per-token-asym-residual": (per_token_asym, per_token_asym),
    "per-token-signed-max-residual": (per_token_signed_max, per_token_signed_max),
}


def forward(self, x, cos, sin, mask):
    b, t, _ = x.shape
    q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
    k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
    v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
    q, k = apply_rotary(q, k, cos, sin)
    n_rep = self.num_heads // self.num_kv_heads
    name, bits = SCHEME["name"], SCHEME["bits"]
    if name in STREAMING:
        k, v = STREAMING[name](k, bits), STREAMING[name](v, bits)
    if name in RESIDUAL:
        keys, values = RESIDUAL[name]
        out = kivi_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, self.scaling, bits, keys, values)
    else:
        out = llama.eager_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, self.scaling)
    out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
    return self.o_proj(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=os.path.join(ROOT, "tests", "models", "shapes", "checkpoints", "dense"))
    ap.add_argument("--tokens", type=int, default=240, help="tokens per window (below the model's positions)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--schemes", help="comma-separated NAME:BITS (default: all)")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model, _ = load_checkpoint(a.checkpoint)
    model.eval()
    llama.LlamaAttention.forward = forward
    tok = ByteLevelBPE.load(a.checkpoint)
    text = "\n\n".join(open(f, encoding="utf-8").read()
                       for f in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")])
    ids = tok.encode(text[:200000])
    windows = [ids[i * a.tokens:(i + 1) * a.tokens] for i in range(a.prompts)]
    windows = [w for w in windows if len(w) == a.tokens]
    logp = {}
    schemes = [("f32", 0), ("per-token", 8), ("kivi", 8), ("per-token", 4), ("per-token-signed-max", 4),
               ("per-token-residual", 4), ("per-token-asym-residual", 4), ("per-token-signed-max-residual", 4), ("kivi-symmetric", 4), ("kivi", 4), ("kivi", 2)]
    if a.schemes:
        schemes = [("f32", 0)] + [(n, int(b)) for n, b in (x.split(":") for x in a.schemes.split(","))]
    with torch.no_grad():
        for name, bits in schemes:
            SCHEME.update(name=name, bits=bits)
            out = []
            for w in windows:
                logits = model(torch.tensor([w])).float()[0]
                out.append(torch.log_softmax(logits.double(), -1))
            logp[(name, bits)] = out
    res = {"checkpoint": os.path.relpath(a.checkpoint, ROOT), "tokens_per_window": a.tokens,
           "windows": len(windows), "group": GROUP, "schemes": []}
    for name, bits in schemes[1:]:
        kls, agree = [], []
        for ref, got in zip(logp[("f32", 0)], logp[(name, bits)]):
            kls.append(float((ref.exp() * (ref - got)).sum(-1).mean()))
            agree.append(float((ref.argmax(-1) == got.argmax(-1)).double().mean()))
        res["schemes"].append({"scheme": name, "bits": bits, "mean_kl": sum(kls) / len(kls), "max_window_kl": max(kls),
                               "top1_agreement": sum(agree) / len(agree)})
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
