"""The host's kernels against the portable reference kernels, end to end.

kiln-compile's default target is the host with its detected CPU features, and binds the
kernels generated for the model; --kernels=hand-written binds, on an x86-64 CPU with
AVX-512 VNNI, the x86_avx512 micro-kernels (matmul family, attention, activations) instead.
The same checkpoint compiled --target=portable runs the reference kernels.
Both must agree: fp32 within 1e-4 x max |logit| with the same greedy tokens; quantised
(int8_a8, int4_g32_a8: identical integer products, f32 sums in another order) within 1e-3
with the hand-written kernels, 1e-2 with the generated ones (see below).
kiln-inspect --json --ops reports every op's kernel, ISA and whether it is portable.
"""

import json
import os
import platform

import numpy as np
import pytest
from PIL import Image

from conftest import MODELS, run, tool


def _host_has_avx512_kernels() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    with open("/proc/cpuinfo") as f:
        flags = next((line for line in f if line.startswith("flags")), "").split()
    return all(x in flags for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"))


pytestmark = pytest.mark.skipif(not _host_has_avx512_kernels(), reason="host has no AVX-512 VNNI")


@pytest.fixture(scope="module")
def llava(tiny_dir):
    """tiny-llava, its prompt ids with the image placeholders and its pixel values."""
    ckpt = tiny_dir / "hk-tiny-llava"
    golden = tiny_dir / "hk-tiny-llava-golden"
    if not ckpt.exists():
        run(["/usr/bin/python3", os.path.join(MODELS, "generate.py"), "--preset", "tiny-llava", "--out", ckpt])
    photo = tiny_dir / "hk-photo.png"
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize((80, 60), Image.BILINEAR).save(photo)
    run(["/usr/bin/python3", os.path.join(MODELS, "golden.py"), ckpt, "--out", golden, "--prompt",
         "How do I install this part?", "--max-new-tokens", "8", "--image", photo])
    px = np.load(golden / "pixel_values.npy").astype(np.float32)
    np.save(tiny_dir / "hk-px.npy", px.reshape(px.shape[-3:]))
    return ckpt, golden / "input_ids.npy", tiny_dir / "hk-px.npy"


def _inspect(artifact):
    return json.loads(run([tool("kiln-inspect"), artifact, "--json", "--ops"]).stdout)


def _logits(artifact, ids, px, out):
    stats = run([tool("kiln-run"), artifact, "--input-ids", ids, "--pixel-values", px, "--max-new-tokens", "8",
                 "--dump-logits", out, "--threads", "2", "--json"]).stdout
    answer = stats.strip().splitlines()[:-1]
    return np.load(out), answer


@pytest.mark.parametrize("precision,layout", [("int8", "int8_p16k4"), ("int4_g32", "int4_p16k8"),
                                              ("fp8_e4m3", "panel16")], ids=["w8a16", "w4a16", "fp8"])
def test_float_activation_quantised_weights_are_packed(llava, tiny_dir, precision, layout):
    """W8A16, W4A16 and fp8 weights are packed for the generated matmuls (kiln-pack-weights)
    and give the portable artifact's logits: the same dequantised weights times float
    activations, f32 sums in another order."""
    ckpt, ids, px = llava
    host, portable = tiny_dir / f"hk-{precision}-generated.kiln", tiny_dir / f"hk-{precision}-portable.kiln"
    extra = [f"--precision=.*={precision}"]
    run([tool("kiln-compile"), ckpt, "-o", host, "--kv-cache=f32", *extra])
    run([tool("kiln-compile"), ckpt, "-o", portable, "--target=portable", "--kv-cache=f32", *extra])
    h = _inspect(host)
    matmul = [t for t in h["precision"] if t["encoding"] == precision and len(t["shape"]) >= 2]
    assert matmul and all(t["layout"] == layout for t in matmul if "embed_tokens" not in t["tensor"]), matmul
    got, got_answer = _logits(host, ids, px, tiny_dir / f"hk-{precision}-generated.npy")
    want, want_answer = _logits(portable, ids, px, tiny_dir / f"hk-{precision}-portable.npy")
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert err <= 1e-4 * scale, f"{precision}: max |host - portable| = {err} > 1e-4 x {scale}"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    assert got_answer == want_answer


@pytest.mark.parametrize("kernels", ["generated", "hand-written"])
@pytest.mark.parametrize("precision,tol", [(None, 1e-4), ("int8_a8", 1e-3), ("int4_g32_a8", 1e-3)],
                         ids=["fp32", "int8_a8", "int4_g32_a8"])
def test_host_kernels_match_portable(llava, tiny_dir, precision, tol, kernels):
    ckpt, ids, px = llava
    name = precision or "fp32"
    host, portable = tiny_dir / f"hk-{name}-{kernels}.kiln", tiny_dir / f"hk-{name}-portable.kiln"
    extra = [f"--precision=.*={precision}"] if precision else []
    run([tool("kiln-compile"), ckpt, "-o", host, f"--kernels={kernels}", "--kv-cache=f32", *extra])
    if not portable.exists():
        run([tool("kiln-compile"), ckpt, "-o", portable, "--target=portable", "--kv-cache=f32", *extra])

    h, p = _inspect(host), _inspect(portable)
    if kernels == "hand-written":
        assert "avx512vnni" in h["required_cpu_features"]
    assert p["required_cpu_features"] in ("", "none")
    host_ops = [op for st in h["stages"] for op in st["op_list"]]
    for op in host_ops:
        assert op["portable"] == (op["isa"] == "portable"), op
    accelerated = {op["kind"] for op in host_ops if not op["portable"]}
    assert {"Linear", "LmHead", "GatedMlp", "QkvAttention", "PatchEmbed"} <= accelerated, accelerated
    if kernels == "generated":  # no fallback: every op with a kernel family runs generated code
        assert all(op["isa"] == "generated" for op in host_ops if not op["portable"]), host_ops
    assert all(op["portable"] and op["isa"] == "portable" for st in p["stages"] for op in st["op_list"])

    got, got_answer = _logits(host, ids, px, tiny_dir / f"hk-{name}-{kernels}.npy")
    want, want_answer = _logits(portable, ids, px, tiny_dir / f"hk-{name}-portable.npy")
    assert got.shape == want.shape
    if kernels == "generated" and precision:
        # The generated float kernels (norms, attention, activations) sum in another
        # order than the reference; quantising the activations to int8 per token turns
        # a last-bit difference at a rounding boundary into one code step (1/127 of the
        # row's range) of the next matmul's input.
        tol = 1e-2
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert err <= tol * scale, f"{name}: max |host - portable| = {err} > {tol} x {scale}"
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    assert got_answer == want_answer
