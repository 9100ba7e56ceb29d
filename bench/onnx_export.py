#!/usr/bin/python3
"""Export a vision encoder of tests/models/kiln_models to ONNX (torch.onnx.export, PyTorch 1.13),
with seeded random weights, plus a test input and the PyTorch reference output for bench/ort.mjs.

    /usr/bin/python3 bench/onnx_export.py --model siglip-smolvlm --layers 2 --out /tmp/kbench/onnx
    /usr/bin/python3 bench/onnx_export.py --model clip-l14-336 --layers 2 --out /tmp/kbench/onnx

Models (encoder cut to --layers layers; use the same count on Kiln's side):
  siglip-smolvlm  SmolVLM-256M's SigLIP (tests/models preset smolvlm-256m vision_config): 512x512,
                  patch 16 (1024 patches, no CLS), hidden 768, 12 heads, MLP 3072,
                  gelu_pytorch_tanh, eps 1e-6, 12 layers in the real model; output = post_layernorm
                  of the last layer [1, 1024, 768] (Idefics3VisionTransformer.last_hidden_state).
  clip-l14-336    CLIP ViT-L/14-336 (openai/clip-vit-large-patch14-336, LLaVA-1.5's tower): 336x336,
                  patch 14 (576 patches + CLS), hidden 1024, 16 heads, MLP 4096, quick_gelu, eps 1e-5,
                  24 layers in the real model; output = the last layer's hidden state [1, 577, 1024]
                  (CLIPVisionTransformer.last_hidden_state: pre_layrnorm, no post_layernorm).

Weights: tests/models/generate.py's seeded generator (values depend only on seed and tensor name)
under the names the tensors have in a full checkpoint (`model.vision_model.*` for SmolVLM,
`vision_tower.vision_model.*` for LLaVA), so `generate.py --preset smolvlm-256m --dtype f32` holds
the same values for the kept layers.

Writes OUT/<model>-<layers>l.onnx, <...>.input.bin (float32 pixel values [1, 3, S, S], seeded
N(0, 1)), <...>.ref.bin (float32 PyTorch output) and <...>.json (shapes, names, timing of the
PyTorch reference at 1 thread). Idefics3's position-id bucketing (torch.bucketize, no ONNX symbolic)
is computed once at export time: the exported graph is for the full image size only; SigLIP's
Conv2d(padding="valid") is called as F.conv2d(padding=0) (the same result; PyTorch 1.13 has no ONNX
symbolic for aten::_convolution_mode). No `onnx` Python package is needed (none is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import generate  # noqa: E402  (tests/models/generate.py: init_rules, produce_tensor)
from kiln_models.clip import CLIPVisionModel  # noqa: E402
from kiln_models.presets import get_preset  # noqa: E402
from kiln_models.safetensors_io import TensorSpec  # noqa: E402
from kiln_models.siglip import SiglipVisionTransformerForIdefics3, idefics3_position_ids  # noqa: E402

CLIP_L14_336 = {  # openai/clip-vit-large-patch14-336 vision_config (as in llava-hf/llava-1.5-7b-hf)
    "model_type": "clip_vision_model", "hidden_size": 1024, "intermediate_size": 4096, "image_size": 336,
    "patch_size": 14, "num_attention_heads": 16, "num_hidden_layers": 24, "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5, "projection_dim": 768, "num_channels": 3,
}


class SiglipExport(nn.Module):
    """Idefics3VisionTransformer.forward for a full image, with the position ids precomputed."""

    def __init__(self, tower: SiglipVisionTransformerForIdefics3):
        super().__init__()
        self.tower = tower
        per_side = tower.embeddings.num_patches_per_side
        self.register_buffer("pos", idefics3_position_ids(per_side, per_side, per_side), persistent=False)

    def forward(self, pixel_values):
        e = self.tower.embeddings
        # Conv2d(padding="valid") traces to aten::_convolution_mode, which PyTorch 1.13 cannot export;
        # for a stride-patch, kernel-patch convolution "valid" is padding 0.
        conv = e.patch_embedding
        patches = F.conv2d(pixel_values, conv.weight, conv.bias, stride=conv.stride, padding=0)
        x = patches.flatten(2).transpose(1, 2) + e.position_embedding(self.pos)[None]
        last, _ = self.tower.encoder(x)
        return self.tower.post_layernorm(last)


class ClipExport(nn.Module):
    def __init__(self, tower: CLIPVisionModel):
        super().__init__()
        self.tower = tower

    def forward(self, pixel_values):
        vm = self.tower.vision_model
        e = vm.embeddings
        b = pixel_values.shape[0]
        patches = e.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([e.class_embedding.expand(b, 1, -1), patches], dim=1) + e.position_embedding(e.position_ids)
        last, _ = vm.encoder(vm.pre_layrnorm(x))
        return last


def build(model: str, layers: int):
    if model == "siglip-smolvlm":
        vc = dict(get_preset("smolvlm-256m").config["vision_config"])
        vc["num_hidden_layers"] = layers
        tower = SiglipVisionTransformerForIdefics3(vc)
        return SiglipExport(tower), tower, "model.vision_model.", vc
    if model == "clip-l14-336":
        vc = dict(CLIP_L14_336, num_hidden_layers=layers)
        tower = CLIPVisionModel(vc)
        return ClipExport(tower), tower, "vision_tower.", vc
    raise SystemExit(f"unknown model {model!r}")


def fill_weights(tower: nn.Module, prefix: str, seed: int) -> None:
    rules = generate.init_rules(tower, 0.02)
    with torch.no_grad():
        for name, p in tower.named_parameters():
            mean, std = rules[name]
            spec = TensorSpec(prefix + name, "F32", tuple(p.shape))
            vals = np.concatenate(list(generate.produce_tensor(seed, spec, mean, std)))
            p.copy_(torch.from_numpy(vals.reshape(p.shape)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=["siglip-smolvlm", "clip-l14-336"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=17)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    wrapper, tower, prefix, vc = build(a.model, a.layers)
    fill_weights(tower, prefix, a.seed)
    wrapper.eval()
    size = vc["image_size"]
    x = torch.from_numpy(np.random.default_rng(1234).standard_normal((1, 3, size, size), dtype=np.float32))
    with torch.no_grad():
        t0 = time.time()
        ref = wrapper(x)
        t_ref = time.time() - t0
        # the export graph must compute what the reference module computes
        direct = tower(x).last_hidden_state
        assert torch.equal(direct, ref), "export wrapper disagrees with the reference module"
    stem = os.path.join(a.out, f"{a.model}-{a.layers}l")
    t0 = time.time()
    torch.onnx.export(wrapper, (x,), stem + ".onnx", input_names=["pixel_values"], output_names=["hidden"],
                      opset_version=a.opset, do_constant_folding=True)
    t_export = time.time() - t0
    x.numpy().tofile(stem + ".input.bin")
    ref.numpy().astype(np.float32).tofile(stem + ".ref.bin")
    meta = {"model": a.model, "layers": a.layers, "vision_config": vc, "seed": a.seed, "opset": a.opset,
            "torch": torch.__version__, "input": {"name": "pixel_values", "shape": list(x.shape)},
            "output": {"name": "hidden", "shape": list(ref.shape)},
            "parameters": sum(p.numel() for p in tower.parameters()),
            "onnx_bytes": os.path.getsize(stem + ".onnx"), "export_seconds": round(t_export, 2),
            "torch_forward_seconds_1thread_once": round(t_ref, 3)}
    with open(stem + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
