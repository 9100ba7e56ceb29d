"""CLIP vision tower (transformers' CLIPVisionModel, modeling_clip.py), fp32 reference.

Tensor names (prefix `vision_model.`):

    embeddings.class_embedding                         [hidden]
    embeddings.patch_embedding.weight                  [hidden, 3, patch, patch]   (no bias)
    embeddings.position_embedding.weight               [num_patches + 1, hidden]
    pre_layrnorm.{weight,bias}                         (sic: the hub spelling)
    encoder.layers.{i}.layer_norm1.{weight,bias}
    encoder.layers.{i}.self_attn.{q,k,v,out}_proj.{weight,bias}
    encoder.layers.{i}.layer_norm2.{weight,bias}
    encoder.layers.{i}.mlp.fc1.{weight,bias}, mlp.fc2.{weight,bias}
    post_layernorm.{weight,bias}

Outputs follow CLIPVisionTransformer: hidden_states[0] is the embeddings output *after*
pre_layrnorm, hidden_states[i] the output of layer i; last_hidden_state is NOT post-normalised —
post_layernorm only applies to the pooled CLS token (pooler_output). LLaVA picks
hidden_states[vision_feature_layer], so it never sees post_layernorm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

import torch
import torch.nn as nn

from .common import Cfg, ConfigError, activation, eager_attention

# transformers CLIPVisionConfig defaults
CLIP_VISION_DEFAULTS = dict(
    hidden_size=768, intermediate_size=3072, projection_dim=512, num_hidden_layers=12,
    num_attention_heads=12, num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu",
    layer_norm_eps=1e-5, attention_dropout=0.0, initializer_range=0.02, initializer_factor=1.0,
)


@dataclass
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    hidden_act: str
    layer_norm_eps: float
    where: str

    @classmethod
    def from_dict(cls, raw: Mapping, defaults: Mapping, where: str) -> "VisionConfig":
        c = Cfg(raw, defaults, where)
        cfg = cls(
            hidden_size=c.int("hidden_size"), intermediate_size=c.int("intermediate_size"),
            num_hidden_layers=c.int("num_hidden_layers"), num_attention_heads=c.int("num_attention_heads"),
            num_channels=c.int("num_channels"), image_size=c.int("image_size"), patch_size=c.int("patch_size"),
            hidden_act=c.str("hidden_act"), layer_norm_eps=c.float("layer_norm_eps"), where=where,
        )
        activation(cfg.hidden_act, where)
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ConfigError(f"{where}: hidden_size ({cfg.hidden_size}) must be divisible by "
                              f"num_attention_heads ({cfg.num_attention_heads})")
        if cfg.image_size % cfg.patch_size:
            raise ConfigError(f"{where}: image_size ({cfg.image_size}) must be a multiple of "
                              f"patch_size ({cfg.patch_size})")
        return cfg

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass
class VisionOutput:
    last_hidden_state: torch.Tensor
    hidden_states: Tuple[torch.Tensor, ...]
    pooler_output: Optional[torch.Tensor] = None


class VisionAttention(nn.Module):
    """Bidirectional multi-head attention with biased q/k/v/out projections (CLIP and SigLIP)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.embed_dim = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        shape = (b, t, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        out = eager_attention(q, k, v, None, self.scale)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.embed_dim))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.activation_fn = activation(cfg.hidden_act, cfg.where)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x):
        return self.fc2(self.activation_fn(self.fc1(x)))


class VisionEncoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)); x + mlp(ln2(x))."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.self_attn = VisionAttention(cfg)
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = VisionMLP(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class VisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(VisionEncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        states = [x]
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return x, tuple(states)


def check_pixel_values(pixel_values: torch.Tensor, cfg: VisionConfig, exact_size: bool) -> None:
    if pixel_values.dim() != 4:
        raise ValueError(f"pixel_values must be [N, {cfg.num_channels}, H, W], got {tuple(pixel_values.shape)}")
    n, c, h, w = pixel_values.shape
    if c != cfg.num_channels:
        raise ValueError(f"pixel_values has {c} channels, {cfg.where} says num_channels={cfg.num_channels}")
    if exact_size and (h, w) != (cfg.image_size, cfg.image_size):
        raise ValueError(f"pixel_values is {h}x{w}, {cfg.where} expects image_size "
                         f"{cfg.image_size}x{cfg.image_size}")
    if not exact_size and (h > cfg.image_size or w > cfg.image_size or h % cfg.patch_size or w % cfg.patch_size):
        raise ValueError(f"pixel_values is {h}x{w}: must be multiples of patch_size {cfg.patch_size} "
                         f"no larger than image_size {cfg.image_size} ({cfg.where})")


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.class_embedding = nn.Parameter(torch.randn(cfg.hidden_size))
        self.patch_embedding = nn.Conv2d(cfg.num_channels, cfg.hidden_size, kernel_size=cfg.patch_size,
                                         stride=cfg.patch_size, bias=False)
        self.num_positions = cfg.num_patches + 1
        self.position_embedding = nn.Embedding(self.num_positions, cfg.hidden_size)
        self.register_buffer("position_ids", torch.arange(self.num_positions)[None], persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        check_pixel_values(pixel_values, self.cfg, exact_size=True)
        b = pixel_values.shape[0]
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # [B, P, D]
        cls = self.class_embedding.expand(b, 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding(self.position_ids)


class CLIPVisionTransformer(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.encoder = VisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> VisionOutput:
        x = self.pre_layrnorm(self.embeddings(pixel_values))
        last, states = self.encoder(x)
        return VisionOutput(last_hidden_state=last, hidden_states=states,
                            pooler_output=self.post_layernorm(last[:, 0, :]))


class CLIPVisionModel(nn.Module):
    """Standalone tower; as LLaVA's `vision_tower` its tensors are `vision_tower.vision_model.*`."""

    is_multimodal = False

    def __init__(self, config: Mapping, where: str = "config.json"):
        super().__init__()
        self.config = dict(config)
        self.cfg = VisionConfig.from_dict(config, CLIP_VISION_DEFAULTS, where)
        self.vision_model = CLIPVisionTransformer(self.cfg)

    def forward(self, pixel_values: torch.Tensor) -> VisionOutput:
        return self.vision_model(pixel_values)
