"""Kiln's PyTorch reference models and Hugging Face checkpoint tooling (tests/models).

Modules (import them directly; this package imports nothing eagerly, so the tokenizer can be used
without torch):

    safetensors_io    read / write safetensors (lazy, validated; single or sharded)
    llama, mixtral    LlamaForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM
    clip, siglip      CLIP and SigLIP (Idefics3) vision towers
    llava, idefics3   LlavaForConditionalGeneration, Idefics3ForConditionalGeneration
    image_processing  CLIPImageProcessor / Idefics3ImageProcessor (single tile)
    prompts           prompt templates shared with the C++ runtime
    registry          architecture -> class, load_checkpoint(dir)
    presets           named configs for generate.py
    tokenizer         byte-level BPE (tokenizer.json)
    common            shared layers, activation capture, greedy decoding
"""
