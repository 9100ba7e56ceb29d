#!/usr/bin/env python3
"""Makes the artifacts the runtime's unit tests load: tiny generated checkpoints of
several architectures compiled with kiln-compile, and the PyTorch reference's
outputs for one prompt each (input ids, pixel values, greedy tokens).

usage: make_test_artifacts.py --compiler PATH/kiln-compile --out DIR
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
PRESETS = {"tiny-llama": False, "tiny-llava": True, "tiny-idefics3": True, "tiny-mixtral": False}
# KV caches: every artifact has an f32 cache except `<preset>.kv8.gen-<arch>.kiln` and
# `<preset>.kv4.gen-<arch>.kiln` (int8, int4; generated attention).
# Quantised with int8 activations (W8A8 and W4A8): `<preset>.a8.kiln` (portable) and
# `<preset>.a8.gen-<arch>.kiln` (generated kernels), which the runtime tests compare.
# Per architecture, the CPU features the generated artifact assumes (or other flags), so that every
# integer dot-product path runs somewhere: SSE2 / AVX2 pmaddwd on x86-64; on AArch64 Armv8.0
# NEON (SMULL/SADALP), `sdot` (dotprod) and `smmla` (i8mm, the vision encoder's many-row GEMMs).
A8 = {
    "tiny-llama": (["lm_head.weight=int8_a8", ".*self_attn.*=int8_a8", ".*mlp.*=int4_g32_a8"],
                   {"x86_64": "+avx2,+fma,+f16c", "aarch64": "+dotprod"}),
    # Baseline x86-64 has no F16C: its int4 ops run the reference, allowed by name.
    "tiny-llava": ([".*(q|k|v)_proj.*=int4_g32_a8", ".*(out_proj|fc1|fc2).*=int8_a8", ".*mlp.*=int4_g32_a8"],
                   {"x86_64": "--allow-portable-ops=.*(q_proj|k_proj|v_proj|mlp)", "aarch64": "+dotprod,+i8mm"}),
    "tiny-mixtral": ([".*experts.*=int4_g32_a8", ".*self_attn.*=int8_a8"],
                     {"x86_64": "+avx2,+fma,+f16c", "aarch64": ""}),
}

# SME2: the A8 rules of these presets also compiled for +sme,+sme2 (beside the dotprod
# and i8mm of their aarch64 artifact), `<preset>.a8.gen-aarch64-sme2.kiln`: their many-row
# matmuls (prefill, the vision encoder) run as SME2 outer products.
SME2 = {"tiny-llama": "+dotprod,+i8mm,+sme,+sme2", "tiny-llava": "+dotprod,+i8mm,+sme,+sme2"}

# Quantised weights with float activations (W8A16, W4A16, fp8): `<preset>.a16.kiln`
# (portable) and `<preset>.a16.gen-<arch>.kiln`, compared the same way.
A16 = {
    "tiny-llama": (["lm_head.weight=int8", ".*self_attn.(q|k)_proj.*=fp8_e4m3", ".*self_attn.(v|o)_proj.*=fp8_e5m2",
                    ".*mlp.*=int4_g32"],
                   {"x86_64": "+avx2,+fma,+f16c", "aarch64": ""}),
    "tiny-mixtral": ([".*experts.*=int4_g32_asym", ".*self_attn.*=int8"],
                     {"x86_64": "+avx2,+fma,+f16c", "aarch64": "+dotprod"}),
}


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{p.stdout}\n{p.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # The runtime tests compare these artifacts with each other and with the PyTorch
    # reference: an f32 KV cache (exact), except the `.kv8` / `.kv4` artifacts below.
    compiler = [args.compiler, "--kv-cache=f32"]
    from PIL import Image
    photo = os.path.join(args.out, "photo.png")
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (6, 9, 3), dtype=np.uint8)).resize((72, 48), Image.BILINEAR).save(photo)
    for preset, vlm in PRESETS.items():
        ckpt = os.path.join(args.out, preset + ".ckpt")
        golden = os.path.join(args.out, preset + ".golden")
        shutil.rmtree(ckpt, ignore_errors=True)
        run([sys.executable, os.path.join(MODELS, "generate.py"), "--preset", preset, "--out", ckpt])
        # Portable: the runtime tests run these on every architecture (also under qemu).
        run([*compiler, ckpt, "-o", os.path.join(args.out, preset + ".kiln"), "--target=portable"])
        # With generated kernels in a code segment, for each architecture's baseline
        # (x86-64 SSE2, AArch64 NEON): each runtime runs its own architecture's.
        for arch, triple in (("x86_64", "x86_64-linux-gnu"), ("aarch64", "aarch64-linux-gnu")):
            run([*compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.gen-{arch}.kiln"),
                 f"--target={triple}"])
        # Int8 and int4 KV caches read by the generated attention (tiny-llama): the
        # runtime tests compare them with the built-in kernels reading the same caches.
        if preset == "tiny-llama":
            for kv in ("int8", "int4"):
                for arch, triple in (("x86_64", "x86_64-linux-gnu"), ("aarch64", "aarch64-linux-gnu")):
                    run([args.compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.kv{kv[3:]}.gen-{arch}.kiln"),
                         f"--target={triple}", f"--kv-cache={kv}"])
        for suffix, table in (("a8", A8), ("a16", A16)):
            if preset not in table:
                continue
            rules, features = table[preset]
            precision = [f"--precision={r}" for r in rules]
            run([*compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.{suffix}.kiln"), "--target=portable"]
                + precision)
            for arch, triple in (("x86_64", "x86_64-linux-gnu"), ("aarch64", "aarch64-linux-gnu")):
                flags = features[arch]
                flags = [flags] if flags.startswith("--") else [f"--cpu-features={flags}"]
                run([*compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.{suffix}.gen-{arch}.kiln"),
                     f"--target={triple}"] + flags + precision)
            if suffix == "a8" and preset in SME2:
                run([*compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.a8.gen-aarch64-sme2.kiln"),
                     "--target=aarch64-linux-gnu", f"--cpu-features={SME2[preset]}"] + precision)
        # Visual-token pruning: 8 of the projector's 16 tokens (the verifier's SelectTokens tests).
        if preset == "tiny-llava":
            run([*compiler, ckpt, "-o", os.path.join(args.out, f"{preset}.vt8.kiln"), "--target=portable",
                 "--visual-tokens=8"])
        cmd = [sys.executable, os.path.join(MODELS, "golden.py"), ckpt, "--out", golden,
               "--prompt", "What is in the picture?", "--max-new-tokens", "6"]
        if vlm:
            cmd += ["--image", photo]
        run(cmd)
        ids = np.load(os.path.join(golden, "input_ids.npy")).astype(np.int32).reshape(-1)
        np.save(os.path.join(args.out, preset + ".ids.npy"), ids)
        greedy = np.load(os.path.join(golden, "greedy.npy")).astype(np.int32).reshape(-1)
        np.save(os.path.join(args.out, preset + ".greedy.npy"), greedy)
        if vlm:
            px = np.load(os.path.join(golden, "pixel_values.npy")).astype(np.float32)
            np.save(os.path.join(args.out, preset + ".pixels.npy"), px.reshape(px.shape[-3:]))
    print(f"test artifacts in {args.out}")


if __name__ == "__main__":
    main()
