"""SigLIP vision transformer as used by Idefics3 / SmolVLM (transformers' Idefics3VisionTransformer,
modeling_idefics3.py), fp32 reference.

Tensor names (Idefics3 prefix `model.vision_model.`):

    embeddings.patch_embedding.{weight,bias}     Conv2d(3, hidden, patch, stride=patch, padding="valid")
    embeddings.position_embedding.weight         [(image_size // patch)^2, hidden]   (no CLS token)
    encoder.layers.{i}.layer_norm1 / self_attn.{q,k,v,out}_proj / layer_norm2 / mlp.fc1, fc2
    post_layernorm.{weight,bias}                 applied to the last hidden state

Only full images are supported (every patch valid: no pixel_attention_mask). Position ids follow
Idefics3VisionEmbeddings' bucketing, which for an image of exactly image_size is 0..P-1 and for a
smaller image (whole patches) maps each patch to the bucket of its fractional coordinate.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn

from .clip import VisionConfig, VisionEncoder, VisionOutput, check_pixel_values

# transformers Idefics3VisionConfig defaults
IDEFICS3_VISION_DEFAULTS = dict(
    hidden_size=1152, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=16,
    num_channels=3, image_size=224, patch_size=32, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
    attention_dropout=0.0, initializer_range=0.02,
)


def idefics3_position_ids(nb_h: int, nb_w: int, per_side: int) -> torch.Tensor:
    """Idefics3VisionEmbeddings.forward for an all-valid patch mask of nb_h x nb_w patches."""
    boundaries = torch.arange(1 / per_side, 1.0, 1 / per_side)
    frac_h = torch.arange(0, 1 - 1e-6, 1 / nb_h)
    frac_w = torch.arange(0, 1 - 1e-6, 1 / nb_w)
    bucket_h = torch.bucketize(frac_h, boundaries, right=True)
    bucket_w = torch.bucketize(frac_w, boundaries, right=True)
    return (bucket_h[:, None] * per_side + bucket_w).flatten()


class Idefics3VisionEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_size = cfg.patch_size
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, kernel_size=cfg.patch_size,
                                         stride=cfg.patch_size, padding="valid")
        self.num_patches_per_side = cfg.image_size // cfg.patch_size
        self.num_positions = self.num_patches_per_side ** 2
        self.position_embedding = nn.Embedding(self.num_positions, cfg.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        check_pixel_values(pixel_values, self.cfg, exact_size=False)
        b, _, h, w = pixel_values.shape
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        pos = idefics3_position_ids(h // self.patch_size, w // self.patch_size, self.num_patches_per_side)
        return patches + self.position_embedding(pos)[None].expand(b, -1, -1)


class Idefics3VisionTransformer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Idefics3VisionEmbeddings(cfg)
        self.encoder = VisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> VisionOutput:
        last, states = self.encoder(self.embeddings(pixel_values))
        return VisionOutput(last_hidden_state=self.post_layernorm(last), hidden_states=states)


class SiglipVisionTransformerForIdefics3(Idefics3VisionTransformer):
    """Standalone construction from a vision_config dict (Idefics3VisionConfig defaults)."""

    def __init__(self, config: Mapping, where: str = "config.json:vision_config"):
        super().__init__(VisionConfig.from_dict(config, IDEFICS3_VISION_DEFAULTS, where))
