#!/usr/bin/python3
"""Write a complete Hugging Face checkpoint directory with seeded random weights.

    python3 tests/models/generate.py --preset tiny-llava --out /tmp/tiny-llava
    python3 tests/models/generate.py --preset llama-3.2-1b --out /tmp/llama1b --dtype bf16 --shard-size 2GB
    python3 tests/models/generate.py --list

Files: config.json (hub key names, architectures, torch_dtype), model.safetensors or
model-0000i-of-0000N.safetensors + model.safetensors.index.json (header metadata {"format": "pt"}),
tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json,
preprocessor_config.json and processor_config.json (VLMs), kiln_generated.json (provenance).

Weights are produced and written one tensor at a time (large tensors in row chunks), so real-shape
presets never hold the model in memory. Each tensor's values depend only on (seed, tensor name):
the same seed gives the same weights whatever the dtype or sharding. Initialisation keeps
activations O(1) at any width:
  Linear / Conv2d weights   N(0, 1/sqrt(fan_in))       (~0.02 at the real presets' widths)
  biases                    N(0, 0.02)
  embeddings, class token   N(0, initializer_range)    (config value)
  norm weights              1 + N(0, 0.02); norm biases N(0, 0.02)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch.nn as nn  # noqa: E402

from kiln_models.common import RMSNorm  # noqa: E402
from kiln_models.presets import PRESETS, Preset, get_preset  # noqa: E402
from kiln_models.registry import build_model  # noqa: E402
from kiln_models.safetensors_io import (TORCH_DTYPE_NAMES, TensorSpec, canonical_dtype,  # noqa: E402
                                        parse_size, write_checkpoint)

CHUNK_ELEMENTS = 1 << 24  # tensors above this are generated and written in row chunks


def tensor_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


def init_rules(model: nn.Module, init_range: float) -> Dict[str, Tuple[float, float]]:
    """Parameter name -> (mean, std) of its normal initialisation."""
    rules = {}
    for mod_name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{pname}" if mod_name else pname
            if isinstance(mod, (nn.LayerNorm, RMSNorm)):
                rules[name] = (1.0, 0.02) if pname == "weight" else (0.0, 0.02)
            elif isinstance(mod, (nn.Linear, nn.Conv2d)):
                if pname == "weight":
                    fan_in = math.prod(p.shape[1:])
                    rules[name] = (0.0, 1.0 / math.sqrt(fan_in))
                else:
                    rules[name] = (0.0, 0.02)
            else:  # nn.Embedding, CLIP class_embedding
                rules[name] = (0.0, init_range)
    return rules


def produce_tensor(seed: int, spec: TensorSpec, mean: float, std: float) -> Iterator[np.ndarray]:
    """The tensor's float32 values in row-major pieces of at most CHUNK_ELEMENTS elements."""
    rng = np.random.default_rng(tensor_seed(seed, spec.name))
    total = math.prod(spec.shape)
    row = math.prod(spec.shape[1:]) if len(spec.shape) > 1 else 1
    step = max(row, (CHUNK_ELEMENTS // row) * row)
    for start in range(0, total, step):
        n = min(step, total - start)
        x = rng.standard_normal(n, dtype=np.float32)
        x *= np.float32(std)
        if mean:
            x += np.float32(mean)
        yield x


def text_vocab_size(model: nn.Module) -> int:
    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            return p.shape[0]
    raise ValueError("model has no embed_tokens")


def write_tokenizer(preset: Preset, out: str, vocab_size: int, max_positions: int) -> dict:
    from kiln_models.tokenizer import ByteLevelBPE, corpus_text
    spec = preset.tokenizer
    tok = ByteLevelBPE.train([corpus_text()], spec.train_vocab_size, spec.special_tokens,
                             pretokenizer=spec.pretokenizer, bos_token=spec.bos_token, add_bos=spec.add_bos)
    if tok.max_id >= vocab_size:
        raise ValueError(f"preset {preset.name}: tokenizer id {tok.max_id} does not fit vocab_size {vocab_size}")
    tok.save(os.path.join(out, "tokenizer.json"))
    special = {k: v for k, v in (("bos_token", spec.bos_token), ("eos_token", spec.eos_token),
                                 ("unk_token", spec.unk_token), ("pad_token", spec.pad_token)) if v}
    tok_config = {
        "add_bos_token": spec.add_bos, "add_eos_token": False,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
                                 for t, i in sorted(spec.special_tokens.items(), key=lambda kv: kv[1])},
        **special,
        "clean_up_tokenization_spaces": False, "model_max_length": max_positions,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    _write_json(os.path.join(out, "tokenizer_config.json"), tok_config)
    _write_json(os.path.join(out, "special_tokens_map.json"), special)
    return {"vocab": len(tok.vocab), "merges": len(tok.merges), "added": len(tok.added_tokens)}


def _write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def tokenizer_json_ids(path: str) -> int:
    """The number of ids a tokenizer.json uses (its largest id + 1)."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    ids = list(tj["model"]["vocab"].values()) + [a["id"] for a in tj.get("added_tokens", [])]
    return max(ids) + 1


def generate(preset_name: str, out: str, seed: int = 0, dtype: Optional[str] = None,
             shard_size="2GB", quiet: bool = False, tokenizer_json: Optional[str] = None,
             tokenizer_config: Optional[str] = None) -> dict:
    """Write checkpoint `preset_name` to directory `out`; returns a summary dict. With
    `tokenizer_json`, that tokenizer (e.g. a real checkpoint's) is copied instead of one
    trained here, and the text vocabulary is sized to its ids."""
    t0 = time.time()
    preset = get_preset(preset_name)
    dtype = canonical_dtype(dtype or preset.default_dtype)
    if dtype not in TORCH_DTYPE_NAMES or dtype == "F64":
        raise ValueError(f"--dtype must be f32, f16 or bf16, got {dtype}")
    os.makedirs(out, exist_ok=True)
    config = dict(preset.config)
    config["torch_dtype"] = TORCH_DTYPE_NAMES[dtype]
    if tokenizer_json:
        vocab = tokenizer_json_ids(tokenizer_json)
        if "text_config" in config:
            config["text_config"] = dict(config["text_config"], vocab_size=vocab)
        else:
            config["vocab_size"] = vocab

    model = build_model(config, where=f"preset {preset_name}", empty=True)
    text_cfg = config.get("text_config") or config
    init_range = float(config.get("initializer_range") or text_cfg.get("initializer_range") or 0.02)
    rules = init_rules(model, init_range)
    specs = [TensorSpec(name, dtype, tuple(p.shape)) for name, p in model.named_parameters()]

    def produce(spec: TensorSpec):
        mean, std = rules[spec.name]
        return produce_tensor(seed, spec, mean, std)

    files = write_checkpoint(out, specs, produce, max_shard_size=parse_size(shard_size),
                             metadata={"format": "pt"})
    _write_json(os.path.join(out, "config.json"), config)
    _write_json(os.path.join(out, "generation_config.json"), {"_from_model_config": True, **preset.generation})
    if preset.preprocessor is not None:
        _write_json(os.path.join(out, "preprocessor_config.json"), preset.preprocessor)
    if preset.processor is not None:
        _write_json(os.path.join(out, "processor_config.json"), preset.processor)
    if tokenizer_json:
        shutil.copyfile(tokenizer_json, os.path.join(out, "tokenizer.json"))
        if tokenizer_config:
            shutil.copyfile(tokenizer_config, os.path.join(out, "tokenizer_config.json"))
        tok = {"copied": os.path.abspath(tokenizer_json), "ids": text_vocab_size(model)}
    else:
        tok = write_tokenizer(preset, out, text_vocab_size(model),
                              int(text_cfg.get("max_position_embeddings") or 2048))
    n_params = sum(math.prod(s.shape) for s in specs)
    n_bytes = sum(s.nbytes for s in specs)
    summary = {"preset": preset_name, "description": preset.description, "seed": seed, "dtype": dtype,
               "parameters": n_params, "bytes": n_bytes, "files": files, "tokenizer": tok,
               "generator": "tests/models/generate.py"}
    _write_json(os.path.join(out, "kiln_generated.json"), summary)
    if not quiet:
        print(f"{preset_name}: {n_params:,} parameters, {n_bytes / 1e6:.1f} MB {dtype} in {len(files)} file(s) "
              f"-> {out} ({time.time() - t0:.1f} s)")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", help="preset name (see --list)")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], help="stored dtype (default: the preset's)")
    ap.add_argument("--shard-size", default="2GB", help="max shard size, e.g. 2GB, 500MB, 1GiB (default 2GB)")
    ap.add_argument("--list", action="store_true", help="list presets and exit")
    ap.add_argument("--tokenizer-json", help="copy this tokenizer.json (a real checkpoint's) instead of training one; "
                                             "the text vocabulary is sized to its ids")
    ap.add_argument("--tokenizer-config", help="with --tokenizer-json: its tokenizer_config.json")
    args = ap.parse_args(argv)
    if args.list:
        for p in PRESETS.values():
            print(f"{p.name:20s} {'tiny' if p.tiny else 'real'} {p.default_dtype:5s} {p.description}")
        return 0
    if not args.preset or not args.out:
        ap.error("--preset and --out are required (or --list)")
    if args.preset not in PRESETS:
        ap.error(f"unknown preset {args.preset!r}; available: {', '.join(PRESETS)}")
    generate(args.preset, args.out, args.seed, args.dtype, args.shard_size,
             tokenizer_json=args.tokenizer_json, tokenizer_config=args.tokenizer_config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
