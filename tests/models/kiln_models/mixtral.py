"""MixtralForCausalLM reference implementation (fp32), after transformers' modeling_mixtral.py.

Same decoder as Llama (no biases) with the MLP replaced by a sparse mixture of experts:

    model.layers.{i}.block_sparse_moe.gate.weight                 [num_local_experts, hidden]
    model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight       [intermediate, hidden]  (gate)
    model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight       [intermediate, hidden]  (up)
    model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight       [hidden, intermediate]  (down)

Routing per token: softmax(gate(x)) in fp32 -> top-k (num_experts_per_tok) -> weights divided by
their sum -> sum_k w_k * w2(act(w1 x) * w3 x).

sliding_window: applied exactly (banded causal mask) when set; Mixtral-8x7B's hub config has null.
router_jitter_noise only acts in training mode in transformers and is not implemented: a config
asking for it is accepted, but the module raises if used in training mode with it.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .common import activation
from .llama import DecoderConfig, DecoderForCausalLM


class MixtralBlockSparseTop2MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.act_fn = activation(cfg.hidden_act, cfg.where)

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    def __init__(self, cfg: DecoderConfig, router_jitter_noise: float = 0.0):
        super().__init__()
        self.num_experts = cfg.num_local_experts
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(cfg.hidden_size, self.num_experts, bias=False)
        self.experts = nn.ModuleList(MixtralBlockSparseTop2MLP(cfg) for _ in range(self.num_experts))
        self.jitter = router_jitter_noise
        # Routing statistics of the last forward (for calibration / expert pruning studies).
        self.last_router_logits: Optional[torch.Tensor] = None
        self.last_selected_experts: Optional[torch.Tensor] = None

    def route(self, x2d: torch.Tensor):
        """x2d [N, hidden] -> (router_logits [N, E], weights [N, k], experts [N, k])."""
        router_logits = self.gate(x2d)
        probs = F.softmax(router_logits, dim=1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return router_logits, weights.to(x2d.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.jitter > 0:
            raise NotImplementedError("router_jitter_noise > 0 in training mode is not implemented")
        b, t, h = x.shape
        x2d = x.reshape(-1, h)
        router_logits, weights, experts = self.route(x2d)
        self.last_router_logits = router_logits.detach()
        self.last_selected_experts = experts.detach()
        out = torch.zeros_like(x2d)
        # expert_mask[e, k, n] = token n chose expert e in slot k
        expert_mask = F.one_hot(experts, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            slot, token = torch.where(expert_mask[e])
            if token.numel() == 0:
                continue
            y = self.experts[e](x2d[token]) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return out.reshape(b, t, h)


class MixtralForCausalLM(DecoderForCausalLM):
    model_type = "mixtral"

    def __init__(self, config: Mapping, where: str = "config.json", tie_override: Optional[bool] = None):
        jitter = float(config.get("router_jitter_noise") or 0.0)
        super().__init__(config, where,
                         ffn_factory=lambda cfg: ("block_sparse_moe", MixtralSparseMoeBlock(cfg, jitter)),
                         tie_override=tie_override)
