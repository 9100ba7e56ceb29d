"""generate.py (files, determinism, dtypes, sharding), prompts.py templates, golden.py outputs and
the real-shape presets' parameter counts."""

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

import generate
import golden
from kiln_models import image_processing, prompts
from kiln_models.presets import PRESETS, get_preset
from kiln_models.registry import build_model, load_checkpoint
from kiln_models.safetensors_io import Checkpoint, TensorSpec, f32_to_bf16_bits
from kiln_models.tokenizer import ByteLevelBPE


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def expected_values(seed, name, shape, rules):
    mean, std = rules[name]
    return np.concatenate(list(generate.produce_tensor(seed, TensorSpec(name, "F32", shape), mean, std))).reshape(shape)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_generated_weights_roundtrip_bit_exactly(tmp_path, dtype):
    out = str(tmp_path / dtype)
    generate.generate("tiny-mixtral", out, seed=7, dtype=dtype, quiet=True)
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["torch_dtype"] == {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    model = build_model(config, empty=True)
    rules = generate.init_rules(model, 0.05)
    with Checkpoint(out) as ck:
        assert list(ck.keys()) == [n for n, _ in model.named_parameters()]
        for name in ck.keys():
            f32 = expected_values(7, name, ck.info(name).shape, rules)
            raw = ck.get_raw(name)
            if dtype == "f32":
                np.testing.assert_array_equal(raw, f32)
            elif dtype == "f16":
                np.testing.assert_array_equal(raw, f32.astype(np.float16))
            else:
                np.testing.assert_array_equal(raw, f32_to_bf16_bits(f32))
        assert ck.metadata == {"model.safetensors": {"format": "pt"}}


def test_sharded_equals_single_and_is_deterministic(tmp_path):
    generate.generate("tiny-llava", str(tmp_path / "single"), seed=3, dtype="bf16", quiet=True)
    generate.generate("tiny-llava", str(tmp_path / "sharded"), seed=3, dtype="bf16", shard_size="100KB", quiet=True)
    generate.generate("tiny-llava", str(tmp_path / "again"), seed=3, dtype="bf16", quiet=True)
    generate.generate("tiny-llava", str(tmp_path / "other"), seed=4, dtype="bf16", quiet=True)
    files = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.json" in files
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    for f in shards:
        assert os.path.getsize(tmp_path / "sharded" / f) <= 100_000 + 4096  # + header
    with Checkpoint(str(tmp_path / "single")) as a, Checkpoint(str(tmp_path / "sharded")) as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for k in a.keys():
            np.testing.assert_array_equal(a.get_raw(k), b.get_raw(k))
        assert b.index_metadata["total_size"] == a.total_size()
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        assert sha(tmp_path / "single" / f) == sha(tmp_path / "again" / f)
    assert sha(tmp_path / "single" / "model.safetensors") != sha(tmp_path / "other" / "model.safetensors")


def test_generated_directory_contents(tiny_checkpoints):
    d = tiny_checkpoints["tiny-idefics3"]
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "preprocessor_config.json", "processor_config.json"):
        assert os.path.exists(os.path.join(d, f)), f
    config = json.load(open(os.path.join(d, "config.json")))
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"] and config["model_type"] == "idefics3"
    tok = ByteLevelBPE.load(d)
    assert tok.token_to_id("<image>") == config["image_token_id"]
    assert tok.token_to_id("<end_of_utterance>") == json.load(open(os.path.join(d, "generation_config.json")))["eos_token_id"]
    assert tok.max_id < config["text_config"]["vocab_size"]
    proc = json.load(open(os.path.join(d, "processor_config.json")))
    assert proc["image_seq_len"] == prompts.num_image_tokens(config) == 16
    llava = json.load(open(os.path.join(tiny_checkpoints["tiny-llava"], "config.json")))
    tok = ByteLevelBPE.load(tiny_checkpoints["tiny-llava"])
    assert tok.token_to_id("<image>") == llava["image_token_index"]
    assert tok.encode("hi", add_special_tokens=True)[0] == tok.token_to_id("<s>")
    tc = json.load(open(os.path.join(tiny_checkpoints["tiny-llava"], "tokenizer_config.json")))
    assert tc["add_bos_token"] is True and tc["added_tokens_decoder"]["480"]["content"] == "<image>"


def test_generate_cli(tmp_path, capsys):
    assert generate.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in PRESETS)
    assert generate.main(["--preset", "tiny-qwen2", "--out", str(tmp_path / "q"), "--dtype", "f16"]) == 0
    assert json.load(open(tmp_path / "q" / "config.json"))["torch_dtype"] == "float16"
    with pytest.raises(SystemExit):
        generate.main(["--preset", "no-such-model", "--out", str(tmp_path / "x")])


# ------------------------------------------------------------------------------------ prompts

def test_prompt_templates_are_exact(tiny_checkpoints):
    llava = json.load(open(os.path.join(tiny_checkpoints["tiny-llava"], "config.json")))
    assert prompts.render(llava, "What is it?", True) == "USER: " + "<image>" * 16 + "\nWhat is it? ASSISTANT:"
    assert prompts.render(llava, "What is it?", False) == "USER: What is it? ASSISTANT:"
    lq = json.load(open(os.path.join(tiny_checkpoints["tiny-llava-qwen2"], "config.json")))
    assert prompts.render(lq, "Hi", True) == \
        "<|im_start|>user\n" + "<image>" * 17 + "\nHi<|im_end|>\n<|im_start|>assistant\n"
    idf = json.load(open(os.path.join(tiny_checkpoints["tiny-idefics3"], "config.json")))
    assert prompts.render(idf, "Describe.", True) == (
        "<|im_start|>User:<fake_token_around_image><global-img>" + "<image>" * 16
        + "<fake_token_around_image>Describe.<end_of_utterance>\nAssistant:")
    assert prompts.render(idf, "Describe.", False) == "<|im_start|>User: Describe.<end_of_utterance>\nAssistant:"
    assert prompts.num_image_tokens(get_preset("smolvlm-256m").config) == 64
    text = json.load(open(os.path.join(tiny_checkpoints["tiny-llama"], "config.json")))
    assert prompts.render(text, "abc", False) == "abc"
    with pytest.raises(prompts.PromptError):
        prompts.render(text, "abc", True)


# ------------------------------------------------------------------------------------ golden

def test_golden_vlm_with_image(tiny_checkpoints, tmp_path):
    ck = tiny_checkpoints["tiny-llava"]
    img_path = str(tmp_path / "img.png")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(img_path)
    out = str(tmp_path / "golden")
    assert golden.main([ck, "--out", out, "--prompt", "What is in the picture?", "--image", img_path,
                        "--max-new-tokens", "5", "--activations", "multi_modal_projector"]) == 0
    ids = np.load(os.path.join(out, "input_ids.npy"))
    pv = np.load(os.path.join(out, "pixel_values.npy"))
    logits = np.load(os.path.join(out, "logits.npy"))
    greedy = np.load(os.path.join(out, "greedy.npy"))
    meta = json.load(open(os.path.join(out, "meta.json")))
    assert ids.dtype == np.int64 and ids.shape[0] == 1 and (ids == 480).sum() == 16 and ids[0, 0] == 1
    assert pv.dtype == np.float32 and pv.shape == (1, 3, 32, 32)
    assert logits.dtype == np.float32 and logits.shape == (1, ids.shape[1], 512)
    assert greedy.dtype == np.int64 and greedy.shape[0] == 1 and 1 <= greedy.shape[1] <= 5
    assert meta["num_image_tokens"] == 16 and meta["template"] == "llava"
    assert meta["rendered_prompt"].startswith("USER: <image>")
    # everything is reproducible from the files alone
    pre = json.load(open(os.path.join(ck, "preprocessor_config.json")))
    np.testing.assert_array_equal(pv, image_processing.preprocess(pre, image_processing.load_image(img_path)))
    tok = ByteLevelBPE.load(ck)
    assert ids[0].tolist() == tok.encode(meta["rendered_prompt"], add_special_tokens=True)
    model, _ = load_checkpoint(ck)
    seq = torch.from_numpy(ids)
    with torch.no_grad():
        again = model(seq, pixel_values=torch.from_numpy(pv))
        np.testing.assert_array_equal(again.numpy(), logits)
        for t in greedy[0]:
            nxt = model(seq, pixel_values=torch.from_numpy(pv), prompt_length=ids.shape[1])[0, -1].argmax()
            assert int(nxt) == int(t)
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    act = np.load(os.path.join(out, "act_multi_modal_projector.npy"))
    assert act.shape == (1, 16, 64)


def test_golden_idefics3_and_text_models(tiny_checkpoints, tmp_path):
    rng = np.random.default_rng(1)
    pv = rng.standard_normal((1, 1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "pv.npy", pv)
    out = str(tmp_path / "idefics3")
    meta = golden.run(tiny_checkpoints["tiny-idefics3"], out, prompt="Describe.",
                      pixel_values_file=str(tmp_path / "pv.npy"), max_new_tokens=3)
    assert meta["num_image_tokens"] == 16 and meta["shapes"]["pixel_values"] == [1, 1, 3, 64, 64]
    np.testing.assert_array_equal(np.load(os.path.join(out, "pixel_values.npy")), pv)
    out = str(tmp_path / "text")
    assert golden.main([tiny_checkpoints["tiny-qwen2"], "--out", out, "--input-ids", "5,6,7,8",
                        "--max-new-tokens", "4"]) == 0
    assert np.load(os.path.join(out, "input_ids.npy")).tolist() == [[5, 6, 7, 8]]
    assert np.load(os.path.join(out, "logits.npy")).shape == (1, 4, 600)
    assert not os.path.exists(os.path.join(out, "pixel_values.npy"))
    with pytest.raises(ValueError, match="text model"):
        golden.run(tiny_checkpoints["tiny-qwen2"], out, input_ids=[1, 2], pixel_values_file=str(tmp_path / "pv.npy"))


# ------------------------------------------------------------------------------------ real presets

def test_real_presets_shapes_without_weights():
    counts = {}
    for name in ("llama-3.2-1b", "qwen2-0.5b", "smolvlm-256m", "mixtral-tiny-real"):
        model = build_model(get_preset(name).config, empty=True)
        counts[name] = sum(p.numel() for p in model.parameters())
        assert all(p.device.type == "meta" for p in model.parameters())
    assert counts["llama-3.2-1b"] == 1_235_814_400      # the published parameter count
    assert counts["qwen2-0.5b"] == 494_032_768
    assert 250e6 < counts["smolvlm-256m"] < 260e6
    assert counts["mixtral-tiny-real"] < 150e6
    smol = build_model(get_preset("smolvlm-256m").config, empty=True)
    assert smol.num_image_tokens == 64
    shapes = dict((n, tuple(p.shape)) for n, p in smol.named_parameters())
    assert shapes["model.connector.modality_projection.proj.weight"] == (576, 768 * 16)
    assert shapes["lm_head.weight"] == (49280, 576)
    assert shapes["model.text_model.layers.0.self_attn.k_proj.weight"] == (3 * 64, 576)
