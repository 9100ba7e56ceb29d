"""LlavaForConditionalGeneration reference (transformers' modeling_llava.py), fp32.

Hub tensor names (the LLaVA-1.5 / llava-hf layout):

    vision_tower.vision_model.*                      CLIP vision tower (clip.py)
    multi_modal_projector.linear_1.{weight,bias}     [text_hidden, vision_hidden * n_layers]
    multi_modal_projector.linear_2.{weight,bias}     [text_hidden, text_hidden]
    language_model.model.*                           Llama / Qwen2 decoder (llama.py)
    language_model.lm_head.weight                    (absent when the text model ties embeddings)

The newer transformers layout (model.vision_tower.*, model.multi_modal_projector.*,
model.language_model.*, lm_head.weight) is accepted on load by `HUB_KEY_RENAMES`.

Image tokens: as in current transformers, the *processor* expands each <image> into the number of
image features (num_image_tokens); the model replaces those positions in order with the projected
features and checks that the counts agree.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

import torch
import torch.nn as nn

from .clip import CLIPVisionModel, VisionConfig
from .common import (Cfg, ConfigError, activation, greedy_generate, image_token_mask, merge_image_features)
from .llama import TEXT_CAUSAL_LM as _TEXT_DENSE
from .mixtral import MixtralForCausalLM

# Text models a LLaVA checkpoint may carry (transformers builds any causal LM from
# text_config; these are the ones Kiln supports).
TEXT_CAUSAL_LM = dict(_TEXT_DENSE, mixtral=MixtralForCausalLM)

LLAVA_DEFAULTS = dict(
    image_token_index=32000, projector_hidden_act="gelu", vision_feature_select_strategy="default",
    vision_feature_layer=-2, multimodal_projector_bias=True, tie_word_embeddings=False,
)
# LlavaConfig's vision tower when vision_config is absent (CLIP ViT-L/14-336)
LLAVA_DEFAULT_VISION = dict(intermediate_size=4096, hidden_size=1024, patch_size=14, image_size=336,
                            num_hidden_layers=24, num_attention_heads=16, vocab_size=32000,
                            projection_dim=768, hidden_act="quick_gelu", model_type="clip_vision_model")

# transformers >= 4.52 checkpoint layout -> the LLaVA-1.5 layout used by this module
HUB_KEY_RENAMES = [
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("model.language_model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
]


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, in_features: int, text_hidden: int, act: str, bias: bool, where: str):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, text_hidden, bias=bias)
        self.act = activation(act, where)
        self.linear_2 = nn.Linear(text_hidden, text_hidden, bias=bias)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    is_multimodal = True

    def __init__(self, config: Mapping, where: str = "config.json"):
        super().__init__()
        self.config = dict(config)
        c = Cfg(config, LLAVA_DEFAULTS, where)
        self.image_token_index = int(config.get("image_token_index", config.get("image_token_id", 32000)))

        vraw = config.get("vision_config")
        vraw = dict(LLAVA_DEFAULT_VISION) if vraw is None else dict(vraw)
        vtype = vraw.get("model_type", "clip_vision_model")
        if vtype != "clip_vision_model":
            raise ConfigError(f"{where}:vision_config: model_type {vtype!r} is not supported "
                              f"(only clip_vision_model)")
        self.vision_tower = CLIPVisionModel(vraw, where=f"{where}:vision_config")
        vcfg: VisionConfig = self.vision_tower.cfg

        traw = dict(config.get("text_config") or {"model_type": "llama"})
        ttype = traw.setdefault("model_type", "llama")
        if ttype not in TEXT_CAUSAL_LM:
            raise ConfigError(f"{where}:text_config: model_type {ttype!r} is not supported "
                              f"(supported: {sorted(TEXT_CAUSAL_LM)})")
        # The language model is its own *ForCausalLM: its text_config decides the tying; a top-level
        # tie_word_embeddings is the fallback (newer configs put it there).
        tie = traw.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
        self.language_model = TEXT_CAUSAL_LM[ttype](traw, where=f"{where}:text_config", tie_override=bool(tie))

        layer = c.get("vision_feature_layer")
        self.feature_layers: List[int] = [layer] if isinstance(layer, int) else list(layer)
        n_states = vcfg.num_hidden_layers + 1
        for l in self.feature_layers:
            if not isinstance(l, int) or not -n_states <= l < n_states:
                raise ConfigError(f"{where}: vision_feature_layer {l!r} is outside the {n_states} hidden states")
        self.select_strategy = c.str("vision_feature_select_strategy")
        if self.select_strategy not in ("default", "full"):
            raise ConfigError(f"{where}: vision_feature_select_strategy must be 'default' or 'full', "
                              f"got {self.select_strategy!r}")
        self.multi_modal_projector = LlavaMultiModalProjector(
            vcfg.hidden_size * len(self.feature_layers), self.language_model.cfg.hidden_size,
            c.str("projector_hidden_act"), c.bool("multimodal_projector_bias"), where)
        self.where = where

    @property
    def num_image_tokens(self) -> int:
        """Image tokens per image the processor must put in input_ids."""
        n = self.vision_tower.cfg.num_patches
        return n + 1 if self.select_strategy == "full" else n

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [N, 3, H, W] -> projected features [N, num_image_tokens, text_hidden]."""
        out = self.vision_tower(pixel_values)
        feats = [out.hidden_states[l] for l in self.feature_layers]
        if self.select_strategy == "default":
            feats = [f[:, 1:] for f in feats]  # drop CLS
        return self.multi_modal_projector(torch.cat(feats, dim=-1))

    def embed(self, input_ids: torch.Tensor, pixel_values: Optional[torch.Tensor] = None,
              prompt_length: Optional[int] = None) -> torch.Tensor:
        lm = self.language_model
        if pixel_values is None:
            return lm.model.embed(input_ids)
        if pixel_values.dim() == 5:  # [B, N, 3, H, W] -> [B*N, 3, H, W]
            pixel_values = pixel_values.reshape(-1, *pixel_values.shape[2:])
        mask = image_token_mask(input_ids, self.image_token_index, prompt_length)
        ids = input_ids
        if self.image_token_index >= lm.cfg.vocab_size:  # the id has no embedding row: placeholder
            ids = torch.where(mask, torch.zeros_like(input_ids), input_ids)
        embeds = lm.model.embed(ids)
        features = self.get_image_features(pixel_values)
        return merge_image_features(embeds, mask, features, self.image_token_index, self.where)

    def forward(self, input_ids: torch.Tensor, pixel_values: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, prompt_length: Optional[int] = None) -> torch.Tensor:
        """-> logits [B, T, vocab_size] for every position."""
        embeds = self.embed(input_ids, pixel_values, prompt_length)
        hidden = self.language_model.model(inputs_embeds=embeds, attention_mask=attention_mask)
        return self.language_model.logits(hidden)

    def greedy_generate(self, input_ids, pixel_values=None, max_new_tokens: int = 16, eos_token_id=None):
        return greedy_generate(self, input_ids, pixel_values, max_new_tokens, eos_token_id)
