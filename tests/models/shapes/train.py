#!/usr/bin/env python3
"""Trains the "shapes" demo VLM on CPU, reproducibly, and writes a Hugging Face
checkpoint directory (fp16 safetensors, config, tokenizer, processor config).

    python3 tests/models/shapes/train.py --variant dense --out tests/models/shapes/checkpoints/dense
    python3 tests/models/shapes/train.py --variant moe   --out tests/models/shapes/checkpoints/moe

Everything is seeded: the samples of step s are the training split's indices
[s*B, (s+1)*B), rendered at sizes drawn from a generator seeded by (seed, s); model
initialisation uses torch.manual_seed(seed). With the same PyTorch build and thread
count, a rerun gives the same weights.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kiln_models.llava import LlavaForConditionalGeneration  # noqa: E402
from kiln_models.safetensors_io import TensorSpec, write_checkpoint  # noqa: E402
from shapes import model as sm  # noqa: E402
from shapes import task  # noqa: E402
from shapes.evaluate import accuracy  # noqa: E402


SHARD_SIZE = "6MB"


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """transformers' _init_weights with initializer_range = 0.02."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def load_balancing_loss(router_logits, top_k: int) -> torch.Tensor:
    """Mixtral's auxiliary loss (transformers' load_balancing_loss_func): the fraction
    of tokens routed to each expert times its mean router probability."""
    logits = torch.cat(router_logits, dim=0)
    probs = F.softmax(logits, dim=-1)
    _, selected = torch.topk(probs, top_k, dim=-1)
    mask = F.one_hot(selected, probs.shape[-1]).float()  # [N, k, E]
    tokens_per_expert = mask.mean(dim=0)  # [k, E]
    prob_per_expert = probs.mean(dim=0)  # [E]
    return (tokens_per_expert * prob_per_expert[None]).sum() * probs.shape[-1]


def upcycle(model: nn.Module, config: dict, dense_dir: str) -> None:
    """Sparse upcycling (Komatsuzaki et al., 2022) with fine-grained experts: the dense
    MLP's hidden units are split into groups of the expert width; expert e copies group
    e mod groups, its down projection scaled by groups / top_k so that an evenly routed
    mix of top-k experts starts at the scale of the dense MLP's output."""
    from kiln_models.safetensors_io import Checkpoint
    with Checkpoint(dense_dir) as ckpt:
        dense = {name: torch.from_numpy(np.array(ckpt.get_numpy(name))).float() for name in ckpt.keys()}
    text = config["text_config"]
    width, n_exp = text["intermediate_size"], text["num_local_experts"]
    state = {}
    for name, t in dense.items():
        if ".mlp." not in name or not name.startswith("language_model."):
            state[name] = t
            continue
        prefix, proj = name.split(".mlp.")
        hidden_units = t.shape[0] if proj != "down_proj.weight" else t.shape[1]
        groups = hidden_units // width
        if groups * width != hidden_units:
            raise SystemExit(f"{dense_dir}: {name} has {hidden_units} hidden units, not a multiple of {width}")
        for e in range(n_exp):
            g = e % groups
            rows = slice(g * width, (g + 1) * width)
            key = {"gate_proj.weight": "w1", "down_proj.weight": "w2", "up_proj.weight": "w3"}[proj]
            part = t[:, rows] * (groups / text["num_experts_per_tok"]) if key == "w2" else t[rows]
            state[f"{prefix}.block_sparse_moe.experts.{e}.{key}.weight"] = part.clone()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq") and not m.endswith("block_sparse_moe.gate.weight")]
    if unexpected or missing:
        raise SystemExit(f"{dense_dir}: cannot upcycle (missing {missing[:3]}, unexpected {unexpected[:3]})")


def parse_kind_weights(specs, kinds) -> dict:
    """--kind-weight KIND=W options -> {KIND: W}."""
    weights = {}
    for kw in specs:
        kind, _, w = kw.partition("=")
        if kind not in kinds or not w:
            raise SystemExit(f"--kind-weight {kw!r}: expected KIND=W with KIND one of {', '.join(kinds)}")
        weights[kind] = float(w)
    return weights


def load_weights(model: nn.Module, path: str, variant: str) -> None:
    """The weights of a checkpoint directory, or of a training state (train_state.pt)."""
    if path.endswith(".pt"):
        state = torch.load(path)["model"]
    else:
        from kiln_models.safetensors_io import Checkpoint
        with Checkpoint(path) as ckpt:
            state = {name: torch.from_numpy(np.array(ckpt.get_numpy(name))).float() for name in ckpt.keys()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.endswith("inv_freq")]:
        raise SystemExit(f"{path}: does not match the {variant} model "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def router_hooks(model: nn.Module, config: dict):
    """-> (the list each forward appends the MoE routers' logits to, the load-balancing
    coefficient, top k); a dense model's list stays empty."""
    router_logits = []
    for name, mod in model.named_modules():
        if name.endswith("block_sparse_moe.gate"):
            mod.register_forward_hook(lambda m, i, o: router_logits.append(o))
    text = config["text_config"]
    return router_logits, text.get("router_aux_loss_coef", 0.0), text.get("num_experts_per_tok", 0)


def make_optimizer(model: nn.Module, aux_head: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW, weight decay 0.05 on matrices (not norms, embeddings, biases)."""
    decay, no_decay = [], []
    for name, p in list(model.named_parameters()) + [("aux." + n, p) for n, p in aux_head.named_parameters()]:
        (no_decay if p.dim() < 2 or "norm" in name or "embedding" in name else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.98), eps=1e-8)


def lr_schedule(lr: float, warmup: int, steps: int):
    """Linear warmup, then a cosine down to 2% of lr at `steps`."""
    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))
    return lr_at


def train_step(model, aux_head, opt, logits, labels, patch_rows, patch_colors, patch_shapes, colors: int,
               aux_weight: float, router, extra_loss=None) -> torch.Tensor:
    """One optimiser step on the answer loss, plus aux_weight times the per-patch colour
    (`colors` classes, then shape) loss of the aux head on patch_rows [B, patches, D],
    plus the routers' load balancing, plus extra_loss if given -> the answer loss."""
    router_logits, aux_coef, top_k = router
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    total = loss
    if aux_weight > 0:
        aux = aux_head(patch_rows)
        aux_loss = F.cross_entropy(aux[..., :colors].reshape(-1, colors), patch_colors.reshape(-1)) + \
            F.cross_entropy(aux[..., colors:].reshape(-1, aux.shape[-1] - colors), patch_shapes.reshape(-1))
        total = total + aux_weight * aux_loss
    if router_logits:
        total = total + aux_coef * load_balancing_loss(router_logits, top_k)
    if extra_loss is not None:
        total = total + extra_loss
    opt.zero_grad(set_to_none=True)
    total.backward()
    torch.nn.utils.clip_grad_norm_(list(model.parameters()) + list(aux_head.parameters()), 1.0)
    opt.step()
    return loss


def write_trained(model, tok, pipe, config, args, train_minutes: float, write_hf_files) -> None:
    """Stores the trained model as an fp16 checkpoint in args.out (write_hf_files adds
    config, tokenizer and processor files) and prints its validation accuracy, measured
    on the stored weights."""
    model.eval()
    state = {k: v.detach().to(torch.float16) for k, v in model.named_parameters()}
    with torch.no_grad():
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        acc, per_kind = accuracy(model, tok, pipe, "val", args.eval_samples)
    write_hf_files(args.out, tok, config)
    # Shards of at most 6 MB keep every bundled file small; HF loaders read the index.
    write_checkpoint(args.out, [TensorSpec(k, "F16", tuple(v.shape)) for k, v in state.items()],
                     lambda spec: state[spec.name], max_shard_size=SHARD_SIZE)
    print(f"trained {args.steps} steps in {train_minutes:.1f} min; fp16 val exact-match {acc * 100:.1f}%")
    for k, (c, n) in sorted(per_kind.items()):
        print(f"  {k:16s} {c}/{n}")
    print(f"wrote {args.out}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["dense", "moe"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (more than the free cores makes it much slower)")
    ap.add_argument("--describe-fraction", type=float, default=0.25,
                    help="share of training samples that describe the whole picture")
    ap.add_argument("--aux-weight", type=float, default=0.5,
                    help="weight of the per-patch colour/shape loss on the vision features")
    ap.add_argument("--kind-weight", action="append", default=[], metavar="KIND=W",
                    help="draw question KIND W times as often as the others (default 1); repeatable")
    ap.add_argument("--init", help="start from the weights of this checkpoint (continued training)")
    ap.add_argument("--upcycle", metavar="DENSE_CKPT",
                    help="moe only: start from a trained dense checkpoint (sparse upcycling): every "
                         "weight but the decoder MLPs is copied, expert e takes the hidden units "
                         "[(e mod 4)*128, +128) of the dense MLP, routers start random")
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--eval-samples", type=int, default=200)
    args = ap.parse_args()

    kind_weights = parse_kind_weights(args.kind_weight, task.QUESTION_KINDS)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = sm.build_tokenizer()
    config = sm.model_config(tok, args.variant)
    model = LlavaForConditionalGeneration(config)
    init_weights(model)
    if args.init:
        load_weights(model, args.init, args.variant)
        print(f"continuing from {args.init}", flush=True)
    if args.upcycle:
        if args.variant != "moe" or args.init:
            raise SystemExit("--upcycle needs --variant moe and no --init")
        upcycle(model, config, args.upcycle)
        print(f"upcycled from {args.upcycle}", flush=True)
    model.train()
    # Auxiliary heads (training only, not saved): the colour and the shape of the
    # object in each patch, read from the vision tower's features. Dense targets
    # teach the vision tower to see shapes long before the answer loss alone would.
    vision_hidden = config["vision_config"]["hidden_size"]
    aux_head = nn.Linear(vision_hidden, len(task.COLOR_NAMES) + 1 + len(task.SHAPES) + 1)
    init_weights(aux_head)
    pipe = sm.Pipeline(tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.variant}: {n_params:,} parameters, vocab {config['text_config']['vocab_size']}, "
          f"{sm.NUM_IMAGE_TOKENS} image tokens", flush=True)

    router = router_hooks(model, config)
    opt = make_optimizer(model, aux_head, args.lr)
    lr_at = lr_schedule(args.lr, args.warmup, args.steps)

    start = time.time()
    running = None
    for step in range(args.steps):
        rng = random.Random(args.seed * 1_000_003 + step)
        idx = range(step * args.batch_size, (step + 1) * args.batch_size)
        px, ids, labels, patch_colors, patch_shapes = pipe.batch("train", idx, rng, args.describe_fraction,
                                                                          kind_weights)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        router[0].clear()
        vision_states = []
        hook = model.vision_tower.register_forward_hook(lambda m, i, o: vision_states.append(o.hidden_states[-1]))
        logits = model(ids, pixel_values=px)
        hook.remove()
        # drop CLS: one row per patch
        loss = train_step(model, aux_head, opt, logits, labels, vision_states[0][:, 1:], patch_colors, patch_shapes,
                          len(task.COLOR_NAMES) + 1, args.aux_weight, router)
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - start
            print(f"step {step:5d}  loss {running:.4f}  lr {lr_at(step):.2e}  {el / 60:6.1f} min", flush=True)
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            model.eval()
            with torch.no_grad():
                acc, _ = accuracy(model, tok, pipe, "val", args.eval_samples)
            model.train()
            print(f"step {step + 1:5d}  val exact-match {acc * 100:.1f}% ({args.eval_samples} samples)", flush=True)

    write_trained(model, tok, pipe, config, args, (time.time() - start) / 60, sm.write_hf_files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
