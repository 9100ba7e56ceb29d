#!/usr/bin/env python3
"""Trains a "shapes v2" demo VLM on CPU, reproducibly, and writes a Hugging Face
checkpoint directory (fp16 safetensors, config, tokenizer, processor config).

    python3 tests/models/shapes_v2/train.py --variant dense --out /tmp/v2/dense --steps 8000

A step is --batch-size pictures with --questions questions each, packed as one chat
per picture. Everything is seeded: step s uses the training scenes
seed*10^7 + [s*B, (s+1)*B) and a question/size generator seeded by (seed, s); initialisation uses
torch.manual_seed(seed). Every --save-every steps the model and optimiser state go to
OUT/train_state.pt; --resume continues from there with the same result as an
uninterrupted run (the same thread count assumed).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kiln_models.idefics3 import Idefics3ForConditionalGeneration  # noqa: E402
from kiln_models.llava import LlavaForConditionalGeneration  # noqa: E402
from shapes.evaluate import accuracy  # noqa: E402
from shapes.train import (init_weights, load_weights, lr_schedule, make_optimizer, parse_kind_weights,  # noqa: E402
                          router_hooks, train_step, upcycle, write_trained)
from shapes_v2 import model as sm  # noqa: E402
from shapes_v2 import task  # noqa: E402


class Steps(torch.utils.data.Dataset):
    """The batch of each training step from `first` on."""

    def __init__(self, pipe, args, kind_weights, first: int):
        self.pipe, self.args, self.kind_weights, self.first = pipe, args, kind_weights, first

    def __len__(self) -> int:
        return self.args.steps - self.first

    def __getitem__(self, i: int):
        a = self.args
        step = self.first + i
        rng = random.Random(a.seed * 1_000_003 + step)
        base = a.seed * 10_000_000  # another seed, other scenes
        idx = range(base + step * a.batch_size, base + (step + 1) * a.batch_size)
        return self.pipe.batch(idx, rng, a.questions, a.describe_fraction, self.kind_weights, a.prune_visual)


def init_text_from(model: nn.Module, path: str) -> None:
    """idefics3: the decoder (embeddings, layers, norm, head) from a trained dense
    checkpoint of the same text shape; rows of tokens the dense tokenizer lacks (the
    image wrappers, after its last id) keep their initialisation."""
    from kiln_models.safetensors_io import Checkpoint
    with Checkpoint(path) as ckpt:
        dense = {name: torch.from_numpy(np.array(ckpt.get_numpy(name))).float() for name in ckpt.keys()}
    own = model.state_dict()
    state = {}
    for name, t in dense.items():
        if name.startswith("language_model.model."):
            key = "model.text_model." + name[len("language_model.model."):]
        elif name == "language_model.lm_head.weight":
            key = "lm_head.weight"
        else:
            continue
        if key not in own or own[key].shape[1:] != t.shape[1:] or own[key].shape[0] < t.shape[0]:
            raise SystemExit(f"{path}: {name} {tuple(t.shape)} does not fit {key}")
        row = own[key].clone()
        row[:t.shape[0]] = t
        state[key] = row
    missing = [k for k in own if k.startswith("model.text_model.") and k not in state and not k.endswith("inv_freq")]
    if missing:
        raise SystemExit(f"{path}: no {missing[0]} for the idefics3 decoder")
    model.load_state_dict(state, strict=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=sm.VARIANTS, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--batch-size", type=int, default=16, help="pictures per step")
    ap.add_argument("--questions", type=int, default=6, help="questions packed per picture")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (more than the free cores makes it much slower)")
    ap.add_argument("--workers", type=int, default=1, help="processes rendering batches ahead (0: none)")
    ap.add_argument("--describe-fraction", type=float, default=0.15,
                    help="share of the questions that ask for a description of the whole picture")
    ap.add_argument("--aux-weight", type=float, default=0.5,
                    help="weight of the per-patch colour/shape loss on the vision features")
    ap.add_argument("--aux-position", type=float, default=0.0, metavar="W",
                    help="weight of an auxiliary loss on the vision features: the row and column of the "
                         "cell each patch lies in")
    ap.add_argument("--attend-weight", type=float, default=0.0, metavar="W",
                    help="weight of the loss that teaches decoder heads where to look: at the answer "
                         "position, attention on the image tokens of what the question names or counts "
                         "(model.attention_targets)")
    ap.add_argument("--attend-layer", type=int, default=1, help="decoder layer of that head")
    ap.add_argument("--attend-head", type=int, default=0, help="the head that looks up what a question names")
    ap.add_argument("--count-head", type=int, default=-1,
                    help="the head taught to attend to the counted objects and a sink (-1: none)")
    ap.add_argument("--second-heads", type=lambda v: tuple(int(x) for x in v.split(",")), metavar="H,W",
                    help="look up a relation's two objects apart: head H (of the lookup layer) on the second "
                         "named, from head W of the layer before on its words")
    ap.add_argument("--word-head", type=int, default=-1,
                    help="a head of the layer before, taught to attend from the answer position to the "
                         "question's colour and shape words (-1: none)")
    ap.add_argument("--prune-visual", type=float, default=0.0, metavar="P",
                    help="share of pictures trained with only 25-100%% of their image tokens, those "
                         "--visual-tokens (score distinct) keeps: makes the model robust to the pruning")
    ap.add_argument("--original-positions", action="store_true",
                    help="a pruned picture's kept image tokens keep their unpruned RoPE positions, and the "
                         "text after it too (kiln-compile --visual-token-positions=original)")
    ap.add_argument("--kind-weight", action="append", default=[], metavar="KIND=W",
                    help="draw question KIND W times as often as the others (default 1); repeatable")
    ap.add_argument("--init", help="start from the weights of this checkpoint directory or a stage's "
                                   "train_state.pt (continued training)")
    ap.add_argument("--upcycle", metavar="DENSE_CKPT",
                    help="moe only: start from a trained dense checkpoint (sparse upcycling)")
    ap.add_argument("--init-text", metavar="DENSE_CKPT",
                    help="idefics3 only: start the decoder from a trained dense checkpoint")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/train_state.pt")
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--stop-at", type=int, metavar="STEP",
                    help="stop before this step (the schedule stays --steps long): save the state for --resume "
                         "and exit without writing the checkpoint")
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--eval-samples", type=int, default=300)
    args = ap.parse_args()

    kind_weights = parse_kind_weights(args.kind_weight, task.QUESTION_KINDS)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = sm.build_tokenizer(args.variant)
    config = sm.model_config(tok, args.variant)
    model = (Idefics3ForConditionalGeneration if args.variant == "idefics3" else LlavaForConditionalGeneration)(config)
    init_weights(model)
    if args.init:
        load_weights(model, args.init, args.variant)
        print(f"continuing from {args.init}", flush=True)
    if args.upcycle:
        if args.variant != "moe" or args.init:
            raise SystemExit("--upcycle needs --variant moe and no --init")
        upcycle(model, config, args.upcycle)
        print(f"upcycled from {args.upcycle}", flush=True)
    if args.init_text:
        if args.variant != "idefics3" or args.init:
            raise SystemExit("--init-text needs --variant idefics3 and no --init")
        init_text_from(model, args.init_text)
        print(f"decoder from {args.init_text}", flush=True)
    model.train()
    # Auxiliary heads (training only, not saved): per patch, the colour and the shape or
    # digit of what covers it, read from the vision tower's features.
    aux_head = nn.Linear(config["vision_config"]["hidden_size"], sm.AUX_COLORS + sm.AUX_SHAPES)
    if args.aux_position:
        # and the row and column of the cell each patch lies in: the features keep where
        # they come from (position and relation answers need it)
        aux_head.position = nn.Linear(config["vision_config"]["hidden_size"], 2 * task.GRID)
    init_weights(aux_head)
    pipe = sm.Pipeline(tok, args.variant)
    cell_rows, cell_cols = sm.patch_cells(pipe.vision_grid())
    # heads taught where to look, by role (model.LOOKUP, COUNT, SECOND); -1: none
    second, second_word = args.second_heads if args.second_heads else (-1, -1)
    heads = (args.attend_head, args.count_head, second)
    word_heads = (args.word_head, args.word_head, second_word)
    pipe.split_relations = bool(args.second_heads)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.variant}: {n_params:,} parameters, vocab {config['text_config']['vocab_size']}, "
          f"{sm.NUM_IMAGE_TOKENS} image tokens", flush=True)

    router = router_hooks(model, config)
    opt = make_optimizer(model, aux_head, args.lr)
    lr_at = lr_schedule(args.lr, args.warmup, args.steps)

    state_path = os.path.join(args.out, "train_state.pt")
    first, running, elapsed, attending = 0, None, 0.0, None
    if args.resume:
        st = torch.load(state_path)
        model.load_state_dict(st["model"])
        aux_head.load_state_dict(st["aux"])
        opt.load_state_dict(st["opt"])
        first, running, elapsed = st["step"], st["running"], st["elapsed"]
        print(f"resumed at step {first} ({elapsed / 60:.1f} min trained)", flush=True)
    os.makedirs(args.out, exist_ok=True)

    # One worker process renders the next batches while this one trains (batches are a
    # pure function of the step, so the result does not depend on it).
    steps = Steps(pipe, args, kind_weights, first)
    loader = torch.utils.data.DataLoader(steps, batch_size=None, num_workers=args.workers,
                                         **({"prefetch_factor": 2} if args.workers else {}))
    start = time.time() - elapsed
    end = min(args.steps, args.stop_at) if args.stop_at else args.steps
    for step, (px, ids, labels, patch_colors, patch_shapes, keeps, positions, segments, attend) in zip(
            range(first, end), loader):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        router[0].clear()
        vision_states = []
        if args.variant == "idefics3":  # SigLIP: no class token
            hook = model.model.vision_model.register_forward_hook(
                lambda m, i, o: vision_states.append(o.last_hidden_state))
        else:  # CLIP: the class token first
            hook = model.vision_tower.register_forward_hook(lambda m, i, o: vision_states.append(o.hidden_states[-1][:, 1:]))
        logits, attend_loss = sm.forward_packed(model, ids, px, keeps, positions, segments, attend,
                                                args.attend_layer, heads, word_heads, args.original_positions)
        hook.remove()
        extra = args.attend_weight * attend_loss
        if args.aux_position:
            pos = aux_head.position(vision_states[0])
            extra = extra + args.aux_position * (
                F.cross_entropy(pos[..., :task.GRID].reshape(-1, task.GRID), cell_rows.repeat(pos.shape[0])) +
                F.cross_entropy(pos[..., task.GRID:].reshape(-1, task.GRID), cell_cols.repeat(pos.shape[0])))
        loss = train_step(model, aux_head, opt, logits, labels, vision_states[0], patch_colors, patch_shapes,
                          sm.AUX_COLORS, args.aux_weight, router, extra)
        attending = attend_loss.item() if attending is None else 0.95 * attending + 0.05 * attend_loss.item()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - start
            print(f"step {step:5d}  loss {running:.4f}  attend {attending:.3f}  lr {lr_at(step):.2e}  "
                  f"{el / 60:6.1f} min", flush=True)
        if step + 1 < args.steps and ((args.save_every and (step + 1) % args.save_every == 0) or step + 1 == end):
            tmp = state_path + ".tmp"
            torch.save({"model": model.state_dict(), "aux": aux_head.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1, "running": running, "elapsed": time.time() - start}, tmp)
            os.replace(tmp, state_path)
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            model.eval()
            with torch.no_grad():
                acc, per_kind = accuracy(model, tok, pipe, "val", args.eval_samples)
            model.train()
            kinds = "  ".join(f"{k} {c}/{n}" for k, (c, n) in sorted(per_kind.items()))
            print(f"step {step + 1:5d}  val exact-match {acc * 100:.1f}% ({args.eval_samples}): {kinds}", flush=True)

    if end < args.steps:
        print(f"stopped before step {end} of {args.steps}: {state_path} holds the state (--resume)")
        return 0
    write_trained(model, tok, pipe, config, args, (time.time() - start) / 60, sm.write_hf_files)
    if os.path.exists(state_path):
        os.remove(state_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
