"""Building blocks shared by the reference models: config access with HF defaults, activations,
RMSNorm, rotary embeddings, attention masks, empty-weight construction, activation capture and
greedy decoding.

Everything is plain fp32 torch and autograd-friendly (no in-place updates of tensors that need
gradients), so the same modules serve as numerical references and for training small models.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Dict, Iterable, List, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConfigError(ValueError):
    """config.json is missing a key, has a wrong type or an unsupported value."""


class Cfg:
    """Read-only view of one config dict (top level or a sub-config) with HF defaults.

    `where` names the config in error messages (e.g. "config.json:text_config").
    """

    def __init__(self, raw: Mapping, defaults: Mapping, where: str):
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected an object, got {type(raw).__name__}")
        self.raw = dict(raw)
        self.defaults = dict(defaults)
        self.where = where

    def get(self, key: str, default=...):
        if key in self.raw:
            return self.raw[key]
        if key in self.defaults:
            return self.defaults[key]
        if default is not ...:
            return default
        raise ConfigError(f"{self.where}: missing required key {key!r}")

    def int(self, key: str, minimum: int = 1) -> int:
        v = self.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ConfigError(f"{self.where}: {key!r} must be an integer >= {minimum}, got {v!r}")
        return v

    def float(self, key: str) -> float:
        v = self.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise ConfigError(f"{self.where}: {key!r} must be a finite number, got {v!r}")
        return float(v)

    def bool(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.where}: {key!r} must be true or false, got {v!r}")
        return v

    def str(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise ConfigError(f"{self.where}: {key!r} must be a string, got {v!r}")
        return v

    def sub(self, key: str, defaults: Mapping) -> "Cfg":
        v = self.raw.get(key)
        return Cfg({} if v is None else v, defaults, f"{self.where}:{key}")


# ----------------------------------------------------------------------------------------------
# Activations (transformers/activations.py ACT2FN, the subset used by the supported models)
# ----------------------------------------------------------------------------------------------

def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    # QuickGELUActivation: x * sigmoid(1.702 * x) (the OpenAI CLIP approximation)
    return x * torch.sigmoid(1.702 * x)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    # NewGELUActivation (GPT-2): the tanh approximation written out.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,                                          # exact (erf)
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": gelu_new,
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "tanh": torch.tanh,
}


def activation(name: str, where: str = "config") -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"{where}: unsupported activation {name!r}; supported: {sorted(ACTIVATIONS)}") from None


# ----------------------------------------------------------------------------------------------
# Norms and rotary embeddings
# ----------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """LlamaRMSNorm: x * rsqrt(mean(x^2) + eps), computed in fp32, cast back, then times weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * h.to(input_dtype)


def rope_parameters(cfg: Cfg, head_dim: int) -> Dict:
    """Resolve (theta, scaling dict or None) from either the classic keys (rope_theta,
    rope_scaling) or transformers v5's rope_parameters."""
    params = cfg.raw.get("rope_parameters")
    if isinstance(params, Mapping):
        theta = params.get("rope_theta", cfg.get("rope_theta"))
        scaling = dict(params) if params.get("rope_type", params.get("type", "default")) != "default" else None
    else:
        theta = cfg.get("rope_theta")
        scaling = cfg.raw.get("rope_scaling")
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"{cfg.where}: 'rope_theta' must be a positive number, got {theta!r}")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(f"{cfg.where}: 'rope_scaling' must be null or an object, got {scaling!r}")
    return {"theta": float(theta), "scaling": None if scaling is None else dict(scaling), "dim": head_dim,
            "where": cfg.where}


def compute_inv_freq(theta: float, dim: int, scaling: Optional[Mapping] = None,
                     where: str = "config") -> torch.Tensor:
    """Inverse frequencies as transformers/modeling_rope_utils.py computes them (fp32).

    Supported rope types: default, linear, llama3. Others (dynamic, yarn, longrope, ...) change the
    frequencies with the sequence length or add attention scaling and are rejected, not guessed.
    """
    # _compute_default_rope_parameters: base ** (arange(0, dim, 2, int64).float() / dim)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        try:
            factor = float(scaling["factor"])
            low_freq_factor = float(scaling["low_freq_factor"])
            high_freq_factor = float(scaling["high_freq_factor"])
            old_context_len = float(scaling["original_max_position_embeddings"])
        except KeyError as e:
            raise ConfigError(f"{where}: rope_scaling of type llama3 needs key {e.args[0]!r}") from None
        # _compute_llama3_parameters (modeling_rope_utils.py)
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # wavelen < high_freq_wavelen: keep; wavelen > low_freq_wavelen: divide by factor
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        # in between: interpolate smoothly
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, inv_freq_llama)
    raise ConfigError(f"{where}: rope type {rope_type!r} is not supported (supported: default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """LlamaRotaryEmbedding: cos/sin of position * inv_freq, duplicated to the full head_dim."""

    def __init__(self, theta: float, dim: int, scaling: Optional[Mapping] = None, where: str = "config"):
        super().__init__()
        self.register_buffer("inv_freq", compute_inv_freq(theta, dim, scaling, where), persistent=False)
        self.attention_scaling = 1.0  # default, linear and llama3 all leave it at 1.0

    def forward(self, position_ids: torch.Tensor):
        # position_ids [B, T] -> cos, sin [B, T, dim], in fp32
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the last dim (the HF / GPT-NeoX rotary layout, not interleaved)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # q, k [B, H, T, D]; cos, sin [B, T, D]
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, KV, T, D] -> [B, KV*n_rep, T, D]; head h uses kv head h // n_rep (HF repeat_kv)."""
    if n_rep == 1:
        return x
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


def causal_mask(attention_mask: Optional[torch.Tensor], batch: int, length: int,
                dtype=torch.float32, sliding_window: Optional[int] = None) -> torch.Tensor:
    """Additive mask [B, 1, T, T]: 0 where query i may attend key j (j <= i, key not padding),
    the dtype's minimum elsewhere (HF eager attention convention)."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    allowed = (j <= i)
    if sliding_window is not None:
        allowed = allowed & (i - j < sliding_window)
    allowed = allowed[None, None].expand(batch, 1, length, length)
    if attention_mask is not None:
        if attention_mask.shape != (batch, length):
            raise ValueError(f"attention_mask must have shape {(batch, length)}, got {tuple(attention_mask.shape)}")
        allowed = allowed & attention_mask[:, None, None, :].bool()
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def eager_attention(q, k, v, mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, softmax in fp32 (q, k, v [B, H, T, D])."""
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        scores = scores + mask
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


# ----------------------------------------------------------------------------------------------
# Construction without allocating / initialising weights
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def init_empty_weights():
    """Parameters created inside live on the 'meta' device: no memory, no init cost. Used to list
    a real-shape model's tensors (generator) and before filling weights from a checkpoint."""
    original = nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace parameter `name` (dotted) by `value` (a new nn.Parameter, so meta params work)."""
    module_name, _, pname = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    old = module._parameters.get(pname)
    if old is None and pname not in module._parameters:
        raise KeyError(f"model has no parameter {name!r}")
    module._parameters[pname] = nn.Parameter(value, requires_grad=True if old is None else old.requires_grad)


# ----------------------------------------------------------------------------------------------
# Activation capture (for the compiler's test harness)
# ----------------------------------------------------------------------------------------------

class ActivationCapture:
    """Record the outputs of named submodules during forward passes.

    >>> with ActivationCapture(model, ["model.layers.0.mlp", "model.norm"]) as cap:
    ...     model(input_ids)
    >>> cap.outputs["model.norm"]            # detached clone of the module output

    Names are those of `model.named_modules()`; unknown names raise KeyError listing close ones.
    A module called several times (e.g. in greedy_generate) keeps its last output, or all of them
    in cap.history[name] when keep_history=True. Tuple outputs keep their first element.
    """

    def __init__(self, model: nn.Module, names: Iterable[str], keep_history: bool = False):
        modules = dict(model.named_modules())
        self.names = list(names)
        missing = [n for n in self.names if n not in modules]
        if missing:
            hint = [m for m in modules if m and missing[0].split(".")[-1] in m][:8] or \
                [m for m in modules if m and "." not in m]
            raise KeyError(f"{type(model).__name__} has no submodule named {missing}; "
                           f"e.g. {hint}")
        self.outputs: Dict[str, torch.Tensor] = {}
        self.history: Dict[str, List[torch.Tensor]] = {n: [] for n in self.names}
        self.keep_history = keep_history
        self._handles = []
        for n in self.names:
            self._handles.append(modules[n].register_forward_hook(self._hook(n)))

    def _hook(self, name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            out = out.detach().clone()
            self.outputs[name] = out
            if self.keep_history:
                self.history[name].append(out)
        return hook

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


# ----------------------------------------------------------------------------------------------
# Greedy decoding (no KV cache: the whole sequence is recomputed every step)
# ----------------------------------------------------------------------------------------------

def _eos_set(eos_token_id) -> set:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple, set)):
        return {int(e) for e in eos_token_id}
    return {int(eos_token_id)}


@torch.no_grad()
def greedy_generate(model: nn.Module, input_ids: torch.Tensor, pixel_values: Optional[torch.Tensor] = None,
                    max_new_tokens: int = 16, eos_token_id=None) -> torch.Tensor:
    """Argmax decoding. Returns the new token ids [B, n] (n <= max_new_tokens).

    Decoding stops when every row has produced an EOS token; rows that finished earlier are padded
    with their EOS id (as HF pads finished rows). Image tokens are only replaced by image features
    in the prompt (prompt_length), as HF does when it decodes with a KV cache.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    eos = _eos_set(eos_token_id)
    prompt_length = input_ids.shape[1]
    ids = input_ids
    new: List[torch.Tensor] = []
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    pad = torch.full((ids.shape[0],), min(eos) if eos else 0, dtype=ids.dtype)
    kwargs = {}
    if getattr(model, "is_multimodal", False):
        kwargs = {"pixel_values": pixel_values, "prompt_length": prompt_length}
    elif pixel_values is not None:
        raise ValueError(f"{type(model).__name__} is a text model: pixel_values must be None")
    for _ in range(max_new_tokens):
        logits = model(ids, **kwargs)
        nxt = torch.argmax(logits[:, -1, :], dim=-1)
        nxt = torch.where(finished, pad, nxt)
        new.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if eos:
            finished = finished | torch.tensor([int(t) in eos for t in nxt])
            if bool(finished.all()):
                break
    if not new:
        return torch.zeros((ids.shape[0], 0), dtype=input_ids.dtype)
    return torch.stack(new, dim=1)


# ----------------------------------------------------------------------------------------------
# Image-token replacement shared by the VLMs
# ----------------------------------------------------------------------------------------------

def image_token_mask(input_ids: torch.Tensor, image_token_id: int,
                     prompt_length: Optional[int] = None) -> torch.Tensor:
    """Positions holding the image token. With prompt_length, only positions < prompt_length count
    (image tokens produced by decoding are ordinary tokens, as with HF's cached generation)."""
    mask = input_ids == image_token_id
    if prompt_length is not None and prompt_length < input_ids.shape[1]:
        mask = mask.clone()
        mask[:, prompt_length:] = False
    return mask


def merge_image_features(inputs_embeds: torch.Tensor, mask: torch.Tensor, image_features: torch.Tensor,
                         image_token_id: int, what: str) -> torch.Tensor:
    """Replace the embeddings at `mask` (row-major over the batch) by `image_features` [N, S, D] in
    order, like transformers' masked_scatter (llava) / inputs_merger (idefics3). The processor has
    already expanded each image into S image tokens; the counts must agree."""
    n_tokens = int(mask.sum())
    n_features = image_features.shape[0] * image_features.shape[1]
    if n_tokens != n_features:
        raise ValueError(
            f"{what}: input_ids contain {n_tokens} image tokens (id {image_token_id}) but the image(s) "
            f"give {n_features} features ({image_features.shape[0]} image(s) x {image_features.shape[1]} "
            f"tokens each); expand each image into exactly {image_features.shape[1]} image tokens")
    flat = image_features.reshape(-1, image_features.shape[-1]).to(inputs_embeds.dtype)
    return inputs_embeds.masked_scatter(mask[..., None].expand_as(inputs_embeds), flat)
