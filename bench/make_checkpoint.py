#!/usr/bin/python3
"""Seeded random Llama checkpoints for the benchmarks, in the layout tests/models/generate.py writes.

    /usr/bin/python3 bench/make_checkpoint.py --model smollm-135m --out /tmp/kbench/smollm-135m [--layers N] [--dtype f32]

Models (text decoders only; LlamaForCausalLM):
  smollm-135m   the text model of SmolVLM-256M (tests/models preset smolvlm-256m, text_config:
                30 x 576, GQA 9/3, head_dim 64, MLP 1536, vocab 49280, rope_theta 1e5, untied)
  llama-3.2-1b  tests/models preset llama-3.2-1b (16 x 2048, GQA 32/8, MLP 8192, vocab 128256,
                llama3 rope scaling, tied)
  --layers N keeps the first N decoder layers (the same cut must be used on Kiln's side).

The preset's tokenizer spec (small byte-level BPE with the specials at their real ids) and the
generator of tests/models/generate.py (weights depend only on seed and tensor name) are reused.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))

import generate  # noqa: E402  (tests/models/generate.py)
from kiln_models import presets  # noqa: E402


def text_preset(model: str, layers: int | None) -> presets.Preset:
    if model == "smollm-135m":
        base = presets.get_preset("smolvlm-256m")
        cfg = copy.deepcopy(base.config["text_config"])
        cfg["architectures"] = ["LlamaForCausalLM"]
        for k in ("is_llama_config", "rope_interleaved"):
            cfg.pop(k, None)
        gen = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
        tok = base.tokenizer
    elif model == "llama-3.2-1b":
        base = presets.get_preset("llama-3.2-1b")
        cfg = copy.deepcopy(base.config)
        gen = base.generation
        tok = base.tokenizer
    else:
        raise SystemExit(f"unknown model {model!r}")
    if layers:
        cfg["num_hidden_layers"] = int(layers)
    name = f"bench-{model}" + (f"-{layers}l" if layers else "")
    return presets.Preset(name, f"{model} text decoder for bench/ ({cfg['num_hidden_layers']} layers)", cfg, tok,
                          gen, default_dtype="f32", tiny=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=["smollm-135m", "llama-3.2-1b"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    p = text_preset(a.model, a.layers)
    presets.PRESETS[p.name] = p  # generate() looks presets up by name
    generate.generate(p.name, a.out, seed=a.seed, dtype=a.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
