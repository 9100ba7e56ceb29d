"""Prompt templates, in one place: the C++ runtime mirrors these strings exactly.

Image tokens are expanded here, as Hugging Face processors do: every image becomes
`num_image_tokens` copies of the image token (plus the wrapper tokens of the template). The text is
then tokenized with added (special) tokens matched literally, and BOS prepended when the
tokenizer's post-processor adds one (tokenizer_config.json "add_bos_token").

Templates (IMG = the image token repeated num_image_tokens times):

  llava       (LLaVA-1.5, Llama text model)
      with image:    "USER: " + IMG + "\\n" + prompt + " ASSISTANT:"
      without image: "USER: " + prompt + " ASSISTANT:"
  llava-chatml (LLaVA with a Qwen2 text model: Kiln's choice, Qwen2's ChatML turn with the image first)
      with image:    "<|im_start|>user\\n" + IMG + "\\n" + prompt + "<|im_end|>\\n<|im_start|>assistant\\n"
      without image: "<|im_start|>user\\n" + prompt + "<|im_end|>\\n<|im_start|>assistant\\n"
  idefics3    (SmolVLM chat template, single tile: Idefics3Processor._prompt_single_image)
      with image:    "<|im_start|>User:<fake_token_around_image><global-img>" + IMG
                     + "<fake_token_around_image>" + prompt + "<end_of_utterance>\\nAssistant:"
      without image: "<|im_start|>User: " + prompt + "<end_of_utterance>\\nAssistant:"
                     (SmolVLM's chat template writes "User:" before an image, "User: " before text)
  plain       (text-only models): the prompt as is

num_image_tokens: LLaVA (image_size/patch)^2, +1 with vision_feature_select_strategy "full";
Idefics3 image_seq_len = (image_size/patch)^2 / scale_factor^2.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

TEMPLATES = {
    "llava": ("USER: {image}\n{prompt} ASSISTANT:", "USER: {prompt} ASSISTANT:"),
    "llava-chatml": ("<|im_start|>user\n{image}\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
                     "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"),
    "idefics3": ("<|im_start|>User:<fake_token_around_image><global-img>{image}<fake_token_around_image>"
                 "{prompt}<end_of_utterance>\nAssistant:",
                 "<|im_start|>User: {prompt}<end_of_utterance>\nAssistant:"),
    "plain": (None, "{prompt}"),
}


class PromptError(ValueError):
    pass


def template_name(config: Mapping) -> str:
    mt = config.get("model_type")
    if mt == "llava":
        text_type = (config.get("text_config") or {}).get("model_type", "llama")
        return "llava-chatml" if text_type == "qwen2" else "llava"
    if mt == "idefics3":
        return "idefics3"
    return "plain"


def image_token(config: Mapping) -> Tuple[Optional[str], Optional[int]]:
    """(token string, id) of the image token of a VLM config, (None, None) for text models."""
    mt = config.get("model_type")
    if mt == "llava":
        return "<image>", int(config.get("image_token_index", config.get("image_token_id", 32000)))
    if mt == "idefics3":
        return "<image>", int(config.get("image_token_id", 128257))
    return None, None


def num_image_tokens(config: Mapping) -> int:
    mt = config.get("model_type")
    v = config.get("vision_config") or {}
    if mt == "llava":
        n = (v.get("image_size", 336) // v.get("patch_size", 14)) ** 2
        return n + 1 if config.get("vision_feature_select_strategy", "default") == "full" else n
    if mt == "idefics3":
        side = v.get("image_size", 224) // v.get("patch_size", 32)
        return side * side // config.get("scale_factor", 2) ** 2
    raise PromptError(f"model_type {mt!r} takes no images")


def render(config: Mapping, prompt: str, with_image: bool) -> str:
    """The full prompt text, image tokens expanded."""
    name = template_name(config)
    with_tpl, without_tpl = TEMPLATES[name]
    if with_image:
        if with_tpl is None:
            raise PromptError(f"model_type {config.get('model_type')!r} is a text model: it takes no image")
        tok, _ = image_token(config)
        return with_tpl.format(image=tok * num_image_tokens(config), prompt=prompt)
    return without_tpl.format(prompt=prompt)


def encode(tokenizer, tokenizer_config: Mapping, config: Mapping, prompt: str, with_image: bool) -> List[int]:
    """Token ids of the rendered prompt; checks the image token count and id."""
    text = render(config, prompt, with_image)
    add_bos = bool(tokenizer_config.get("add_bos_token", False))
    ids = tokenizer.encode(text, add_special_tokens=add_bos)
    if add_bos and (not ids or ids[0] != tokenizer.token_to_id(tokenizer_config.get("bos_token"))):
        raise PromptError("tokenizer did not prepend the BOS token although add_bos_token is true")
    if with_image:
        tok, tok_id = image_token(config)
        if tokenizer.token_to_id(tok) != tok_id:
            raise PromptError(f"tokenizer maps {tok!r} to {tokenizer.token_to_id(tok)}, config says {tok_id}")
        if ids.count(tok_id) != num_image_tokens(config):
            raise PromptError(f"prompt holds {ids.count(tok_id)} image tokens, expected {num_image_tokens(config)}")
    return ids
