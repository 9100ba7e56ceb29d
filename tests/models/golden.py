#!/usr/bin/python3
"""Golden outputs of the fp32 PyTorch reference for a checkpoint directory, as .npy files.

    python3 tests/models/golden.py CKPT --out DIR --prompt "What is in the picture?" --image cat.png
    python3 tests/models/golden.py CKPT --out DIR --input-ids 1,2,3 [--pixel-values pv.npy]

Writes to DIR:
  input_ids.npy      int64 [1, T]          (the prompt, image tokens expanded)
  pixel_values.npy   float32, as the model consumes it: [1, 3, H, W] (LLaVA) or [1, 1, 3, S, S]
                     (Idefics3); only with an image. From --image via kiln_models.image_processing
                     and the checkpoint's preprocessor_config.json, or copied from --pixel-values.
  logits.npy         float32 [1, T, vocab] logits of every position (fp32 reference)
  greedy.npy         int64 [1, N] new tokens of argmax decoding (N <= --max-new-tokens, stops at EOS)
  meta.json          what was run: checkpoint, architecture, template, prompt text, shapes, EOS ids,
                     decoded text, checksums
  act_<name>.npy     with --activations a,b: outputs of those submodules in the prompt's forward pass
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from kiln_models import image_processing, prompts  # noqa: E402
from kiln_models.common import ActivationCapture  # noqa: E402
from kiln_models.registry import architecture_of, load_checkpoint  # noqa: E402


def _read_json(path: str, required: bool = False) -> Optional[dict]:
    if not os.path.exists(path):
        if required:
            raise FileNotFoundError(f"{path}: not found")
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def decode_lenient(tokenizer, ids: List[int]) -> str:
    """Decode, writing ids the tokenizer does not know (the model's vocab may be larger, as in real
    Qwen2) as <id:N>."""
    parts, run_ids = [], []
    for i in ids:
        if tokenizer.id_to_piece(i) is None:
            if run_ids:
                parts.append(tokenizer.decode(run_ids))
                run_ids = []
            parts.append(f"<id:{i}>")
        else:
            run_ids.append(i)
    if run_ids:
        parts.append(tokenizer.decode(run_ids))
    return "".join(parts)


def parse_ids(text: str) -> List[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise SystemExit(f"--input-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise SystemExit("--input-ids is empty")
    return ids


def run(checkpoint: str, out: str, prompt: Optional[str] = None, input_ids: Optional[List[int]] = None,
        image: Optional[str] = None, pixel_values_file: Optional[str] = None, max_new_tokens: int = 8,
        activations: Optional[List[str]] = None) -> dict:
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of --prompt and --input-ids")
    if image and pixel_values_file:
        raise ValueError("give at most one of --image and --pixel-values")
    torch.manual_seed(0)
    model, config = load_checkpoint(checkpoint)
    arch = architecture_of(config)
    multimodal = getattr(model, "is_multimodal", False)
    if (image or pixel_values_file) and not multimodal:
        raise ValueError(f"{arch} is a text model: it takes no image")

    pixel_values = None
    if image:
        pre = _read_json(os.path.join(checkpoint, "preprocessor_config.json"), required=True)
        pixel_values = image_processing.preprocess(pre, image_processing.load_image(image),
                                                   os.path.join(checkpoint, "preprocessor_config.json"))
    elif pixel_values_file:
        pixel_values = np.load(pixel_values_file).astype(np.float32)

    tokenizer = None
    tok_path = os.path.join(checkpoint, "tokenizer.json")
    if os.path.exists(tok_path):
        from kiln_models.tokenizer import ByteLevelBPE
        tokenizer = ByteLevelBPE.load(tok_path)
    rendered = None
    if prompt is not None:
        if tokenizer is None:
            raise FileNotFoundError(f"{tok_path}: needed to tokenize --prompt")
        tok_config = _read_json(os.path.join(checkpoint, "tokenizer_config.json")) or {}
        rendered = prompts.render(config, prompt, pixel_values is not None)
        input_ids = prompts.encode(tokenizer, tok_config, config, prompt, pixel_values is not None)

    ids = torch.tensor([input_ids], dtype=torch.int64)
    pv = None if pixel_values is None else torch.from_numpy(pixel_values)
    gen = _read_json(os.path.join(checkpoint, "generation_config.json")) or {}
    eos = gen.get("eos_token_id", config.get("eos_token_id", (config.get("text_config") or {}).get("eos_token_id")))

    with torch.no_grad():
        capture = ActivationCapture(model, activations) if activations else None
        kwargs = {"pixel_values": pv} if multimodal else {}
        logits = model(ids, **kwargs).numpy().astype(np.float32)
        acts = dict(capture.outputs) if capture else {}
        if capture:
            capture.remove()
        greedy = model.greedy_generate(ids, pv, max_new_tokens=max_new_tokens, eos_token_id=eos).numpy()

    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "input_ids.npy"), ids.numpy().astype(np.int64))
    if pixel_values is not None:
        np.save(os.path.join(out, "pixel_values.npy"), pixel_values.astype(np.float32))
    elif os.path.exists(os.path.join(out, "pixel_values.npy")):
        os.remove(os.path.join(out, "pixel_values.npy"))
    np.save(os.path.join(out, "logits.npy"), logits)
    np.save(os.path.join(out, "greedy.npy"), greedy.astype(np.int64))
    for name, value in acts.items():
        np.save(os.path.join(out, f"act_{name}.npy"), value.numpy().astype(np.float32))

    meta = {
        "checkpoint": os.path.abspath(checkpoint),
        "architecture": arch,
        "template": prompts.template_name(config),
        "prompt": prompt,
        "rendered_prompt": rendered,
        "image": os.path.abspath(image) if image else None,
        "pixel_values_file": os.path.abspath(pixel_values_file) if pixel_values_file else None,
        "num_image_tokens": int((ids == prompts.image_token(config)[1]).sum()) if multimodal else 0,
        "shapes": {"input_ids": list(ids.shape), "logits": list(logits.shape), "greedy": list(greedy.shape),
                   "pixel_values": None if pixel_values is None else list(pixel_values.shape)},
        "max_new_tokens": max_new_tokens,
        "eos_token_id": eos,
        "greedy_text": decode_lenient(tokenizer, greedy[0].tolist()) if tokenizer is not None else None,
        "last_position_argmax": int(logits[0, -1].argmax()),
        "sha256": {"logits": _sha(logits), "greedy": _sha(greedy.astype(np.int64))},
        "activations": sorted(acts),
        "reference": f"kiln_models fp32, torch {torch.__version__}, numpy {np.__version__}",
    }
    with open(os.path.join(out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Golden outputs (fp32 reference) for a checkpoint directory")
    ap.add_argument("checkpoint", help="Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, help="output directory for the .npy files and meta.json")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (rendered with the model's template, kiln_models/prompts.py)")
    src.add_argument("--input-ids", help="comma-separated token ids, used as they are")
    img = ap.add_mutually_exclusive_group()
    img.add_argument("--image", help="image file, preprocessed with the checkpoint's preprocessor_config.json")
    img.add_argument("--pixel-values", help=".npy with pixel_values as the model consumes them")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--activations", help="comma-separated submodule names whose outputs to save")
    args = ap.parse_args(argv)
    meta = run(args.checkpoint, args.out, prompt=args.prompt,
               input_ids=parse_ids(args.input_ids) if args.input_ids else None,
               image=args.image, pixel_values_file=args.pixel_values, max_new_tokens=args.max_new_tokens,
               activations=[a for a in args.activations.split(",") if a] if args.activations else None)
    print(f"{meta['architecture']}: {meta['shapes']['input_ids'][1]} tokens, logits {meta['shapes']['logits']}, "
          f"greedy {meta['shapes']['greedy'][1]} tokens -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
