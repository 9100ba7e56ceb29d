"""The "shapes v2" demo VLM: tokenizer, configs, prompt format and data pipeline.

Variants, each with 144 image tokens per 192 px picture and a Llama decoder:
`dense` and `moe` (Mixtral blocks of 8 experts, top 2) in the LLaVA layout (CLIP-style
ViT with 16 px patches, MLP projector), and `idefics3` in the Idefics3/SmolVLM layout
(SigLIP-style ViT with 8 px patches, 576 of them, pixel-shuffled by 2 into 144 tokens,
a linear connector; the image wrapped in <fake_token_around_image><global-img> ...
<fake_token_around_image> as Idefics3Processor does).

Training packs several questions about one picture into one row: the prompt's image
prefix once, then each question with its answer as a segment that attends to the
prefix and itself only, at the positions it would have alone, so the picture's 144
tokens are paid once and no question sees another's answer. Shared by train.py,
make_examples.py and the tests.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kiln_models.common import rotate_half as _rotate_half  # noqa: E402
from kiln_models.image_processing import image_processor_for  # noqa: E402
from kiln_models.tokenizer import ByteLevelBPE, corpus_text  # noqa: E402
from shapes import model as v1  # noqa: E402
from shapes import task as v1_task  # noqa: E402

from . import task  # noqa: E402

IMAGE_SIZE = 192
PATCH_SIZE = 16
GRID_PATCHES = IMAGE_SIZE // PATCH_SIZE
NUM_IMAGE_TOKENS = GRID_PATCHES ** 2
assert GRID_PATCHES % task.GRID == 0, "cells are whole patches: the auxiliary targets rely on it"
VOCAB_TARGET = 640  # bytes + merges; special tokens come on top
EVAL_RENDER_SIZE = 256  # the shipped test pictures and the bundled examples
TRAIN_RENDER_SIZES = [192, 224, 256, 320]

SPECIALS = v1.SPECIALS
EXTRA_SPECIALS = v1.EXTRA_SPECIALS
PROMPT = v1.PROMPT

VARIANTS = ["dense", "moe", "idefics3"]
IDEFICS3_PATCH_SIZE = 8
IDEFICS3_SCALE = 2
assert (IMAGE_SIZE // IDEFICS3_PATCH_SIZE // IDEFICS3_SCALE) ** 2 == NUM_IMAGE_TOKENS
IDEFICS3_SPECIALS = ["<fake_token_around_image>", "<global-img>"]
# What Idefics3Processor (and Kiln) put around a single tile's image tokens.
IMAGE_OPEN = {"idefics3": "<fake_token_around_image><global-img>"}
IMAGE_CLOSE = {"idefics3": "<fake_token_around_image>"}

PREPROCESSOR = {
    "dense": dict(v1.PREPROCESSOR, size={"shortest_edge": IMAGE_SIZE},
                  crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
    # SmolVLM's processor with a single tile (no image splitting) of IMAGE_SIZE
    "idefics3": {
        "do_convert_rgb": True, "do_image_splitting": False, "do_normalize": True, "do_pad": True,
        "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Idefics3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": IMAGE_SIZE}, "processor_class": "Idefics3Processor", "resample": 1,
        "rescale_factor": v1.PREPROCESSOR["rescale_factor"], "size": {"longest_edge": 4 * IMAGE_SIZE},
    },
}
PREPROCESSOR["moe"] = PREPROCESSOR["dense"]


def variant_of(config: dict) -> str:
    """The variant a checkpoint's config.json describes."""
    if config.get("model_type") == "idefics3":
        return "idefics3"
    return "moe" if config["text_config"]["model_type"] == "mixtral" else "dense"


def build_tokenizer(variant: str = "dense") -> ByteLevelBPE:
    """Deterministic: trained on the task's text and the bundled English corpus; the
    idefics3 variant adds the two tokens that wrap its image."""
    texts = task.text_corpus() + [corpus_text()]
    tok = ByteLevelBPE.train(texts, VOCAB_TARGET, special_tokens=dict(SPECIALS), pretokenizer="gpt2",
                             bos_token="<s>", add_bos=True)
    next_id = tok.max_id + 1
    added = dict(tok.added_tokens)
    for t in EXTRA_SPECIALS + (IDEFICS3_SPECIALS if variant == "idefics3" else []):
        added[t] = next_id
        next_id += 1
    return ByteLevelBPE(tok.vocab, tok.merges, added, "gpt2", bos_token="<s>", add_bos=True)


def model_config(tok: ByteLevelBPE, variant: str) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} ({', '.join(VARIANTS)})")
    config = v1.model_config(tok, "dense" if variant == "idefics3" else variant)
    config["text_config"]["max_position_embeddings"] = 512
    if variant != "idefics3":
        config["vision_config"].update({"image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE})
        config["image_seq_length"] = NUM_IMAGE_TOKENS
        return config
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": tok.token_to_id("<image>"),
        "pad_token_id": tok.token_to_id("<pad>"),
        "scale_factor": IDEFICS3_SCALE,
        "tie_word_embeddings": False,
        "vocab_size": config["text_config"]["vocab_size"],
        "text_config": config["text_config"],
        "vision_config": {
            "model_type": "idefics3_vision", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 4, "image_size": IMAGE_SIZE, "patch_size": IDEFICS3_PATCH_SIZE,
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "num_channels": 3,
        },
        "torch_dtype": "float16",
    }


def prompt_ids(tok: ByteLevelBPE, question: str, image_tokens: int = NUM_IMAGE_TOKENS,
               variant: str = "dense") -> List[int]:
    """The first turn, <image> expanded to one id per image token as the model's
    processor does (fewer when the picture's tokens are pruned)."""
    image = IMAGE_OPEN.get(variant, "") + "<image>" * image_tokens + IMAGE_CLOSE.get(variant, "")
    return tok.encode(PROMPT.format(question=question).replace("<image>", image), add_special_tokens=True)


answer_ids = v1.answer_ids


class Pipeline:
    """Renders samples, preprocesses them like the checkpoint's image processor and
    builds padded training batches of packed questions."""

    def __init__(self, tok: ByteLevelBPE, variant: str = "dense"):
        self.tok = tok
        self.variant = variant
        self.processor = image_processor_for(PREPROCESSOR[variant])
        self.pad = tok.token_to_id("<pad>")
        self.image = tok.token_to_id("<image>")
        # tokens that are a colour or shape word (singular or plural): what a question names
        names = set(task.COLOR_NAMES) | set(task.SHAPES) | {v1_task._plural(s) for s in task.SHAPES}
        self.name_ids = {i for i in range(tok.max_id + 1) if tok.decode([i]).strip().lower() in names}
        self.split_relations = False  # attention_targets

    def pixels(self, image) -> np.ndarray:
        """[3, H, W] float32, as the checkpoint's image processor makes them."""
        out = self.processor.preprocess(image)
        return (out[0][0] if isinstance(out, tuple) else out)[0]

    def prompt_ids(self, question: str, image_tokens: int = NUM_IMAGE_TOKENS) -> List[int]:
        return prompt_ids(self.tok, question, image_tokens, self.variant)

    def example(self, split: str, index: int, render_size: int = EVAL_RENDER_SIZE):
        """pixel_values, prompt ids, answer ids (ending in </s>) and the sample."""
        s = task.sample_at(split, index)
        px = self.pixels(task.render(s.scene, render_size))
        return px, self.prompt_ids(s.question), answer_ids(self.tok, s.answer), s

    def vision_grid(self) -> int:
        """Patches per side of the vision tower."""
        return IMAGE_SIZE // (IDEFICS3_PATCH_SIZE if self.variant == "idefics3" else PATCH_SIZE)

    def pack(self, qas, image_tokens: int = NUM_IMAGE_TOKENS):
        """Several questions about one picture as one row: the prompt up to its last image
        token once, then each question + answer as a segment that sees that prefix and
        itself only, at the positions it would have alone (see forward_packed). -> ids,
        labels (the answer tokens, each at the position that predicts it), positions and
        segment numbers (0: the prefix)."""
        ids: List[int] = []
        labels: List[int] = []
        positions: List[int] = []
        segments: List[int] = []
        prefix = None
        for i, (q, a, _) in enumerate(qas):
            p = self.prompt_ids(q, image_tokens)
            cut = max(k for k, t in enumerate(p) if t == self.image) + 1
            if prefix is None:
                prefix = p[:cut]
                ids += prefix
                labels += [-100] * cut
                positions += list(range(cut))
                segments += [0] * cut
            assert p[:cut] == prefix, "every question's prompt starts with the same image prefix"
            ans = answer_ids(self.tok, a)
            seg = p[cut:] + ans
            ids += seg
            # position t predicts token t+1: the answer tokens (and </s>) are the targets
            labels += [-100] * (len(p) - cut - 1) + ans + [-100]
            positions += list(range(cut, cut + len(seg)))
            segments += [i + 1] * len(seg)
        return ids, labels, positions, segments

    def batch(self, indices: Sequence[int], rng: random.Random, questions: int, aux_fraction: float,
              kind_weights: Optional[dict] = None, prune_fraction: float = 0.0):
        """-> pixel_values [B,3,H,W], input_ids [B,T], labels [B,T] (-100 = ignored), the
        per-patch colour and shape classes [B, patches] (the auxiliary targets), the image
        tokens each sample keeps [B], positions [B,T], segments [B,T] (-1: padding) and
        the attention targets of the answers (attention_targets).
        Sample b is the training scene indices[b] with `questions` questions about it
        (see pack); with probability prune_fraction it keeps only a random 25-100% of its
        image tokens (those Kiln's visual-token pruning would keep, see keep_tokens)."""
        rows, scenes, pxs, keeps, qass = [], [], [], [], []
        for i in indices:
            scene = task.scene_at("train", i)
            qas = task.questions(rng, scene, questions, aux_fraction, kind_weights)
            qass.append(qas)
            keep = NUM_IMAGE_TOKENS
            if prune_fraction > 0 and rng.random() < prune_fraction:
                keep = rng.randint(NUM_IMAGE_TOKENS // 4, NUM_IMAGE_TOKENS)
            keeps.append(keep)
            rows.append(self.pack(qas, keep))
            scenes.append(scene)
            pxs.append(self.pixels(task.render(scene, rng.choice(TRAIN_RENDER_SIZES))))
        length = max(len(r[0]) for r in rows)
        ids = np.full((len(rows), length), self.pad, dtype=np.int64)
        labels = np.full((len(rows), length), -100, dtype=np.int64)
        positions = np.zeros((len(rows), length), dtype=np.int64)
        segments = np.full((len(rows), length), -1, dtype=np.int64)
        for b, (seq, lab, pos, seg) in enumerate(rows):
            ids[b, :len(seq)] = seq
            labels[b, :len(lab)] = lab
            positions[b, :len(pos)] = pos
            segments[b, :len(seg)] = seg
        colors, shapes = patch_targets(scenes, self.vision_grid())
        return (torch.from_numpy(np.stack(pxs)), torch.from_numpy(ids), torch.from_numpy(labels), colors, shapes,
                torch.tensor(keeps), torch.from_numpy(positions), torch.from_numpy(segments),
                attention_targets(scenes, qass, keeps, labels, segments, ids, self.name_ids, self.split_relations))


def keep_tokens(features: torch.Tensor, keep: int) -> torch.Tensor:
    """The rows of one picture's projected features [S, D] that kiln.select_tokens with
    the `distinct` score keeps: the `keep` least similar (cosine) to the mean row, in
    their original order (ties: the earlier row)."""
    if keep >= features.shape[0]:
        return features
    return features[kept_rows(features, keep)]


def kept_rows(features: torch.Tensor, keep: int) -> List[int]:
    """The indices of the rows keep_tokens keeps, ascending."""
    with torch.no_grad():
        f = features.double()
        mean = f.mean(0)
        score = 1.0 - (f @ mean) / torch.sqrt((f * f).sum(-1) * (mean * mean).sum()).clamp_min(1e-300)
        return sorted(sorted(range(f.shape[0]), key=lambda r: (-float(score[r]), r))[:keep])


# Teaching the decoder where to look (train.py --attend-weight). At the position that
# predicts the answer, one head (the lookup head) of one layer is trained to attend to the
# image tokens of what a lookup question names; another (the count head) to attend to the
# sequence's first token (a sink) and to every counted object with equal weight, so that
# the share left on the sink, 1 / (1 + count), tells the count.
# With split relations, a relation's two objects are looked up by two heads: the lookup
# head takes the first named, a second head the other (each from its own words).
ATTEND_KINDS = ("color_of_shape", "shape_of_color", "exists", "position", "relation", "read")
COUNT_KINDS = ("count_shape", "count_color", "count_all")
LOOKUP, COUNT, SECOND = 0, 1, 2


def attention_targets(scenes, qass, keeps, labels: np.ndarray, segments: np.ndarray, ids: np.ndarray,
                      name_ids, split_relations: bool = False):
    """For every packed question whose picture keeps all its image tokens and that is
    either a lookup (ATTEND_KINDS) naming something in the scene (task.referents) or a
    count (COUNT_KINDS): the row, the position that predicts the answer's first token,
    LOOKUP or COUNT, a distribution over the sink (column 0) and the image tokens
    (columns 1..NUM_IMAGE_TOKENS), and one over the row's tokens, uniform over the
    question's colour and shape words (name_ids; all zero when it names none) ->
    (rows [N], positions [N], roles [N], targets [N, 1 + tokens], words [N, T]).
    With split_relations a relation gives two entries: LOOKUP on the first named object
    and its words, SECOND on the other and its words."""
    per_cell = GRID_PATCHES // task.GRID
    rows, poss, roles, targets, words = [], [], [], [], []
    for b, (scene, qas) in enumerate(zip(scenes, qass)):
        if keeps[b] != NUM_IMAGE_TOKENS:
            continue
        for i, (q, _, kind) in enumerate(qas):
            if kind not in ATTEND_KINDS and kind not in COUNT_KINDS:
                continue
            cells = task.referents(scene, q, kind)
            if kind in ATTEND_KINDS and not cells:
                continue
            p = int(np.flatnonzero((segments[b] == i + 1) & (labels[b] != -100))[0])
            named = [j for j in range(ids.shape[1])
                     if segments[b, j] == i + 1 and j <= p and int(ids[b, j]) in name_ids]
            if split_relations and kind == "relation" and len(cells) == 2 and len(named) == 4:
                entries = [(LOOKUP, cells[:1], named[:2]), (SECOND, cells[1:], named[2:])]
            else:
                entries = [(COUNT if kind in COUNT_KINDS else LOOKUP, cells, named)]
            for role, where, said in entries:
                t = np.zeros(1 + NUM_IMAGE_TOKENS, dtype=np.float32)
                for r, c in where:  # each object weighs 1, spread over its cell's tokens
                    for pr in range(per_cell):
                        first = 1 + (r * per_cell + pr) * GRID_PATCHES + c * per_cell
                        t[first:first + per_cell] = 1.0 / (per_cell * per_cell)
                if kind in COUNT_KINDS:
                    t[0] = 1.0
                w = np.zeros(ids.shape[1], dtype=np.float32)
                w[said] = 1.0
                rows.append(b)
                poss.append(p)
                roles.append(role)
                targets.append(t / t.sum())
                words.append(w / max(w.sum(), 1.0))
    return (torch.tensor(rows, dtype=torch.long), torch.tensor(poss, dtype=torch.long),
            torch.tensor(roles, dtype=torch.long),
            torch.from_numpy(np.stack(targets)) if targets else torch.zeros(0, 1 + NUM_IMAGE_TOKENS),
            torch.from_numpy(np.stack(words)) if words else torch.zeros(0, ids.shape[1]))


def attention_loss(layer, h: torch.Tensor, cos, sin, mask: torch.Tensor, image: torch.Tensor, attend,
                   heads: Sequence[int]) -> torch.Tensor:
    """Cross-entropy between the attention of the lookup, count and second heads (heads,
    by role; -1: not taught) at the answer positions of `attend` (attention_targets) and the targets over
    the sink (the row's first token) and the image tokens (`image`: [B, T] bool)."""
    rows, poss, roles, targets = attend[:4]
    head = torch.tensor(heads)[roles]
    use = head >= 0
    if not bool(use.any()):
        return h.new_zeros(())
    rows, poss, head, targets = rows[use], poss[use], head[use], targets[use]
    logp = head_log_attention(layer, h, cos, sin, mask, rows, poss, head)
    full = torch.zeros_like(logp)
    full[:, 0] = targets[:, 0]
    full[image[rows]] = targets[:, 1:].reshape(-1)
    return -(full * logp).sum(-1).mean()


def word_loss(layer, h: torch.Tensor, cos, sin, mask: torch.Tensor, attend, heads: Sequence[int]) -> torch.Tensor:
    """Cross-entropy between the attention of the word heads (heads, by role; -1: not
    taught) at the answer positions of `attend` and the question's colour and shape words
    (attention_targets): where the lookup heads' queries come from."""
    rows, poss, roles, words = attend[0], attend[1], attend[2], attend[4]
    head = torch.tensor(list(heads))[roles]
    use = (words.sum(-1) > 0) & (head >= 0)
    if not bool(use.any()):
        return h.new_zeros(())
    rows, poss, words, head = rows[use], poss[use], words[use], head[use]
    return -(words * head_log_attention(layer, h, cos, sin, mask, rows, poss, head)).sum(-1).mean()


def head_log_attention(layer, h: torch.Tensor, cos, sin, mask: torch.Tensor, rows, poss, head) -> torch.Tensor:
    """The log attention [N, T] of head head[n] of `layer` at position poss[n] of row
    rows[n] over that row's tokens (h: the layer's input [B, T, D])."""
    attn = layer.self_attn
    x = layer.input_layernorm(h)
    b, t, _ = x.shape
    d = attn.head_dim
    q = attn.q_proj(x).view(b, t, attn.num_heads, d)[rows, poss, head]  # [N, d]
    k = attn.k_proj(x).view(b, t, attn.num_kv_heads, d).transpose(1, 2)
    k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
    q = q * cos[rows, poss] + _rotate_half(q) * sin[rows, poss]
    k = k[rows, head // (attn.num_heads // attn.num_kv_heads)]  # [N, T, d]
    scores = torch.einsum("nd,ntd->nt", q, k) * attn.scaling + mask[rows, 0, poss]
    return torch.log_softmax(scores, dim=-1)


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """Additive attention mask [B, 1, T, T] of packed rows: a token sees the earlier
    tokens of the prefix (segment 0) and of its own segment."""
    i = torch.arange(segments.shape[1])
    causal = (i[None, :] <= i[:, None])[None]
    same = (segments[:, None, :] == 0) | (segments[:, None, :] == segments[:, :, None])
    allowed = causal & same & (segments[:, None, :] >= 0)
    zero = torch.zeros(())
    return torch.where(allowed, zero, torch.tensor(torch.finfo(torch.float32).min))[:, None]


def forward_packed(model, ids: torch.Tensor, px: torch.Tensor, keeps: torch.Tensor, positions: torch.Tensor,
                   segments: torch.Tensor, attend=None, attend_layer: int = 1, attend_heads=(0, -1, -1),
                   word_heads=(-1, -1, -1), original_positions: bool = False):
    """The model's forward on packed rows (Pipeline.batch), sample b's image tokens cut to
    keeps[b] (its ids carry that many) -> logits [B, T, vocab]: each segment's logits
    are those of its question asked alone. With `attend` (attention_targets) -> logits
    and the attention loss of the lookup, count and second heads attend_heads in layer
    attend_layer (attention_loss), plus that of the word heads word_heads (by role) in the
    layer before (word_loss). With original_positions, a kept image token is at the
    position it has unpruned and the tokens after the image are where they are unpruned
    (kiln-compile --visual-token-positions=original); else the kept tokens are
    consecutive (original_position_ids)."""
    if hasattr(model, "language_model"):  # LLaVA
        lm = model.language_model
        image_id, body, logits = model.image_token_index, lm.model, lm.logits
    else:  # Idefics3
        image_id, body, logits = model.image_token_id, model.model.text_model, model.logits
    mask = ids == image_id
    features = model.get_image_features(px)
    kept = torch.cat([keep_tokens(features[b], int(keeps[b])) for b in range(features.shape[0])])
    if original_positions:
        positions = original_position_ids(positions, mask, features, keeps)
    h = body.embed(ids)
    h = h.masked_scatter(mask[..., None].expand_as(h), kept.to(h.dtype))
    cos, sin = body.rotary_emb(positions)
    attn = segment_mask(segments)
    extra = None
    for i, layer in enumerate(body.layers):
        if attend is not None and i == attend_layer and len(attend[0]):
            loss = attention_loss(layer, h, cos, sin, attn, mask, attend, attend_heads)
            extra = loss if extra is None else extra + loss
        if attend is not None and i == attend_layer - 1 and max(word_heads) >= 0 and len(attend[0]):
            loss = word_loss(layer, h, cos, sin, attn, attend, word_heads)
            extra = loss if extra is None else extra + loss
        h = layer(h, cos, sin, attn)
    out = logits(body.norm(h))
    if attend is None:
        return out
    return out, (extra if extra is not None else out.new_zeros(()))


def original_position_ids(positions: torch.Tensor, mask: torch.Tensor, features: torch.Tensor,
                          keeps: torch.Tensor) -> torch.Tensor:
    """Packed rows' positions [B, T] with each pruned picture's kept image tokens (mask
    [B, T]: the image tokens) at their positions in the unpruned picture, and every
    token after the image moved on by the tokens removed: the RoPE positions Kiln gives
    an artifact compiled with --visual-token-positions=original."""
    positions = positions.clone()
    for b in range(features.shape[0]):
        keep = int(keeps[b])
        if keep >= features.shape[1]:
            continue
        where = torch.nonzero(mask[b]).flatten()
        first, last = int(where[0]), int(where[-1])
        base = int(positions[b, first])
        positions[b, where] = base + torch.tensor(kept_rows(features[b], keep), dtype=positions.dtype)
        positions[b, last + 1:] += features.shape[1] - keep
    return positions


# Auxiliary per-patch classes: colour (the 6 colours, the sign, empty) and shape
# (the 4 shapes, the 10 digits, empty).
AUX_COLORS = len(task.COLOR_NAMES) + 2
AUX_SHAPES = len(task.SHAPES) + len(task.DIGITS) + 1


def patch_cells(grid: int = GRID_PATCHES) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per patch of a grid x grid vision tower: the row and column of its scene cell."""
    per_cell = grid // task.GRID
    idx = torch.arange(grid * grid)
    return idx // grid // per_cell, idx % grid // per_cell


def patch_targets(scenes, grid: int = GRID_PATCHES) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per patch of a grid x grid vision tower: the classes of what covers it."""
    per_cell = grid // task.GRID
    n = grid * grid
    colors = torch.full((len(scenes), n), AUX_COLORS - 1, dtype=torch.long)
    shapes = torch.full((len(scenes), n), AUX_SHAPES - 1, dtype=torch.long)

    def put(b, row, col, color, shape):
        for pr in range(per_cell):
            for pc in range(per_cell):
                p = (row * per_cell + pr) * grid + col * per_cell + pc
                colors[b, p] = color
                shapes[b, p] = shape

    for b, scene in enumerate(scenes):
        for o in scene.objects:
            put(b, o.row, o.col, task.COLOR_NAMES.index(o.color), task.SHAPES.index(o.shape))
        if scene.sign is not None:
            put(b, scene.sign.row, scene.sign.col, len(task.COLOR_NAMES),
                len(task.SHAPES) + task.DIGITS.index(scene.sign.digit))
    return colors, shapes


def write_hf_files(out: str, tok: ByteLevelBPE, config: dict) -> None:
    variant = variant_of(config)
    v1.write_hf_files(out, tok, config, PREPROCESSOR[variant])
    if variant == "idefics3":
        with open(os.path.join(out, "processor_config.json"), "w") as f:
            json.dump({"image_seq_len": NUM_IMAGE_TOKENS, "processor_class": "Idefics3Processor"}, f, indent=2)
            f.write("\n")
