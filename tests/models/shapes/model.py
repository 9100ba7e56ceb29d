"""The "shapes" demo VLM: its tokenizer, configs, prompt format and data pipeline.

A LLaVA-layout model (CLIP-style ViT + MLP projector + Llama decoder), small enough to
train on a laptop CPU, in two variants: `dense`, and `moe` whose decoder MLPs are
Mixtral blocks of 8 experts with top-2 routing. Shared by train.py and eval.py.
"""

from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from kiln_models.image_processing import CLIPImageProcessor
from kiln_models.tokenizer import ByteLevelBPE, corpus_text

from . import task

IMAGE_SIZE = 128
PATCH_SIZE = 32
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
VOCAB_TARGET = 512  # bytes + merges; special tokens come on top

SPECIALS = {"<unk>": 0, "<s>": 1, "</s>": 2}
EXTRA_SPECIALS = ["<image>", "<pad>"]

PROMPT = "USER: <image>\n{question} ASSISTANT:"

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

PREPROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "processor_class": "LlavaProcessor",
    "do_convert_rgb": True,
    "do_resize": True,
    "size": {"shortest_edge": IMAGE_SIZE},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "do_rescale": True,
    "rescale_factor": 0.00392156862745098,
    "do_normalize": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
}


def build_tokenizer() -> ByteLevelBPE:
    """Deterministic: trained on the task's text and the bundled English corpus."""
    texts = task.text_corpus() + [corpus_text()]
    tok = ByteLevelBPE.train(texts, VOCAB_TARGET, special_tokens=dict(SPECIALS), pretokenizer="gpt2",
                             bos_token="<s>", add_bos=True)
    # <image> and <pad> go after the learned vocabulary, like LLaVA's image token.
    next_id = tok.max_id + 1
    added = dict(tok.added_tokens)
    for t in EXTRA_SPECIALS:
        added[t] = next_id
        next_id += 1
    return ByteLevelBPE(tok.vocab, tok.merges, added, "gpt2", bos_token="<s>", add_bos=True)


def model_config(tok: ByteLevelBPE, variant: str) -> dict:
    vocab = tok.max_id + 1
    text = {
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": SPECIALS["<s>"],
        "eos_token_id": SPECIALS["</s>"],
        "pad_token_id": tok.token_to_id("<pad>"),
    }
    if variant == "moe":
        text.update({
            "model_type": "mixtral",
            "intermediate_size": 128,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "router_aux_loss_coef": 0.02,
            "sliding_window": None,
        })
        text.pop("attention_bias")
        text.pop("mlp_bias")
    elif variant != "dense":
        raise ValueError(f"unknown variant {variant!r} (dense, moe)")
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": 128,
    }
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": tok.token_to_id("<image>"),
        "pad_token_id": tok.token_to_id("<pad>"),
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "image_seq_length": NUM_IMAGE_TOKENS,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": "float16",
    }


def prompt_ids(tok: ByteLevelBPE, question: str) -> List[int]:
    """Token ids of the prompt with <image> expanded to one id per image token, as
    LlavaProcessor does."""
    text = PROMPT.format(question=question).replace("<image>", "<image>" * NUM_IMAGE_TOKENS)
    return tok.encode(text, add_special_tokens=True)


def answer_ids(tok: ByteLevelBPE, answer: str) -> List[int]:
    return tok.encode(" " + answer) + [SPECIALS["</s>"]]


class Pipeline:
    """Renders samples, preprocesses images like the checkpoint's image processor and
    builds padded training batches."""

    def __init__(self, tok: ByteLevelBPE):
        self.tok = tok
        self.processor = CLIPImageProcessor(PREPROCESSOR)
        self.pad = tok.token_to_id("<pad>")

    def pixels(self, image) -> np.ndarray:
        return self.processor.preprocess(image)[0]

    def example(self, split: str, index: int, render_size: int, aux_fraction: float = 0.0,
                kind_weights: Optional[dict] = None) -> Tuple[np.ndarray, List[int], List[int], task.Sample]:
        """pixel_values, prompt ids, answer ids (ending in </s>) and the sample."""
        s = task.sample_at(split, index, aux_fraction=aux_fraction, kind_weights=kind_weights)
        px = self.pixels(task.render(s.scene, render_size))
        return px, prompt_ids(self.tok, s.question), answer_ids(self.tok, s.answer), s

    def batch(self, split: str, indices: Sequence[int], rng: random.Random, aux_fraction: float = 0.0,
              kind_weights: Optional[dict] = None):
        """-> pixel_values [B,3,H,W], input_ids [B,T], labels [B,T] (-100 = ignored), and the
        per-patch colour and shape classes [B, patches] (the auxiliary training targets)."""
        items = [self.example(split, i, rng.choice([128, 160, 192, 256]), aux_fraction, kind_weights)
                 for i in indices]
        length = max(len(p) + len(a) for _, p, a, _ in items)
        ids = np.full((len(items), length), self.pad, dtype=np.int64)
        labels = np.full((len(items), length), -100, dtype=np.int64)
        for b, (_, p, a, _) in enumerate(items):
            seq = p + a
            ids[b, : len(seq)] = seq
            # position t predicts token t+1: answer tokens (and </s>) are the targets
            labels[b, len(p) - 1 : len(seq) - 1] = a
        px = np.stack([x for x, _, _, _ in items])
        colors, shapes = patch_targets([s.scene for _, _, _, s in items])
        return torch.from_numpy(px), torch.from_numpy(ids), torch.from_numpy(labels), colors, shapes


GRID_PATCHES = IMAGE_SIZE // PATCH_SIZE
assert GRID_PATCHES == task.GRID, "one patch per grid cell: the auxiliary targets rely on it"


def patch_targets(scenes) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-patch classes: the colour and the shape of the object in each grid cell
    (the last class of each means "empty")."""
    n = GRID_PATCHES * GRID_PATCHES
    colors = torch.full((len(scenes), n), len(task.COLOR_NAMES), dtype=torch.long)
    shapes = torch.full((len(scenes), n), len(task.SHAPES), dtype=torch.long)
    for b, scene in enumerate(scenes):
        for o in scene.objects:
            colors[b, o.row * GRID_PATCHES + o.col] = task.COLOR_NAMES.index(o.color)
            shapes[b, o.row * GRID_PATCHES + o.col] = task.SHAPES.index(o.shape)
    return colors, shapes


def write_hf_files(out: str, tok: ByteLevelBPE, config: dict, preprocessor: Optional[dict] = None) -> None:
    """Everything but the weights: config, tokenizer, processor (PREPROCESSOR unless
    given) and generation configs."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    tok.save(os.path.join(out, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": config["text_config"]["max_position_embeddings"],
        "extra_special_tokens": {"image_token": "<image>"},
        "chat_template": "{% for m in messages %}{% if m['role'] == 'user' %}USER: {{ m['content'] }} "
                         "{% else %}ASSISTANT: {{ m['content'] }}</s>{% endif %}{% endfor %}"
                         "{% if add_generation_prompt %}ASSISTANT:{% endif %}",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, f,
                  indent=2)
        f.write("\n")
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(preprocessor or PREPROCESSOR, f, indent=2)
        f.write("\n")
    gen = {
        "bos_token_id": SPECIALS["<s>"],
        "eos_token_id": SPECIALS["</s>"],
        "pad_token_id": tok.token_to_id("<pad>"),
        "do_sample": False,
        "max_new_tokens": 8,
    }
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
