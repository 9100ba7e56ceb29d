"""Named checkpoint presets for generate.py: config.json content (real hub key names), tokenizer
layout, image-processor config and generation config.

Tiny presets run in seconds and cover the configuration space (GQA, llama3 rope scaling, tied and
untied heads, explicit head_dim, attention/MLP biases, MoE, CLIP and SigLIP towers, both LLaVA
feature-selection strategies, pixel shuffle). Real-shape presets copy the shapes and hyper-parameters
of public checkpoints:

- smolvlm-256m   HuggingFaceTB/SmolVLM-256M-Instruct config.json (idefics3; SigLIP 512/16 tower,
                 12 layers x 768; SmolLM2-135M-style text model 30 x 576, GQA 9/3, head_dim 64,
                 vocab 49280, rope_theta 1e5; scale_factor 4 -> 64 image tokens; untied head)
- qwen2-0.5b     Qwen/Qwen2-0.5B config.json
- llama-3.2-1b   meta-llama/Llama-3.2-1B config.json (llama3 rope scaling, tied embeddings)
- mixtral-tiny-real  not a published model: Mixtral-8x7B's hyper-parameters (vocab 32000, 8 experts,
                 top-2, rope_theta 1e6, eps 1e-5, no sliding window) at 4 x 512, ~85M parameters.

Deviation from the hub, on purpose: Idefics3 presets write "do_image_splitting": false, because
Kiln runs one tile per image; with that flag transformers' processor produces the same single
tile as kiln_models.image_processing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, List, Optional

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
RESCALE = 0.00392156862745098  # 1/255 as written in hub preprocessor configs


@dataclass
class TokenizerSpec:
    train_vocab_size: int                  # bytes + merges learned from the corpus (upper bound)
    special_tokens: Dict[str, int]         # added tokens at fixed ids
    pretokenizer: str = "gpt2"             # or "llama3" (Llama-3 / Qwen2 split regex)
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    unk_token: Optional[str] = None
    pad_token: Optional[str] = None
    add_bos: bool = False


@dataclass
class Preset:
    name: str
    description: str
    config: dict
    tokenizer: TokenizerSpec
    generation: dict
    preprocessor: Optional[dict] = None    # preprocessor_config.json
    processor: Optional[dict] = None       # processor_config.json
    default_dtype: str = "f32"
    tiny: bool = True


def _clip_preprocessor(size: int) -> dict:
    # llava-hf/llava-1.5-7b-hf preprocessor_config.json, at `size`
    return {
        "crop_size": {"height": size, "width": size}, "do_center_crop": True, "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": OPENAI_CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor", "image_std": OPENAI_CLIP_STD,
        "processor_class": "LlavaProcessor", "resample": 3, "rescale_factor": RESCALE,
        "size": {"shortest_edge": size},
    }


def _idefics3_preprocessor(tile: int) -> dict:
    # HuggingFaceTB/SmolVLM-256M-Instruct preprocessor_config.json (longest_edge = 4 * tile), single tile
    return {
        "do_convert_rgb": True, "do_image_splitting": False, "do_normalize": True, "do_pad": True,
        "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Idefics3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": tile}, "processor_class": "Idefics3Processor", "resample": 1,
        "rescale_factor": RESCALE, "size": {"longest_edge": 4 * tile},
    }


LLAMA2_SPECIALS = {"<unk>": 0, "<s>": 1, "</s>": 2}


def _smolvlm_specials(base: Dict[str, int], global_img: int, fake: int, image: int, eou: int,
                      rows: int = 6) -> Dict[str, int]:
    # SmolVLM tokenizer: <global-img>, then <row_r_col_c> for a rows x rows grid, then
    # <fake_token_around_image>, <image>, ..., <end_of_utterance>
    s = dict(base)
    s["<global-img>"] = global_img
    for r in range(rows):
        for c in range(rows):
            s[f"<row_{r + 1}_col_{c + 1}>"] = global_img + 1 + r * rows + c
    s["<fake_token_around_image>"] = fake
    s["<image>"] = image
    s["<end_of_utterance>"] = eou
    return s


def _tiny_text(model_type: str = "llama", **kw) -> dict:
    c = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "mixtral": "MixtralForCausalLM"}[model_type]],
        "model_type": model_type, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
        "max_position_embeddings": 2048, "initializer_range": 0.05, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": False, "use_cache": True,
    }
    if model_type == "llama":
        c.update({"attention_bias": False, "mlp_bias": False, "head_dim": 16, "pretraining_tp": 1})
    c.update(kw)
    return c


def _presets() -> List[Preset]:
    out: List[Preset] = []

    # ---------------------------------------------------------------- tiny text models
    out.append(Preset(
        "tiny-llama", "Llama-3 style: GQA 4/2, llama3 rope_scaling (Llama-3.2 values), untied head",
        _tiny_text("llama", vocab_size=512, rope_theta=500000.0, max_position_embeddings=131072,
                   rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                   bos_token_id=480, eos_token_id=481),
        TokenizerSpec(480, {"<|begin_of_text|>": 480, "<|end_of_text|>": 481, "<|eot_id|>": 482},
                      pretokenizer="llama3", bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                      add_bos=True),
        {"bos_token_id": 480, "eos_token_id": 481, "do_sample": False},
    ))
    out.append(Preset(
        "tiny-llama-tied", "Llama-2 style: MHA, tied embeddings, explicit head_dim 32 != hidden/heads, "
                           "attention and MLP biases",
        _tiny_text("llama", num_key_value_heads=4, head_dim=32, tie_word_embeddings=True,
                   attention_bias=True, mlp_bias=True, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2),
        TokenizerSpec(480, dict(LLAMA2_SPECIALS), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                      add_bos=True),
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
    ))
    out.append(Preset(
        "tiny-qwen2", "Qwen2: q/k/v biases, GQA 4/2, tied embeddings, vocab larger than the tokenizer",
        _tiny_text("qwen2", vocab_size=600, intermediate_size=160, rope_theta=1000000.0, rms_norm_eps=1e-6,
                   tie_word_embeddings=True, sliding_window=None, use_sliding_window=False,
                   max_window_layers=2, bos_token_id=500, eos_token_id=500),
        TokenizerSpec(500, {"<|endoftext|>": 500, "<|im_start|>": 501, "<|im_end|>": 502},
                      pretokenizer="llama3", eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
        {"bos_token_id": 500, "eos_token_id": 500, "do_sample": False},
    ))
    out.append(Preset(
        "tiny-mixtral", "Mixtral: 4 experts, top-2, GQA 4/2",
        _tiny_text("mixtral", intermediate_size=128, rope_theta=1000000.0, sliding_window=None,
                   num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                   output_router_logits=False, bos_token_id=1, eos_token_id=2),
        TokenizerSpec(480, dict(LLAMA2_SPECIALS), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                      add_bos=True),
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
    ))

    # ---------------------------------------------------------------- tiny VLMs
    tiny_clip = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                 "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 32, "patch_size": 8,
                 "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5, "projection_dim": 32, "num_channels": 3}
    llava_text = _tiny_text("llama", num_key_value_heads=4, bos_token_id=1, eos_token_id=2, pad_token_id=481)
    del llava_text["architectures"]
    out.append(Preset(
        "tiny-llava", "LLaVA-1.5 layout: CLIP 32px/8 tower (16 patches), layer -2, 'default' strategy "
                      "(CLS dropped: 16 image tokens), gelu projector, Llama text model",
        {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "ignore_index": -100,
         "image_token_index": 480, "pad_token_id": 481, "projector_hidden_act": "gelu",
         "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "image_seq_length": 16,
         "tie_word_embeddings": False, "vocab_size": 512, "text_config": llava_text,
         "vision_config": dict(tiny_clip)},
        TokenizerSpec(470, {**LLAMA2_SPECIALS, "<image>": 480, "<pad>": 481}, bos_token="<s>",
                      eos_token="</s>", unk_token="<unk>", pad_token="<pad>", add_bos=True),
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 481, "do_sample": False},
        preprocessor=_clip_preprocessor(32),
        processor={"patch_size": 8, "processor_class": "LlavaProcessor",
                   "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    ))
    qtext = _tiny_text("qwen2", vocab_size=600, intermediate_size=160, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       sliding_window=None, max_window_layers=2, bos_token_id=500, eos_token_id=502)
    del qtext["architectures"]
    out.append(Preset(
        "tiny-llava-qwen2", "LLaVA with a Qwen2 text model (tied head), 'full' strategy (CLS kept: 17 "
                            "image tokens) and two feature layers [-3, -1] concatenated",
        {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "ignore_index": -100,
         "image_token_index": 503, "projector_hidden_act": "gelu", "vision_feature_layer": [-3, -1],
         "vision_feature_select_strategy": "full", "image_seq_length": 17, "tie_word_embeddings": True,
         "text_config": qtext, "vision_config": dict(tiny_clip, hidden_act="gelu")},
        TokenizerSpec(500, {"<|endoftext|>": 500, "<|im_start|>": 501, "<|im_end|>": 502, "<image>": 503},
                      pretokenizer="llama3", eos_token="<|im_end|>", pad_token="<|endoftext|>"),
        {"bos_token_id": 500, "eos_token_id": 502, "pad_token_id": 500, "do_sample": False},
        preprocessor=_clip_preprocessor(32),
        processor={"patch_size": 8, "processor_class": "LlavaProcessor",
                   "vision_feature_select_strategy": "full", "num_additional_image_tokens": 1},
    ))
    idef_text = _tiny_text("llama", rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    del idef_text["architectures"]
    out.append(Preset(
        "tiny-idefics3", "Idefics3/SmolVLM: SigLIP 64px/8 tower (64 patches), scale_factor 2 -> 16 image "
                         "tokens, Llama text model, untied head",
        {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
         "image_token_id": 482, "pad_token_id": 2, "scale_factor": 2, "tie_word_embeddings": False,
         "use_cache": True, "vocab_size": 512, "text_config": idef_text,
         "vision_config": {"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 64, "patch_size": 8,
                           "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "num_channels": 3,
                           "initializer_range": 0.02}},
        TokenizerSpec(400, _smolvlm_specials({"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2},
                                             global_img=440, fake=477, image=482, eou=483, rows=6),
                      eos_token="<end_of_utterance>", bos_token="<|im_start|>", pad_token="<|im_end|>",
                      unk_token="<|endoftext|>"),
        {"bos_token_id": 1, "eos_token_id": 483, "pad_token_id": 2, "do_sample": False},
        preprocessor=_idefics3_preprocessor(64),
        processor={"image_seq_len": 16, "processor_class": "Idefics3Processor"},
    ))

    # ---------------------------------------------------------------- real shapes
    out.append(Preset(
        "smolvlm-256m", "HuggingFaceTB/SmolVLM-256M-Instruct shapes (single tile)",
        {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
         "image_token_id": 49190, "pad_token_id": 128002, "scale_factor": 4, "tie_word_embeddings": False,
         "use_cache": True, "vocab_size": 49280,
         "text_config": {"model_type": "llama", "architectures": ["VLlama3ForCausalLM"], "head_dim": 64,
                         "hidden_size": 576, "initializer_range": 0.041666666666666664,
                         "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192,
                         "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
                         "pad_token_id": 2, "rms_norm_eps": 1e-05, "rope_interleaved": False,
                         "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": False,
                         "vocab_size": 49280, "hidden_act": "silu", "attention_bias": False,
                         "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2},
         "vision_config": {"model_type": "idefics3_vision", "hidden_size": 768, "image_size": 512,
                           "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
                           "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06,
                           "num_channels": 3, "initializer_range": 0.02}},
        TokenizerSpec(2000, _smolvlm_specials({"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2},
                                              global_img=49152, fake=49189, image=49190, eou=49279, rows=6),
                      eos_token="<end_of_utterance>", bos_token="<|im_start|>", pad_token="<|im_end|>",
                      unk_token="<|endoftext|>"),
        {"bos_token_id": 1, "eos_token_id": 49279, "pad_token_id": 2},
        preprocessor=_idefics3_preprocessor(512),
        processor={"image_seq_len": 64, "processor_class": "Idefics3Processor"},
        default_dtype="bf16", tiny=False,
    ))
    out.append(Preset(
        "qwen2-0.5b", "Qwen/Qwen2-0.5B shapes",
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
         "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
         "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 131072,
         "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
         "tie_word_embeddings": True, "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
        TokenizerSpec(2000, {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645},
                      pretokenizer="llama3", eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
        {"bos_token_id": 151643, "eos_token_id": 151643, "do_sample": False, "max_new_tokens": 2048},
        default_dtype="bf16", tiny=False,
    ))
    out.append(Preset(
        "llama-3.2-1b", "meta-llama/Llama-3.2-1B shapes",
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
         "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64,
         "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
         "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
         "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
         "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "rope_theta": 500000.0, "tie_word_embeddings": True, "use_cache": True, "vocab_size": 128256},
        TokenizerSpec(2000, {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001,
                             "<|start_header_id|>": 128006, "<|end_header_id|>": 128007, "<|eot_id|>": 128009},
                      pretokenizer="llama3", bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                      add_bos=True),
        {"bos_token_id": 128000, "eos_token_id": 128001, "do_sample": True, "temperature": 0.6, "top_p": 0.9},
        default_dtype="bf16", tiny=False,
    ))
    out.append(Preset(
        "mixtral-tiny-real", "Mixtral-8x7B hyper-parameters (8 experts, top-2, vocab 32000) at 4 layers x 512",
        {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "attention_dropout": 0.0,
         "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 512,
         "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 32768,
         "num_attention_heads": 8, "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 2,
         "num_local_experts": 8, "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
         "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
         "use_cache": True, "vocab_size": 32000},
        TokenizerSpec(2000, dict(LLAMA2_SPECIALS), bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                      add_bos=True),
        {"bos_token_id": 1, "eos_token_id": 2},
        default_dtype="bf16", tiny=False,
    ))
    return out


PRESETS: Dict[str, Preset] = {p.name: p for p in _presets()}
TINY_PRESETS = [p.name for p in PRESETS.values() if p.tiny]


def get_preset(name: str) -> Preset:
    """A deep copy of preset `name` (callers may modify it)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
