"""LlamaForCausalLM and Qwen2ForCausalLM reference implementations (fp32).

Module attribute names mirror transformers' (modeling_llama.py, modeling_qwen2.py), so
`state_dict()` keys are exactly the hub tensor names:

    model.embed_tokens.weight
    model.layers.{i}.input_layernorm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}
    model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.{weight,bias}
    model.norm.weight
    lm_head.weight                      (absent when tie_word_embeddings: logits use embed_tokens)

Biases: Llama has q/k/v/o biases iff attention_bias and MLP biases iff mlp_bias; Qwen2 always has
q/k/v biases and never o_proj/MLP biases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import (Cfg, ConfigError, RMSNorm, RotaryEmbedding, activation, apply_rotary, causal_mask,
                     eager_attention, greedy_generate, repeat_kv, rope_parameters)

# Defaults of transformers' LlamaConfig / Qwen2Config for keys a config.json may omit
# (hub configs such as llava-1.5's text_config rely on them).
LLAMA_DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, head_dim=None, hidden_act="silu",
    max_position_embeddings=2048, initializer_range=0.02, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000.0, rope_scaling=None, attention_bias=False, mlp_bias=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=None,
)
QWEN2_DEFAULTS = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, head_dim=None, hidden_act="silu",
    max_position_embeddings=32768, initializer_range=0.02, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10000.0, rope_scaling=None, use_sliding_window=False, sliding_window=4096,
    max_window_layers=28, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
# MixtralConfig (configuration_mixtral.py)
MIXTRAL_DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, head_dim=None, hidden_act="silu",
    max_position_embeddings=4096 * 32, initializer_range=0.02, rms_norm_eps=1e-5,
    tie_word_embeddings=False, rope_theta=1e6, rope_scaling=None, sliding_window=None,
    num_experts_per_tok=2, num_local_experts=8, router_jitter_noise=0.0,
    bos_token_id=1, eos_token_id=2, pad_token_id=None,
)
TEXT_DEFAULTS = {"llama": LLAMA_DEFAULTS, "qwen2": QWEN2_DEFAULTS, "mixtral": MIXTRAL_DEFAULTS}


@dataclass
class DecoderConfig:
    """A validated decoder config (one of llama / qwen2 / mixtral)."""
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    layer_sliding_windows: List[Optional[int]]
    initializer_range: float
    bos_token_id: object
    eos_token_id: object
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    where: str = "config.json"

    @classmethod
    def from_dict(cls, raw: Mapping, where: str = "config.json", model_type: Optional[str] = None,
                  tie_override: Optional[bool] = None) -> "DecoderConfig":
        mt = raw.get("model_type", model_type) if isinstance(raw, Mapping) else model_type
        if model_type is not None and mt != model_type:
            raise ConfigError(f"{where}: model_type is {mt!r}, expected {model_type!r}")
        if mt not in TEXT_DEFAULTS:
            raise ConfigError(f"{where}: unsupported text model_type {mt!r}; supported: {sorted(TEXT_DEFAULTS)}")
        c = Cfg(raw, TEXT_DEFAULTS[mt], where)
        hidden = c.int("hidden_size")
        heads = c.int("num_attention_heads")
        kv = c.get("num_key_value_heads")
        kv = heads if kv is None else c.int("num_key_value_heads")
        if heads % kv:
            raise ConfigError(f"{where}: num_attention_heads ({heads}) must be a multiple of "
                              f"num_key_value_heads ({kv})")
        head_dim = c.get("head_dim")
        if head_dim is None:  # transformers: getattr(config, "head_dim", None) or hidden // heads
            if hidden % heads:
                raise ConfigError(f"{where}: hidden_size ({hidden}) is not divisible by num_attention_heads "
                                  f"({heads}) and no head_dim is given")
            head_dim = hidden // heads
        else:
            head_dim = c.int("head_dim")
        if head_dim % 2:
            raise ConfigError(f"{where}: head_dim ({head_dim}) must be even for rotary embeddings")
        layers = c.int("num_hidden_layers")
        rope = rope_parameters(c, head_dim)
        act = c.str("hidden_act")
        activation(act, where)
        if mt == "llama":
            qkv_bias = o_bias = c.bool("attention_bias")
            mlp_bias = c.bool("mlp_bias")
            windows = [None] * layers
        elif mt == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
            # modeling_qwen2 / configuration_qwen2: layers >= max_window_layers use the sliding
            # window when use_sliding_window is set (layer_types), the rest full attention.
            if c.bool("use_sliding_window") and c.get("sliding_window") is not None:
                sw, mwl = c.int("sliding_window"), c.int("max_window_layers", minimum=0)
                windows = [sw if i >= mwl else None for i in range(layers)]
            else:
                windows = [None] * layers
        else:  # mixtral
            qkv_bias = o_bias = mlp_bias = False
            sw = c.get("sliding_window")
            windows = [None if sw is None else c.int("sliding_window")] * layers
        tie = c.bool("tie_word_embeddings") if tie_override is None else bool(tie_override)
        cfg = cls(
            model_type=mt, vocab_size=c.int("vocab_size"), hidden_size=hidden,
            intermediate_size=c.int("intermediate_size"), num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, hidden_act=act,
            rms_norm_eps=c.float("rms_norm_eps"), rope_theta=rope["theta"], rope_scaling=rope["scaling"],
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, tie_word_embeddings=tie,
            layer_sliding_windows=windows, initializer_range=c.float("initializer_range"),
            bos_token_id=c.get("bos_token_id"), eos_token_id=c.get("eos_token_id"), where=where,
        )
        if mt == "mixtral":
            cfg.num_local_experts = c.int("num_local_experts")
            cfg.num_experts_per_tok = c.int("num_experts_per_tok")
            if cfg.num_experts_per_tok > cfg.num_local_experts:
                raise ConfigError(f"{where}: num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds "
                                  f"num_local_experts ({cfg.num_local_experts})")
        return cfg


class LlamaAttention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer_idx: int):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scaling = self.head_dim ** -0.5
        self.sliding_window = cfg.layer_sliding_windows[layer_idx]
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=cfg.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        n_rep = self.num_heads // self.num_kv_heads
        out = eager_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, self.scaling)
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x))"""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act_fn = activation(cfg.hidden_act, cfg.where)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    # attribute name of the feed-forward block; Mixtral's is "block_sparse_moe"
    def __init__(self, cfg: DecoderConfig, layer_idx: int,
                 ffn_factory: Optional[Callable[[DecoderConfig], Tuple[str, nn.Module]]] = None):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        name, ffn = ("mlp", LlamaMLP(cfg)) if ffn_factory is None else ffn_factory(cfg)
        self.ffn_name = name
        setattr(self, name, ffn)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + getattr(self, self.ffn_name)(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embeddings + decoder layers + final norm (transformers' LlamaModel / Qwen2Model)."""

    def __init__(self, cfg: DecoderConfig, ffn_factory=None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, ffn_factory) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.rope_theta, cfg.head_dim, cfg.rope_scaling, cfg.where)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(input_ids, self.cfg.vocab_size, self.cfg.where)
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: Optional[torch.Tensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        b, t, _ = h.shape
        if position_ids is None:
            # With right padding (or none) positions are 0..T-1 for every row, as in HF forward.
            position_ids = torch.arange(t)[None].expand(b, t)
        cos, sin = self.rotary_emb(position_ids)
        masks: Dict[Optional[int], torch.Tensor] = {}
        for layer in self.layers:
            w = layer.self_attn.sliding_window
            if w not in masks:
                masks[w] = causal_mask(attention_mask, b, t, h.dtype, sliding_window=w)
            h = layer(h, cos, sin, masks[w])
        return self.norm(h)


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, where: str) -> None:
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size):
        raise ValueError(f"input_ids must be in [0, {vocab_size}) (vocab_size of {where}); "
                         f"got min {int(input_ids.min())}, max {int(input_ids.max())}")


class DecoderForCausalLM(nn.Module):
    """A decoder with a language-modelling head. Subclasses fix the model_type."""

    model_type = "llama"
    is_multimodal = False

    def __init__(self, config: Mapping, where: str = "config.json", ffn_factory=None,
                 tie_override: Optional[bool] = None):
        super().__init__()
        self.config = dict(config)
        self.cfg = DecoderConfig.from_dict(config, where, self.model_type, tie_override=tie_override)
        self.model = LlamaModel(self.cfg, ffn_factory)
        if not self.cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(self.cfg.hidden_size, self.cfg.vocab_size, bias=False)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.cfg.tie_word_embeddings:
            return F.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)

    def forward(self, input_ids: Optional[torch.Tensor] = None, pixel_values=None,
                attention_mask: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """-> logits [B, T, vocab_size] (fp32) for every position."""
        if pixel_values is not None:
            raise ValueError(f"{type(self).__name__} is a text model: pixel_values must be None")
        return self.logits(self.model(input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask))

    def greedy_generate(self, input_ids, pixel_values=None, max_new_tokens: int = 16, eos_token_id=None):
        return greedy_generate(self, input_ids, pixel_values, max_new_tokens, eos_token_id)


class LlamaForCausalLM(DecoderForCausalLM):
    model_type = "llama"


class Qwen2ForCausalLM(DecoderForCausalLM):
    model_type = "qwen2"


TEXT_CAUSAL_LM = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}
