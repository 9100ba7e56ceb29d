"""Architecture name -> reference class, and loading a Hugging Face checkpoint directory.

    model, config = load_checkpoint("/path/to/checkpoint")     # config.json + safetensors

Loading is strict, like `load_state_dict(strict=True)` on the hub tensor names: every parameter of
the model must be in the checkpoint with the right shape and a floating dtype, and every tensor in
the checkpoint must be a parameter -- except non-persistent buffers that old checkpoints carry
(`*.rotary_emb.inv_freq`, `*.embeddings.position_ids`) and, for tied embeddings, an `lm_head`
copy (transformers re-ties it to the input embedding after loading, so it is ignored here too).
Tensors are copied one at a time from the memory-mapped files into fp32 parameters.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, Mapping, Optional, Tuple, Type

import torch
import torch.nn as nn

from .clip import CLIPVisionModel
from .common import ConfigError, init_empty_weights, set_parameter
from .idefics3 import Idefics3ForConditionalGeneration
from .llama import LlamaForCausalLM, Qwen2ForCausalLM
from .llava import HUB_KEY_RENAMES as LLAVA_RENAMES, LlavaForConditionalGeneration
from .mixtral import MixtralForCausalLM
from .safetensors_io import Checkpoint

ARCHITECTURES: Dict[str, Type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "Idefics3ForConditionalGeneration": Idefics3ForConditionalGeneration,
    "CLIPVisionModel": CLIPVisionModel,
}
# model_type -> architecture, for configs without an "architectures" list
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
               "llava": "LlavaForConditionalGeneration", "idefics3": "Idefics3ForConditionalGeneration",
               "clip_vision_model": "CLIPVisionModel"}
# checkpoint-layout renames per architecture (newer transformers save layouts)
KEY_RENAMES = {"LlavaForConditionalGeneration": LLAVA_RENAMES}
TIED_HEAD_NAMES = {"lm_head.weight", "language_model.lm_head.weight"}
IGNORED_KEYS = [re.compile(r"(^|\.)rotary_emb\.inv_freq$"), re.compile(r"(^|\.)embeddings\.position_ids$")]


class CheckpointError(ValueError):
    """The checkpoint does not match its config (missing / unexpected / misshapen tensors)."""


def read_config(directory: str) -> dict:
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"{path}: not found (is {directory!r} a Hugging Face checkpoint directory?)")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    return config


def architecture_of(config: Mapping, where: str = "config.json") -> str:
    archs = config.get("architectures")
    if archs:
        if not isinstance(archs, list) or not isinstance(archs[0], str):
            raise ConfigError(f"{where}: 'architectures' must be a list of names, got {archs!r}")
        arch = archs[0]
    else:
        mt = config.get("model_type")
        if mt not in MODEL_TYPES:
            raise ConfigError(f"{where}: no 'architectures' and unknown model_type {mt!r}")
        arch = MODEL_TYPES[mt]
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{where}: architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}")
    return arch


def build_model(config: Mapping, where: str = "config.json", empty: bool = False) -> nn.Module:
    """Instantiate the reference model for `config`. empty=True puts parameters on the meta device
    (no memory): used to list tensor names/shapes, or before filling from a checkpoint."""
    cls = ARCHITECTURES[architecture_of(config, where)]
    if empty:
        with init_empty_weights():
            return cls(config, where=where)
    return cls(config, where=where)


def parameter_shapes(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    """Hub tensor name -> shape, in module registration order (what a checkpoint must contain)."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _is_ignored(name: str) -> bool:
    return any(p.search(name) for p in IGNORED_KEYS)


def _rename(name: str, renames) -> str:
    for old, new in renames:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def load_checkpoint(directory: str, model: Optional[nn.Module] = None) -> Tuple[nn.Module, dict]:
    """Read config.json and the safetensors (single or sharded) of `directory`; return the fp32
    reference model in eval mode and the config dict."""
    config = read_config(directory)
    where = os.path.join(directory, "config.json")
    arch = architecture_of(config, where)
    if model is None:
        model = build_model(config, where, empty=True)
    expected = parameter_shapes(model)

    with Checkpoint(directory) as ckpt:
        renames = KEY_RENAMES.get(arch, [])
        by_name = {}
        for key in ckpt.keys():
            name = _rename(key, renames)
            if name in by_name:
                raise CheckpointError(f"{directory}: tensors {by_name[name]!r} and {key!r} both map to {name!r}")
            by_name[name] = key
        missing = [n for n in expected if n not in by_name]
        # an lm_head the model does not have means tied embeddings: HF re-ties it, we ignore it
        unexpected = [n for n in by_name if n not in expected and not _is_ignored(n)
                      and n not in TIED_HEAD_NAMES]
        if missing or unexpected:
            def show(names):
                return ", ".join(names[:8]) + (f" ... ({len(names)} in total)" if len(names) > 8 else "")
            parts = []
            if missing:
                parts.append(f"missing tensors: {show(missing)}")
            if unexpected:
                parts.append(f"unexpected tensors: {show(unexpected)}")
            raise CheckpointError(f"{directory}: checkpoint does not match {arch} built from config.json; "
                                  + "; ".join(parts))
        for name, shape in expected.items():
            key = by_name[name]
            info = ckpt.info(key)
            if info.shape != shape:
                raise CheckpointError(f"{info.file}: tensor {key!r} has shape {list(info.shape)}, "
                                      f"config.json implies {list(shape)}")
            if info.dtype not in ("F32", "F16", "BF16", "F64"):
                raise CheckpointError(f"{info.file}: tensor {key!r} has dtype {info.dtype}, expected a float type")
            set_parameter(model, name, ckpt.get_torch(key, dtype=torch.float32))
    model.eval()
    return model, config


def text_config_of(config: Mapping) -> Tuple[str, dict]:
    """(architecture, config) of the bare text model inside a VLM config (for equivalence tests)."""
    arch = architecture_of(config)
    if arch == "LlavaForConditionalGeneration":
        t = dict(config.get("text_config") or {"model_type": "llama"})
        t.setdefault("model_type", "llama")
        t.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    elif arch == "Idefics3ForConditionalGeneration":
        t = dict(config.get("text_config") or {"model_type": "llama"})
        t.setdefault("model_type", "llama")
        t["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
    else:
        return arch, dict(config)
    return MODEL_TYPES[t["model_type"]], t


def text_model_of(model: nn.Module, config: Mapping) -> nn.Module:
    """The bare text *ForCausalLM of a VLM, built from its text config, holding copies of the VLM's
    text weights (identity for text models). Used to check that a VLM without image == its LM."""
    arch, tconfig = text_config_of(config)
    if arch == architecture_of(config):
        return model
    text = build_model(tconfig, where="config.json:text_config", empty=True)
    src = dict(model.named_parameters())
    if isinstance(model, LlavaForConditionalGeneration):
        def source(name):
            return "language_model." + name
    elif isinstance(model, Idefics3ForConditionalGeneration):
        def source(name):
            return "model.text_model." + name[len("model."):] if name.startswith("model.") else name
    else:  # pragma: no cover
        raise TypeError(f"no text model mapping for {type(model).__name__}")
    for name, _ in list(text.named_parameters()):
        set_parameter(text, name, src[source(name)].detach().clone())
    return text.eval()
