"""Idefics3ForConditionalGeneration (SmolVLM) reference (transformers' modeling_idefics3.py), fp32.

Hub tensor names:

    model.vision_model.*                              SigLIP vision transformer (siglip.py)
    model.connector.modality_projection.proj.weight   [text_hidden, vision_hidden * scale_factor^2]
    model.text_model.*                                Llama decoder body (embed_tokens, layers, norm)
    lm_head.weight                                    (absent when tie_word_embeddings, top-level key)

One image, one tile (no image splitting): pixel_values [1, 3, H, W] or [1, 1, 3, H, W] (several
images / a batch are accepted the same way; all-zero padding images are dropped as HF does).
The connector pixel-shuffles the (image_size/patch)^2 patch features by `scale_factor` into
image_seq_len = (image_size/patch)^2 / scale_factor^2 tokens, then projects them (no bias).
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn as nn

from .clip import VisionConfig
from .common import Cfg, ConfigError, greedy_generate, image_token_mask, merge_image_features
from .llama import DecoderConfig, LlamaModel, TEXT_CAUSAL_LM
from .siglip import IDEFICS3_VISION_DEFAULTS, Idefics3VisionTransformer

IDEFICS3_DEFAULTS = dict(image_token_id=128257, tie_word_embeddings=False, scale_factor=2, pad_token_id=128002)
# Idefics3Config's text model when text_config is absent: LlamaConfig(rms_norm_eps=1e-5, ...)
IDEFICS3_DEFAULT_TEXT = dict(model_type="llama", rms_norm_eps=1e-5, pad_token_id=128002, tie_word_embeddings=False)


def pixel_shuffle(x: torch.Tensor, scale_factor: int) -> torch.Tensor:
    """Idefics3Connector.pixel_shuffle: [B, S, D] -> [B, S / s^2, D * s^2] (same op sequence)."""
    bsz, seq, embed_dim = x.shape
    height = width = int(seq ** 0.5)
    if height * width != seq:
        raise ValueError(f"pixel_shuffle needs a square number of patches, got {seq}")
    if height % scale_factor:
        raise ValueError(f"pixel_shuffle: {height} patches per side is not divisible by scale_factor {scale_factor}")
    s = scale_factor
    x = x.reshape(bsz, height, width, embed_dim)
    x = x.reshape(bsz, height, width // s, embed_dim * s)
    x = x.permute(0, 2, 1, 3)
    x = x.reshape(bsz, width // s, height // s, embed_dim * s * s)
    x = x.permute(0, 2, 1, 3)
    return x.reshape(bsz, seq // (s * s), embed_dim * s * s)


class Idefics3SimpleMLP(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return self.proj(x)


class Idefics3Connector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, scale_factor: int):
        super().__init__()
        self.scale_factor = scale_factor
        self.modality_projection = Idefics3SimpleMLP(vision_hidden * scale_factor ** 2, text_hidden)

    def forward(self, image_hidden_states):
        return self.modality_projection(pixel_shuffle(image_hidden_states, self.scale_factor))


class Idefics3Model(nn.Module):
    def __init__(self, vcfg: VisionConfig, tcfg: DecoderConfig, scale_factor: int):
        super().__init__()
        self.vision_model = Idefics3VisionTransformer(vcfg)
        self.connector = Idefics3Connector(vcfg.hidden_size, tcfg.hidden_size, scale_factor)
        self.text_model = LlamaModel(tcfg)


class Idefics3ForConditionalGeneration(nn.Module):
    is_multimodal = True

    def __init__(self, config: Mapping, where: str = "config.json"):
        super().__init__()
        self.config = dict(config)
        c = Cfg(config, IDEFICS3_DEFAULTS, where)
        self.image_token_id = c.int("image_token_id", minimum=0)
        self.scale_factor = c.int("scale_factor")
        self.tie_word_embeddings = c.bool("tie_word_embeddings")  # Idefics3 ties by the top-level key
        vcfg = VisionConfig.from_dict(config.get("vision_config") or {}, IDEFICS3_VISION_DEFAULTS,
                                      f"{where}:vision_config")
        traw = dict(config.get("text_config") or IDEFICS3_DEFAULT_TEXT)
        ttype = traw.setdefault("model_type", "llama")
        if ttype not in TEXT_CAUSAL_LM:
            raise ConfigError(f"{where}:text_config: model_type {ttype!r} is not supported "
                              f"(supported: {sorted(TEXT_CAUSAL_LM)})")
        tcfg = DecoderConfig.from_dict(traw, f"{where}:text_config", ttype,
                                       tie_override=self.tie_word_embeddings)
        side = vcfg.image_size // vcfg.patch_size
        if side % self.scale_factor:
            raise ConfigError(f"{where}: scale_factor {self.scale_factor} does not divide the "
                              f"{side} patches per side of the vision tower")
        self.image_seq_len = side * side // self.scale_factor ** 2
        self.vcfg, self.tcfg = vcfg, tcfg
        self.model = Idefics3Model(vcfg, tcfg, self.scale_factor)
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(tcfg.hidden_size, tcfg.vocab_size, bias=False)
        self.where = where

    @property
    def num_image_tokens(self) -> int:
        return self.image_seq_len

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.tie_word_embeddings:
            return torch.nn.functional.linear(hidden, self.model.text_model.embed_tokens.weight)
        return self.lm_head(hidden)

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [B, N, 3, H, W] or [N, 3, H, W] -> [N_real, image_seq_len, text_hidden]."""
        if pixel_values.dim() == 5:
            pixel_values = pixel_values.reshape(-1, *pixel_values.shape[2:])
        if pixel_values.dim() != 4:
            raise ValueError(f"pixel_values must be [N, 3, H, W] or [B, N, 3, H, W], got {tuple(pixel_values.shape)}")
        # Idefics3Model.forward: padding images are entirely 0 and are removed
        real = (pixel_values == 0.0).sum(dim=(-1, -2, -3)) != pixel_values.shape[1:].numel()
        pixel_values = pixel_values[real]
        hidden = self.model.vision_model(pixel_values).last_hidden_state
        return self.model.connector(hidden)

    def embed(self, input_ids: torch.Tensor, pixel_values: Optional[torch.Tensor] = None,
              prompt_length: Optional[int] = None) -> torch.Tensor:
        embeds = self.model.text_model.embed(input_ids)
        if pixel_values is None:
            return embeds
        mask = image_token_mask(input_ids, self.image_token_id, prompt_length)
        return merge_image_features(embeds, mask, self.get_image_features(pixel_values),
                                    self.image_token_id, self.where)

    def forward(self, input_ids: torch.Tensor, pixel_values: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, prompt_length: Optional[int] = None) -> torch.Tensor:
        """-> logits [B, T, vocab_size] for every position."""
        embeds = self.embed(input_ids, pixel_values, prompt_length)
        return self.logits(self.model.text_model(inputs_embeds=embeds, attention_mask=attention_mask))

    def greedy_generate(self, input_ids, pixel_values=None, max_new_tokens: int = 16, eos_token_id=None):
        return greedy_generate(self, input_ids, pixel_values, max_new_tokens, eos_token_id)
