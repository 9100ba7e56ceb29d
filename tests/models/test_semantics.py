"""Spot checks of transformers semantics against hand computations: rotary embeddings (default and
llama3 scaling), rotate_half, RMSNorm, GQA, causality, Mixtral routing, pixel shuffle, Idefics3
position ids, activations."""

import math

import numpy as np
import pytest
import torch

from kiln_models.common import (ACTIVATIONS, RMSNorm, RotaryEmbedding, apply_rotary, compute_inv_freq,
                                repeat_kv, rotate_half)
from kiln_models.idefics3 import pixel_shuffle
from kiln_models.llama import DecoderConfig, LlamaForCausalLM
from kiln_models.llama import Qwen2ForCausalLM
from kiln_models.mixtral import MixtralForCausalLM, MixtralSparseMoeBlock
from kiln_models.presets import get_preset
from kiln_models.siglip import idefics3_position_ids


def test_default_rope_frequencies():
    inv = compute_inv_freq(10000.0, 8)
    expect = [1.0 / 10000.0 ** (i / 8) for i in (0, 2, 4, 6)]
    np.testing.assert_allclose(inv.numpy(), expect, rtol=1e-6)


def test_llama3_rope_scaling_by_hand():
    # Llama-3.2 values; head_dim 64, theta 500000
    factor, low, high, old = 32.0, 1.0, 4.0, 8192
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
               "original_max_position_embeddings": old}
    got = compute_inv_freq(500000.0, 64, scaling).double().numpy()
    low_wavelen, high_wavelen = old / low, old / high
    kinds = set()
    for i, f in enumerate(got):
        base = float(np.float32(1.0 / np.float32(500000.0 ** (2 * i / 64))))
        wavelen = 2 * math.pi / base
        if wavelen < high_wavelen:
            expect, kind = base, "high"          # high frequency: unchanged
        elif wavelen > low_wavelen:
            expect, kind = base / factor, "low"  # low frequency: divided by factor
        else:                                    # in between: smooth interpolation
            smooth = (old / wavelen - low) / (high - low)
            expect, kind = (1 - smooth) * base / factor + smooth * base, "mid"
        kinds.add(kind)
        assert f == pytest.approx(expect, rel=2e-6), (i, kind)
    assert kinds == {"high", "mid", "low"}  # all three branches exercised
    # "type" is accepted as the legacy spelling of "rope_type"
    legacy = dict(scaling)
    legacy["type"] = legacy.pop("rope_type")
    assert torch.equal(compute_inv_freq(500000.0, 64, legacy), torch.from_numpy(got).float())
    assert torch.equal(compute_inv_freq(10.0, 8, {"rope_type": "linear", "factor": 2.0}),
                       compute_inv_freq(10.0, 8) / 2.0)


def test_rotate_half_and_rotary_as_complex_rotation():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]
    d, t = 8, 5
    rot = RotaryEmbedding(100.0, d)
    cos, sin = rot(torch.arange(t)[None])
    q = torch.randn(1, 1, t, d, dtype=torch.float32)
    k = torch.randn(1, 1, t, d)
    q2, _ = apply_rotary(q, k, cos, sin)
    # pairs (i, i + d/2) rotate by angle pos * inv_freq[i]
    inv = rot.inv_freq.double()
    for pos in range(t):
        z = torch.complex(q[0, 0, pos, : d // 2].double(), q[0, 0, pos, d // 2:].double())
        zr = z * torch.exp(1j * pos * inv)
        torch.testing.assert_close(q2[0, 0, pos, : d // 2].double(), zr.real, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(q2[0, 0, pos, d // 2:].double(), zr.imag, rtol=1e-5, atol=1e-5)
    # q.k depends only on the relative position
    qa, ka = apply_rotary(q[:, :, :1].expand(1, 1, t, d), k[:, :, :1].expand(1, 1, t, d), cos, sin)
    dots = [float(qa[0, 0, i] @ ka[0, 0, j]) for i, j in [(1, 0), (2, 1), (4, 3)]]
    assert max(dots) - min(dots) < 1e-4


def test_rmsnorm_by_hand():
    norm = RMSNorm(4, eps=1e-2)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
    x = torch.tensor([[3.0, -1.0, 0.5, 2.0]])
    ms = (9 + 1 + 0.25 + 4) / 4
    expect = [v / math.sqrt(ms + 1e-2) * w for v, w in zip([3.0, -1.0, 0.5, 2.0], [1.0, 2.0, 0.5, -1.0])]
    np.testing.assert_allclose(norm(x)[0].detach().numpy(), expect, rtol=1e-6)
    # low-precision input: statistics in fp32, cast back to the input dtype, then times weight
    xb = torch.randn(3, 4).to(torch.bfloat16)
    xf = xb.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-2)).to(torch.bfloat16)
    assert torch.equal(norm(xb).detach(), norm.weight.detach() * normed)


def test_repeat_kv_head_mapping():
    kv = torch.arange(2 * 3).float().reshape(1, 2, 3, 1)
    out = repeat_kv(kv, 3)
    assert out.shape == (1, 6, 3, 1)
    for h in range(6):
        assert torch.equal(out[0, h], kv[0, h // 3])  # head h reads kv head h // n_rep


def test_gqa_equals_mha_with_duplicated_kv_heads():
    torch.manual_seed(0)
    base = get_preset("tiny-llama").config
    gqa = LlamaForCausalLM(base).eval()
    mha = LlamaForCausalLM(dict(base, num_key_value_heads=4)).eval()
    state = gqa.state_dict()
    d = 16
    for name, w in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = w.reshape(2, d, -1)
            state[name] = heads.repeat_interleave(2, dim=0).reshape(4 * d, -1)
    mha.load_state_dict(state)
    ids = torch.randint(0, 480, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids), mha(ids), rtol=1e-5, atol=1e-5)


def test_causality():
    torch.manual_seed(1)
    model = LlamaForCausalLM(get_preset("tiny-llama").config).eval()
    ids = torch.randint(0, 480, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 7) % 480
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.equal(a[0, :5], b[0, :5])
    assert not torch.allclose(a[0, 5:], b[0, 5:])


def slow_moe(block: MixtralSparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """One token at a time, in float64, from the definition."""
    out = torch.zeros_like(x, dtype=torch.float64)
    gate = block.gate.weight.double()
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            h = x[b, t].double()
            logits = gate @ h
            probs = torch.exp(logits - logits.max())
            probs = probs / probs.sum()
            order = sorted(range(len(probs)), key=lambda e: -float(probs[e]))[: block.top_k]
            total = sum(float(probs[e]) for e in order)
            for e in order:
                ex = block.experts[e]
                w1, w2, w3 = ex.w1.weight.double(), ex.w2.weight.double(), ex.w3.weight.double()
                a = w1 @ h
                y = w2 @ ((a * torch.sigmoid(a)) * (w3 @ h))
                out[b, t] += float(probs[e]) / total * y
    return out


@pytest.mark.parametrize("experts,top_k", [(4, 2), (8, 2), (5, 3), (4, 1)])
def test_mixtral_routing_equals_per_token_loop(experts, top_k):
    torch.manual_seed(experts * 10 + top_k)
    cfg = DecoderConfig.from_dict(dict(get_preset("tiny-mixtral").config, num_local_experts=experts,
                                       num_experts_per_tok=top_k), model_type="mixtral")
    block = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        block.gate.weight.mul_(8.0)  # sharper routing: distinct experts per token
        x = torch.randn(2, 6, cfg.hidden_size)
        fast = block(x)
    torch.testing.assert_close(fast.double(), slow_moe(block, x), rtol=1e-4, atol=1e-5)
    assert block.last_selected_experts.shape == (12, top_k)
    assert len(set(block.last_selected_experts[:, 0].tolist())) > 1


def test_pixel_shuffle_index_formula():
    b, side, d, s = 2, 4, 3, 2
    x = torch.randn(b, side * side, d)
    out = pixel_shuffle(x, s)
    assert out.shape == (b, side * side // (s * s), d * s * s)
    w2 = side // s
    for r2 in range(side // s):
        for c2 in range(w2):
            for j in range(s):
                for k in range(s):
                    src = (r2 * s + j) * side + c2 * s + k
                    dst = slice((j * s + k) * d, (j * s + k + 1) * d)
                    assert torch.equal(out[:, r2 * w2 + c2, dst], x[:, src])


def test_idefics3_position_ids():
    assert torch.equal(idefics3_position_ids(8, 8, 8), torch.arange(64))
    # a 2x2-patch image on a 4-per-side grid uses buckets 0 and 2 on each axis
    assert idefics3_position_ids(2, 2, 4).tolist() == [0, 2, 8, 10]


def test_activations():
    x = torch.linspace(-4, 4, 41)
    torch.testing.assert_close(ACTIVATIONS["quick_gelu"](x), x * torch.sigmoid(1.702 * x))
    tanh_gelu = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    torch.testing.assert_close(ACTIVATIONS["gelu_pytorch_tanh"](x), tanh_gelu, rtol=1e-6, atol=1e-6)
    erf_gelu = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), erf_gelu)
    torch.testing.assert_close(ACTIVATIONS["silu"](x), x * torch.sigmoid(x))


@pytest.mark.parametrize("arch,extra", [
    (MixtralForCausalLM, {"sliding_window": 3}),
    (Qwen2ForCausalLM, {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0}),
])
def test_sliding_window_attention(arch, extra):
    # one layer: position t sees tokens t-2..t only, so changing token 0 leaves positions >= 3 alone
    preset = "tiny-mixtral" if arch is MixtralForCausalLM else "tiny-qwen2"
    torch.manual_seed(2)
    model = arch(dict(get_preset(preset).config, num_hidden_layers=1, **extra)).eval()
    ids = torch.randint(3, 400, (1, 7))
    changed = ids.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 400
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert not torch.allclose(a[0, :3], b[0, :3])
    assert torch.equal(a[0, 3:], b[0, 3:])
    # Qwen2 layers below max_window_layers attend to everything
    if arch is Qwen2ForCausalLM:
        full = arch(dict(get_preset(preset).config, num_hidden_layers=1, **dict(extra, max_window_layers=1))).eval()
        full.load_state_dict(model.state_dict())
        with torch.no_grad():
            assert not torch.allclose(full(ids)[0, 3:], full(changed)[0, 3:])
