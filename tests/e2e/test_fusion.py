"""Operator fusion (kiln-fuse-qkv, -gate-up, -activation, -residual, -norm) end to end.

For every supported layer kind (Llama, Qwen2 with Q/K/V biases, Mixtral's MoE, a
CLIP vision tower, a SigLIP one with the Idefics3 connector):
  - the fused artifact's outputs equal its --no-fuse twin's (fp32 within 1e-5 of the
    largest logit, W8A8 and W4A8 within 1e-3: the same kernels run the same products,
    only their order of dispatch and the buffers between them change) and the
    greedy tokens agree; the fp32 artifacts' agreement with PyTorch is
    test_reference_match.py's, which compiles with fusion on;
  - kiln-inspect counts at most 5 kernels per decoder layer (decode and prefill) and
    per vision encoder layer, fewer than unfused;
  - kiln-compile --remarks names every fusion made.
"""

import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import MODELS, run, tool

PRESETS = [
    ("tiny-llama", False),
    ("tiny-qwen2", False),
    ("tiny-mixtral", False),
    ("tiny-llava", True),
    ("tiny-idefics3", True),
]
ENCODINGS = [
    ("fp32", [], 1e-5),
    ("w8a8", ["--precision=.*layers.*=int8_a8"], 1e-3),
    ("w4a8", ["--precision=.*layers.*=int4_g32_a8"], 1e-3),
]
MAX_LAYER_KERNELS = 5


@pytest.fixture(scope="module")
def checkpoints(tiny_dir):
    """Each preset's checkpoint and its prompt as token ids (and pixels), from the
    PyTorch reference's processor (golden.py)."""
    rng = np.random.default_rng(3)
    photo = tiny_dir / "fusion-photo.png"
    Image.fromarray(rng.integers(0, 255, (40, 52, 3), dtype=np.uint8)).save(photo)
    out = {}
    for preset, vlm in PRESETS:
        ckpt = tiny_dir / f"fusion-{preset}"
        golden = tiny_dir / f"fusion-{preset}-golden"
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", ckpt])
        args = ["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ckpt, "--out", golden,
                "--prompt", "How do I install this part?", "--max-new-tokens", "1"]
        if vlm:
            args += ["--image", photo]
        run(args)
        inputs = ["--input-ids", golden / "input_ids.npy"]
        if vlm:
            px = np.load(golden / "pixel_values.npy").astype(np.float32)
            np.save(tiny_dir / f"fusion-{preset}-px.npy", px.reshape(px.shape[-3:]))
            inputs += ["--pixel-values", tiny_dir / f"fusion-{preset}-px.npy"]
        out[preset] = (ckpt, inputs)
    return out


def _compile(ckpt, out, *args):
    # An f32 KV cache: fused and unfused differ by float rounding, which an int8
    # cache could round to other codes.
    return run([tool("kiln-compile"), ckpt, "-o", out, "--kv-cache=f32", *args])


def _answer(artifact, logits, inputs):
    """The logits of every prompt position and the greedy continuation."""
    cmd = [tool("kiln-run"), artifact, *inputs, "--max-new-tokens", "8", "--temperature", "0", "--threads", "2",
           "--dump-logits", logits]
    out = run(cmd).stdout
    line = [l for l in out.splitlines() if l.startswith("tokens:")][-1]
    return np.load(logits), line


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json", "--ops"]).stdout)


@pytest.mark.parametrize("encoding,flags,bound", ENCODINGS, ids=[e for e, _, _ in ENCODINGS])
@pytest.mark.parametrize("preset,vlm", PRESETS, ids=[p for p, _ in PRESETS])
def test_fused_equals_unfused(preset, vlm, encoding, flags, bound, checkpoints, tiny_dir):
    ckpt, inputs = checkpoints[preset]
    fused, unfused = tiny_dir / f"fused-{preset}-{encoding}.kiln", tiny_dir / f"unfused-{preset}-{encoding}.kiln"
    _compile(ckpt, fused, *flags)
    _compile(ckpt, unfused, "--no-fuse", *flags)
    a, tokens_a = _answer(fused, tiny_dir / f"fused-{preset}-{encoding}.npy", inputs)
    b, tokens_b = _answer(unfused, tiny_dir / f"unfused-{preset}-{encoding}.npy", inputs)
    assert a.shape == b.shape
    err, scale = float(np.abs(a - b).max()), float(np.abs(b).max())
    assert err <= bound * scale, f"{preset} {encoding}: fused vs unfused max |diff| {err} > {bound} * {scale}"
    assert tokens_a == tokens_b

    # Fewer kernels, at most 5 per layer, in every stage that has layers.
    f, u = _inspect(fused), _inspect(unfused)
    for fs, us in zip(f["stages"], u["stages"]):
        assert fs["kind"] == us["kind"]
        assert fs["ops_before_fusion"] == us["ops"], fs["kind"]
        if fs["layers"]:
            assert fs["max_ops_per_layer"] <= MAX_LAYER_KERNELS, (preset, fs["kind"], fs["max_ops_per_layer"])
            assert fs["ops"] < us["ops"], (preset, fs["kind"])


def test_decoder_layer_is_four_kernels(checkpoints, tiny_dir):
    """A Llama layer: norm+QKV+RoPE+KV write, attention, o_proj+residual, norm+gated
    MLP+residual."""
    artifact = tiny_dir / "layer-kernels.kiln"
    _compile(checkpoints["tiny-llama"][0], artifact)
    stages = {s["kind"]: s for s in _inspect(artifact)["stages"]}
    for kind in ("DecoderPrefill", "DecoderDecode"):
        layer0 = [op for op in stages[kind]["op_list"] if op["name"].startswith("model.layers.0.")]
        assert [op["kind"] for op in layer0] == ["Linear", "QkvAttention", "Linear", "GatedMlp"], layer0
        assert layer0[0]["name"] == "model.layers.0.self_attn.qkv_proj"
        assert layer0[0]["fused"] == ["model.layers.0.input_layernorm", "model.layers.0.self_attn.q_proj",
                                      "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj",
                                      "model.layers.0.self_attn.rotary_q", "model.layers.0.self_attn.rotary_k"]
        # RoPE and the KV-cache write in the q|k|v product's epilogue (kiln-fuse-rope).
        assert any(s.startswith("kiln_uk_rope_") for s in layer0[0]["symbols"])
        assert not layer0[1].get("fused") and not any(s.startswith("kiln_uk_rope_") for s in layer0[1].get("symbols", []))
        assert layer0[2]["fused"] == ["model.layers.0.self_attn.o_proj", "model.layers.0.residual1"]
        assert layer0[3]["fused"] == ["model.layers.0.post_attention_layernorm", "model.layers.0.mlp",
                                      "model.layers.0.residual2"]
        # Gate and up as one interleaved weight (kiln-fuse-gate-up), then down, then the norm's.
        assert layer0[3]["weights"] == ["model.layers.0.mlp.gate_up_proj.weight",
                                        "model.layers.0.mlp.down_proj.weight",
                                        "model.layers.0.post_attention_layernorm.weight"], layer0[3]
        assert any(s.startswith("kiln_uk_rmsnorm_") for s in layer0[3]["symbols"])
    text = run([tool("kiln-inspect"), artifact]).stdout
    assert "ops before fusion, at most 4 per layer (2 layers)" in text


def test_remarks_name_every_fusion(checkpoints, tiny_dir):
    p = run([tool("kiln-compile"), checkpoints["tiny-qwen2"][0], "-o", tiny_dir / "remarks.kiln", "--remarks"])
    text = p.stdout + p.stderr
    for what in ("kiln-fuse-qkv: model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj and "
                 "model.layers.0.self_attn.v_proj fused into one",
                 "kiln-fuse-norm: model.layers.0.input_layernorm (RMSNorm) fused as the prologue of "
                 "model.layers.0.self_attn.qkv_proj",
                 "kiln-fuse-residual: model.layers.0.residual1 fused as the epilogue of model.layers.0.self_attn.o_proj",
                 "kiln-fuse-gate-up: model.layers.0.mlp.gate_proj.weight and model.layers.0.mlp.up_proj.weight fused "
                 "into one",
                 "model.norm: kiln-fuse-norm: not fused: its result is the output of stage decoder_prefill"):
        assert what in text, what


def test_mixed_encodings_are_kept_apart(checkpoints, tiny_dir):
    """Q in int4 and K/V in int8: the projections stay three, the remark says why,
    and the outputs still equal the unfused artifact's."""
    ckpt, inputs = checkpoints["tiny-llama"]
    flags = ["--precision=.*q_proj.*=int4_g32_a8", "--precision=.*layers.*=int8_a8"]
    fused, unfused = tiny_dir / "mixed.kiln", tiny_dir / "mixed-unfused.kiln"
    p = _compile(ckpt, fused, "--remarks", *flags)
    assert "kept apart to honour the precision assignment" in p.stdout + p.stderr
    _compile(ckpt, unfused, "--no-fuse", *flags)
    stages = {s["kind"]: s for s in _inspect(fused)["stages"]}
    kinds = [op["kind"] for op in stages["DecoderDecode"]["op_list"] if op["name"].startswith("model.layers.0.")]
    assert kinds.count("Linear") == 4 and "Attention" in kinds, kinds
    a, ta = _answer(fused, tiny_dir / "mixed.npy", inputs)
    b, tb = _answer(unfused, tiny_dir / "mixed-unfused.npy", inputs)
    assert float(np.abs(a - b).max()) <= 1e-3 * float(np.abs(b).max()) and ta == tb


@pytest.mark.parametrize("encoding,flags,bound", ENCODINGS, ids=[e for e, _, _ in ENCODINGS])
def test_gate_up_fusion_alone(encoding, flags, bound, checkpoints, tiny_dir):
    """--no-fuse-pass=gate-up keeps every other fusion: the gated MLP then reads gate
    and up apart, and the outputs equal the default artifact's (one product of the
    interleaved weight, act(gate) * up in its epilogue). Qwen2's intermediate size is
    not a multiple of 16, so its last block is shorter."""
    ckpt, inputs = checkpoints["tiny-qwen2"]
    fused, apart = tiny_dir / f"gate-up-{encoding}.kiln", tiny_dir / f"gate-up-apart-{encoding}.kiln"
    _compile(ckpt, fused, *flags)
    _compile(ckpt, apart, "--no-fuse-pass=gate-up", *flags)
    def mlp_weights(artifact):
        stages = {s["kind"]: s for s in _inspect(artifact)["stages"]}
        return [op["weights"] for op in stages["DecoderPrefill"]["op_list"] if op["kind"] == "GatedMlp"][0]
    assert [w.rsplit(".", 2)[-2] for w in mlp_weights(fused)][:2] == ["gate_up_proj", "down_proj"]
    assert [w.rsplit(".", 2)[-2] for w in mlp_weights(apart)][:3] == ["gate_proj", "up_proj", "down_proj"]
    a, ta = _answer(fused, tiny_dir / f"gate-up-{encoding}.npy", inputs)
    b, tb = _answer(apart, tiny_dir / f"gate-up-apart-{encoding}.npy", inputs)
    assert float(np.abs(a - b).max()) <= bound * float(np.abs(b).max()) and ta == tb


def test_gate_up_mixed_encodings_are_kept_apart(checkpoints, tiny_dir):
    """Gate in int8 and up in int4: one remark says why they stay two products."""
    ckpt, inputs = checkpoints["tiny-llama"]
    flags = ["--precision=.*up_proj.*=int4_g32_a8", "--precision=.*layers.*=int8_a8"]
    p = _compile(ckpt, tiny_dir / "gate-up-mixed.kiln", "--remarks", *flags)
    assert ("kiln-fuse-gate-up: not fused: their weights were assigned different encodings (gate int8_a8, up "
            "int4_g32_a8); kept apart") in p.stdout + p.stderr


def test_no_fuse_pass_names_a_pass(checkpoints, tiny_dir):
    out = tiny_dir / "bad-pass.kiln"
    p = subprocess.run([tool("kiln-compile"), str(checkpoints["tiny-llama"][0]), "-o", str(out),
                        "--no-fuse-pass=gateup"], capture_output=True, text=True)
    assert p.returncode == 2 and "--no-fuse-pass=gateup: not a fusion pass" in p.stderr, p.stderr
    assert not out.exists()


@pytest.mark.parametrize("encoding,flags,bound", ENCODINGS[::2], ids=[e for e, _, _ in ENCODINGS[::2]])
def test_gate_up_blocks_of_other_sizes(encoding, flags, bound, checkpoints, tiny_dir):
    """kiln-opt --kiln-fuse-gate-up=block=24 on Llama's intermediate size 176: seven
    blocks of 24 and a last one of 8 (ranges of 48 channels, the packed panels' 16
    inside them). The artifact written from that IR answers as the one whose gate and
    up stay apart."""
    ckpt, inputs = checkpoints["tiny-llama"]
    ir, planned = tiny_dir / f"blocks-{encoding}.mlir", tiny_dir / f"blocks-{encoding}-planned.mlir"
    run([tool("kiln-compile"), ckpt, "--emit=ir", "-o", ir])
    precision = [f"--kiln-assign-precision=precision={f.split('=', 1)[1]}" for f in flags]
    run([tool("kiln-opt"), ir, *precision, "--kiln-fuse-qkv", "--kiln-fuse-gate-up=block=24", "--kiln-fuse-activation",
         "--kiln-fuse-residual", "--kiln-fuse-norm", "--kiln-select-kernels", "--kiln-pack-weights",
         "--kiln-plan-memory=kv-cache=f32", "-o", planned])
    assert "gate_up_block = 24" in planned.read_text()
    blocks, apart = tiny_dir / f"blocks-{encoding}.kiln", tiny_dir / f"blocks-apart-{encoding}.kiln"
    run([tool("kiln-compile"), planned, "-o", blocks])
    _compile(ckpt, apart, "--no-fuse-pass=gate-up", *flags)
    a, ta = _answer(blocks, tiny_dir / f"blocks-{encoding}.npy", inputs)
    b, tb = _answer(apart, tiny_dir / f"blocks-apart-{encoding}.npy", inputs)
    assert float(np.abs(a - b).max()) <= bound * float(np.abs(b).max()) and ta == tb


def test_patch_embedding_adds_the_positions(checkpoints, tiny_dir):
    """SigLIP (Idefics3): the position embedding is the patch embedding's epilogue, its
    table the op's last weight. CLIP (LLaVA): the class token too, its embedding after
    the table (row 0 of the op's output); test_fused_equals_unfused and
    test_reference_match.py check the outputs."""
    siglip, clip = tiny_dir / "siglip-pos.kiln", tiny_dir / "clip-pos.kiln"
    _compile(checkpoints["tiny-idefics3"][0], siglip)
    _compile(checkpoints["tiny-llava"][0], clip)
    ops = {s["kind"]: s["op_list"] for s in _inspect(siglip)["stages"]}["VisionEncoder"]
    assert ops[0]["kind"] == "PatchEmbed" and ops[1]["kind"] != "PositionEmbedding", ops[:2]
    assert ops[0]["fused"] == ["model.vision_model.embeddings.patch_embedding",
                               "model.vision_model.embeddings.position_embedding"]
    assert ops[0]["weights"][-1] == "model.vision_model.embeddings.position_embedding.weight"
    ops = {s["kind"]: s["op_list"] for s in _inspect(clip)["stages"]}["VisionEncoder"]
    kinds = [op["kind"] for op in ops]
    assert kinds[0] == "PatchEmbed" and "ClassToken" not in kinds and "PositionEmbedding" not in kinds, kinds
    embeddings = "vision_tower.vision_model.embeddings."
    assert ops[0]["fused"] == [embeddings + "patch_embedding", embeddings + "class_embedding",
                               embeddings + "position_embedding"], ops[0]
    assert ops[0]["weights"][-2:] == [embeddings + "position_embedding.weight", embeddings + "class_embedding"]
    # --no-fuse-pass=residual keeps the three ops.
    apart = tiny_dir / "clip-pos-apart.kiln"
    _compile(checkpoints["tiny-llava"][0], apart, "--no-fuse-pass=residual")
    kinds = [op["kind"] for op in {s["kind"]: s["op_list"] for s in _inspect(apart)["stages"]}["VisionEncoder"]]
    assert kinds[:3] == ["PatchEmbed", "ClassToken", "PositionEmbedding"], kinds[:3]


@pytest.mark.parametrize("encoding,flags,bound", ENCODINGS[::2], ids=[e for e, _, _ in ENCODINGS[::2]])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-llava"])
def test_rope_and_kv_write_in_the_qkv_epilogue(preset, encoding, flags, bound, checkpoints, tiny_dir):
    """kiln-fuse-rope: the q|k|v product rotates q and k per thread range and writes k
    and v into the KV cache (the default int8 cache, spans included); the attention only
    attends. The same kernels compute the same values: logits and tokens equal the
    artifact without the pass bit for bit, at 1 and 2 threads."""
    ckpt, inputs = checkpoints[preset]
    fused, apart = tiny_dir / f"rope-{preset}-{encoding}.kiln", tiny_dir / f"rope-apart-{preset}-{encoding}.kiln"
    run([tool("kiln-compile"), ckpt, "-o", fused, *flags])
    run([tool("kiln-compile"), ckpt, "-o", apart, "--no-fuse-pass=rope", *flags])
    def layer0(artifact):
        return [op for st in _inspect(artifact)["stages"] if st["kind"] == "DecoderDecode" for op in st["op_list"]
                if ".layers.0." in op["name"]]
    ops = layer0(fused)
    assert ops[0]["name"].endswith("qkv_proj") and any(n.endswith("layers.0.self_attn.rotary_q") for n in ops[0]["fused"])
    assert ops[1]["kind"] == "QkvAttention" and not ops[1].get("fused"), ops[1]
    assert any(n.endswith("layers.0.self_attn.rotary_q") for n in layer0(apart)[1]["fused"])
    for threads in ("1", "2"):
        outs = []
        for artifact in (fused, apart):
            logits = tiny_dir / f"rope-{artifact.stem}-{threads}.npy"
            out = run([tool("kiln-run"), artifact, *inputs, "--max-new-tokens", "8", "--temperature", "0",
                       "--threads", threads, "--dump-logits", logits]).stdout
            outs.append((np.load(logits), [l for l in out.splitlines() if l.startswith("tokens:")][-1]))
        assert np.array_equal(outs[0][0], outs[1][0]), f"{preset} {encoding} {threads} threads: logits differ"
        assert outs[0][1] == outs[1][1]
