"""End to end on every tiny preset: generate.py -> load_checkpoint -> forward; hub tensor names;
VLM without image == bare text model; padding; loader and config errors."""

import os
import shutil

import numpy as np
import pytest
import torch

from kiln_models import prompts
from kiln_models.common import ActivationCapture, ConfigError
from kiln_models.presets import TINY_PRESETS
from kiln_models.registry import (ARCHITECTURES, CheckpointError, build_model, load_checkpoint, read_config,
                                  text_model_of)
from kiln_models.safetensors_io import Checkpoint, save_file


def image_id(config):
    return prompts.image_token(config)[1]


def make_inputs(model, config, batch=1, seed=0, text_len=9):
    """input_ids with the image expanded after 3 text tokens (VLMs), and pixel_values."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 400, (batch, text_len), generator=g)
    if not getattr(model, "is_multimodal", False):
        return ids, None
    n = prompts.num_image_tokens(config)
    assert n == model.num_image_tokens
    img = torch.full((batch, n), image_id(config))
    ids = torch.cat([ids[:, :3], img, ids[:, 3:]], dim=1)
    size = config["vision_config"]["image_size"]
    pv = torch.randn(batch, 3, size, size, generator=g)
    if config["model_type"] == "idefics3":
        pv = pv[:, None]  # [B, 1, 3, H, W]
    return ids, pv


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_preset_end_to_end(tiny_checkpoints, preset):
    model, config = load_checkpoint(tiny_checkpoints[preset])
    assert type(model) is ARCHITECTURES[config["architectures"][0]]
    # state_dict keys are exactly the checkpoint's tensor names, values bit-identical
    with Checkpoint(tiny_checkpoints[preset]) as ck:
        sd = model.state_dict()
        assert sorted(sd) == sorted(ck.keys())
        for name in ck.keys():
            assert torch.equal(sd[name], torch.from_numpy(ck.get_numpy(name))), name
    ids, pv = make_inputs(model, config, batch=2)
    with torch.no_grad():
        logits = model(ids, pixel_values=pv)
    vocab = (config.get("text_config") or config)["vocab_size"]
    assert logits.shape == (2, ids.shape[1], vocab) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # not degenerate: spread-out logits whose argmax changes along the sequence
    assert logits.std() > 0.1
    assert len(set(logits[0].argmax(-1).tolist())) > 1
    new = model.greedy_generate(ids[:1], None if pv is None else pv[:1], max_new_tokens=4)
    assert new.shape[0] == 1 and 1 <= new.shape[1] <= 4 and new.dtype == torch.int64
    # greedy = argmax of a fresh forward on the growing sequence
    with torch.no_grad():
        first = model(ids[:1], pixel_values=None if pv is None else pv[:1])[0, -1].argmax()
    assert int(new[0, 0]) == int(first)


def test_llama_hub_tensor_names(tiny_checkpoints):
    model, _ = load_checkpoint(tiny_checkpoints["tiny-llama"])
    names = [n for n in model.state_dict() if n.startswith("model.layers.0.") or "layers" not in n]
    assert names == [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight",
    ]
    sd = model.state_dict()
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 16, 64)  # GQA: 2 kv heads x 16


def test_bias_and_tying_layouts(tiny_checkpoints):
    tied, _ = load_checkpoint(tiny_checkpoints["tiny-llama-tied"])
    sd = tied.state_dict()
    assert "lm_head.weight" not in sd
    for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"model.layers.1.self_attn.{p}.bias" in sd
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)  # explicit head_dim 32
    assert "model.layers.0.mlp.down_proj.bias" in sd
    qwen, _ = load_checkpoint(tiny_checkpoints["tiny-qwen2"])
    sd = qwen.state_dict()
    assert all(f"model.layers.0.self_attn.{p}_proj.bias" in sd for p in "qkv")
    assert "model.layers.0.self_attn.o_proj.bias" not in sd and "model.layers.0.mlp.up_proj.bias" not in sd
    mix, _ = load_checkpoint(tiny_checkpoints["tiny-mixtral"])
    sd = mix.state_dict()
    assert sd["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, 64)
    assert sd["model.layers.0.block_sparse_moe.experts.3.w2.weight"].shape == (64, 128)
    llava, _ = load_checkpoint(tiny_checkpoints["tiny-llava"])
    sd = llava.state_dict()
    assert "vision_tower.vision_model.pre_layrnorm.weight" in sd
    assert "vision_tower.vision_model.embeddings.patch_embedding.bias" not in sd
    assert sd["multi_modal_projector.linear_1.weight"].shape == (64, 32)
    assert "language_model.lm_head.weight" in sd
    lq, _ = load_checkpoint(tiny_checkpoints["tiny-llava-qwen2"])
    assert lq.state_dict()["multi_modal_projector.linear_1.weight"].shape == (64, 2 * 32)  # two layers
    idf, _ = load_checkpoint(tiny_checkpoints["tiny-idefics3"])
    sd = idf.state_dict()
    assert sd["model.connector.modality_projection.proj.weight"].shape == (64, 32 * 4)
    assert "model.vision_model.embeddings.patch_embedding.bias" in sd
    assert sd["model.vision_model.embeddings.position_embedding.weight"].shape == (64, 32)


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-llava-qwen2", "tiny-idefics3"])
def test_vlm_without_image_equals_text_model(tiny_checkpoints, preset):
    model, config = load_checkpoint(tiny_checkpoints[preset])
    text = text_model_of(model, config)
    assert not getattr(text, "is_multimodal", False)
    ids = torch.randint(0, 480, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a = model(ids)
        b = text(ids)
    assert torch.equal(a, b)


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-llava-qwen2", "tiny-idefics3"])
def test_vlm_image_features_replace_image_tokens_in_order(tiny_checkpoints, preset):
    model, config = load_checkpoint(tiny_checkpoints[preset])
    ids, pv = make_inputs(model, config, batch=2, seed=3)
    with torch.no_grad():
        feats = model.get_image_features(pv)
        embeds = model.embed(ids, pv)
        plain = model.embed(ids)
    mask = ids == image_id(config)
    assert feats.shape == (2, model.num_image_tokens, embeds.shape[-1])
    assert torch.equal(embeds[mask], feats.reshape(-1, feats.shape[-1]))
    assert torch.equal(embeds[~mask], plain[~mask])
    # the image changes the logits after the image, not before it
    with torch.no_grad():
        with_img = model(ids, pixel_values=pv)
        without = model(ids)
    assert torch.equal(with_img[:, :3], without[:, :3])
    assert not torch.allclose(with_img[:, -1], without[:, -1])


@pytest.mark.parametrize("preset", ["tiny-llava", "tiny-idefics3"])
def test_vlm_image_token_count_mismatch_is_an_error(tiny_checkpoints, preset):
    model, config = load_checkpoint(tiny_checkpoints[preset])
    ids, pv = make_inputs(model, config)
    short = torch.cat([ids[:, :3], ids[:, 4:]], dim=1)  # one image token fewer
    with pytest.raises(ValueError, match=rf"contain {model.num_image_tokens - 1} image tokens .* give "
                                         rf"{model.num_image_tokens} features"):
        model(short, pixel_values=pv)


def test_llava_feature_selection(tiny_checkpoints):
    model, config = load_checkpoint(tiny_checkpoints["tiny-llava"])
    pv = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model.vision_tower(pv)
        expect = model.multi_modal_projector(out.hidden_states[-2][:, 1:])
        assert torch.equal(model.get_image_features(pv), expect)
        assert len(out.hidden_states) == 3 + 1
        vm = model.vision_tower.vision_model
        assert torch.equal(out.hidden_states[0], vm.pre_layrnorm(vm.embeddings(pv)))
        assert torch.equal(out.pooler_output, vm.post_layernorm(out.last_hidden_state[:, 0]))
    full, _ = load_checkpoint(tiny_checkpoints["tiny-llava-qwen2"])
    with torch.no_grad():
        out = full.vision_tower(pv)
        expect = full.multi_modal_projector(torch.cat([out.hidden_states[-3], out.hidden_states[-1]], -1))
        assert torch.equal(full.get_image_features(pv), expect)
    assert full.num_image_tokens == 17


def test_right_padding_matches_unpadded(tiny_checkpoints):
    for preset in ("tiny-llama", "tiny-mixtral"):
        model, _ = load_checkpoint(tiny_checkpoints[preset])
        g = torch.Generator().manual_seed(1)
        long_ids = torch.randint(3, 400, (1, 10), generator=g)
        short_ids = torch.randint(3, 400, (1, 6), generator=g)
        batch = torch.cat([long_ids, torch.cat([short_ids, torch.zeros(1, 4, dtype=torch.int64)], 1)])
        mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
        with torch.no_grad():
            both = model(batch, attention_mask=mask)
            torch.testing.assert_close(both[0], model(long_ids)[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(both[1, :6], model(short_ids)[0], rtol=1e-5, atol=1e-5)


def test_model_is_differentiable(tiny_checkpoints):
    model, config = load_checkpoint(tiny_checkpoints["tiny-llava"])
    model.train()
    ids, pv = make_inputs(model, config)
    logits = model(ids, pixel_values=pv)
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    unused = {n for n, g in grads.items() if g is None}
    # feature layer -2: the last CLIP layer and post_layernorm (pooler only) do not reach the LM
    assert unused == {n for n in grads if n.startswith(("vision_tower.vision_model.encoder.layers.2.",
                                                         "vision_tower.vision_model.post_layernorm."))}
    assert all(torch.isfinite(g).all() for g in grads.values() if g is not None)
    assert grads["vision_tower.vision_model.embeddings.patch_embedding.weight"].abs().sum() > 0


def test_activation_capture(tiny_checkpoints):
    model, config = load_checkpoint(tiny_checkpoints["tiny-mixtral"])
    ids = torch.randint(3, 400, (1, 5))
    names = ["model.layers.0.block_sparse_moe.gate", "model.layers.1.self_attn", "model.norm"]
    with ActivationCapture(model, names) as cap, torch.no_grad():
        logits = model(ids)
    assert cap.outputs["model.layers.0.block_sparse_moe.gate"].shape == (5, 4)  # router logits
    torch.testing.assert_close(model.logits(cap.outputs["model.norm"]), logits, rtol=0, atol=0)
    with pytest.raises(KeyError, match="no submodule named"):
        ActivationCapture(model, ["model.layers.7"])


# ------------------------------------------------------------------------------------ loader errors

def copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def rewrite_tensors(directory, edit):
    with Checkpoint(directory) as ck:
        tensors = {k: ck.get_numpy(k) for k in ck.keys()}
    edit(tensors)
    os.remove(os.path.join(directory, "model.safetensors"))
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def test_loader_rejects_missing_unexpected_and_misshapen(tiny_checkpoints, tmp_path):
    src = tiny_checkpoints["tiny-llama"]
    d = copy_ckpt(src, tmp_path / "missing")
    rewrite_tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensors: model.layers.1.mlp.up_proj.weight"):
        load_checkpoint(d)
    d = copy_ckpt(src, tmp_path / "unexpected")
    rewrite_tensors(d, lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match="unexpected tensors: model.layers.0.mlp.extra.weight"):
        load_checkpoint(d)
    d = copy_ckpt(src, tmp_path / "shape")
    rewrite_tensors(d, lambda t: t.update({"model.norm.weight": np.ones(65, np.float32)}))
    with pytest.raises(CheckpointError, match=r"'model.norm.weight' has shape \[65\], config.json implies \[64\]"):
        load_checkpoint(d)


def test_loader_ignores_legacy_buffers_and_tied_head(tiny_checkpoints, tmp_path):
    d = copy_ckpt(tiny_checkpoints["tiny-llama-tied"], tmp_path / "legacy")
    ref, _ = load_checkpoint(tiny_checkpoints["tiny-llama-tied"])

    def add(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(16, np.float32)
        t["lm_head.weight"] = np.zeros_like(t["model.embed_tokens.weight"])  # re-tied, ignored
    rewrite_tensors(d, add)
    model, _ = load_checkpoint(d)
    ids = torch.randint(3, 400, (1, 6))
    with torch.no_grad():
        assert torch.equal(model(ids), ref(ids))


def test_llava_new_hub_layout_is_accepted(tiny_checkpoints, tmp_path):
    d = copy_ckpt(tiny_checkpoints["tiny-llava"], tmp_path / "newlayout")

    def rename(t):
        for k in list(t):
            v = t.pop(k)
            if k.startswith("language_model.model."):
                k = "model.language_model." + k[len("language_model.model."):]
            elif k.startswith("language_model.lm_head."):
                k = "lm_head." + k[len("language_model.lm_head."):]
            else:
                k = "model." + k
            t[k] = v
    rewrite_tensors(d, rename)
    a, config = load_checkpoint(d)
    b, _ = load_checkpoint(tiny_checkpoints["tiny-llava"])
    ids, pv = make_inputs(a, config)
    with torch.no_grad():
        assert torch.equal(a(ids, pixel_values=pv), b(ids, pixel_values=pv))


def test_config_errors_name_the_key(tiny_checkpoints, tmp_path):
    config = read_config(tiny_checkpoints["tiny-llama"])
    bad = dict(config, num_key_value_heads=3)
    with pytest.raises(ConfigError, match=r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"):
        build_model(bad, empty=True)
    bad = dict(config, hidden_act="gelu_fancy")
    with pytest.raises(ConfigError, match="unsupported activation 'gelu_fancy'"):
        build_model(bad, empty=True)
    bad = dict(config, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="rope type 'yarn' is not supported"):
        build_model(bad, empty=True)
    bad = dict(config, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError, match="architecture 'GPT2LMHeadModel' is not supported"):
        build_model(bad, empty=True)
    bad = dict(config)
    del bad["num_hidden_layers"]  # falls back to LlamaConfig's default of 32 layers
    assert len(build_model(bad, empty=True).model.layers) == 32
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, 512\)"):
        load_checkpoint(tiny_checkpoints["tiny-llama"])[0](torch.tensor([[1, 600]]))
