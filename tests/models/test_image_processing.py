"""image_processing: CLIP (resize shortest edge, center crop, rescale, normalise) and Idefics3
single-tile preprocessing checked against hand-derived expectations."""

import numpy as np
import pytest
from PIL import Image

from kiln_models.image_processing import (CLIPImageProcessor, Idefics3ImageProcessor, ImageProcessingError,
                                          center_crop, idefics3_longest_edge_size, image_processor_for,
                                          load_image, preprocess, shortest_edge_size)
from kiln_models.presets import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, get_preset

MEAN = np.array(OPENAI_CLIP_MEAN, dtype=np.float32)
STD = np.array(OPENAI_CLIP_STD, dtype=np.float32)


def clip_config(size, crop):
    cfg = dict(get_preset("tiny-llava").preprocessor)
    cfg.update(size={"shortest_edge": size}, crop_size={"height": crop, "width": crop})
    return cfg


def by_hand(pixels_uint8):
    """rescale in float64 then float32, normalise in float32, HWC -> CHW."""
    x = (pixels_uint8.astype(np.float64) * (1 / 255)).astype(np.float32)
    return ((x - MEAN) / STD).transpose(2, 0, 1)


def test_resize_output_sizes():
    assert shortest_edge_size(300, 200, 224) == (336, 224)   # portrait: width is the short side
    assert shortest_edge_size(200, 300, 224) == (224, 336)
    assert shortest_edge_size(480, 640, 336) == (336, 448)
    assert shortest_edge_size(100, 333, 10) == (10, 33)      # int() truncates
    # Idefics3: longest edge to max, the other truncated then rounded up to even
    assert idefics3_longest_edge_size(300, 200, 2048) == (2048, 1366)
    assert idefics3_longest_edge_size(203, 300, 2048) == (1386, 2048)   # int(1385.8) = 1385 -> 1386
    assert idefics3_longest_edge_size(200, 301, 2048) == (1360, 2048)   # int(1360.8) = 1360, even
    assert idefics3_longest_edge_size(64, 64, 256) == (256, 256)


def test_clip_constant_image():
    # 60x40 (W x H) constant colour -> shortest edge 20 -> 30x20 -> center crop 20x20
    color = (200, 100, 50)
    img = Image.new("RGB", (60, 40), color)
    proc = CLIPImageProcessor(clip_config(20, 20))
    assert proc.resize(np.array(img)).shape == (20, 30, 3)
    out = proc.preprocess(img)
    assert out.shape == (1, 3, 20, 20) and out.dtype == np.float32
    expect = by_hand(np.array(color, dtype=np.uint8)[None, None])[:, 0, 0]
    for c in range(3):
        assert np.all(out[0, c] == expect[c])


def test_clip_center_crop_offsets_and_values():
    # already at the target short side: PIL returns the same pixels, only the crop acts
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (16, 23, 3), dtype=np.uint8)
    out = CLIPImageProcessor(clip_config(16, 16)).preprocess(Image.fromarray(pixels))
    left = (23 - 16) // 2  # 3
    np.testing.assert_array_equal(out[0], by_hand(pixels[:, left:left + 16]))
    tall = rng.integers(0, 256, (21, 16, 3), dtype=np.uint8)
    out = CLIPImageProcessor(clip_config(16, 16)).preprocess(Image.fromarray(tall))
    np.testing.assert_array_equal(out[0], by_hand(tall[2:18]))   # top = (21 - 16) // 2


def test_clip_resize_uses_pil_bicubic_on_uint8():
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    out = CLIPImageProcessor(clip_config(32, 32)).preprocess(Image.fromarray(pixels))
    resized = np.array(Image.fromarray(pixels).resize((44, 32), resample=Image.BICUBIC))  # int(32*70/50)=44
    np.testing.assert_array_equal(out[0], by_hand(resized[:, 6:38]))


def test_center_crop_pads_small_images():
    img = np.full((2, 3, 3), 7, dtype=np.uint8)
    out = center_crop(img, 4, 4)
    assert out.shape == (4, 4, 3)
    expect = np.zeros((4, 4, 3), dtype=np.uint8)
    expect[1:3, 1:4] = 7  # top pad ceil(2/2)=1, left pad ceil(1/2)=1
    np.testing.assert_array_equal(out, expect)


def test_clip_converts_non_rgb_to_rgb():
    gray = Image.new("L", (16, 16), 128)
    out = CLIPImageProcessor(clip_config(16, 16)).preprocess(gray)
    np.testing.assert_array_equal(out[0], by_hand(np.full((16, 16, 3), 128, dtype=np.uint8)))


def test_idefics3_single_tile():
    cfg = get_preset("tiny-idefics3").preprocessor
    proc = image_processor_for(cfg)
    assert isinstance(proc, Idefics3ImageProcessor)
    img = Image.new("RGB", (90, 40), (255, 0, 51))
    pv, mask = proc.preprocess(img)
    assert pv.shape == (1, 1, 3, 64, 64) and pv.dtype == np.float32
    assert mask.shape == (1, 1, 64, 64) and mask.all()
    for c, v in enumerate((255, 0, 51)):
        expect = (np.float32(v * (1 / 255)) - np.float32(0.5)) / np.float32(0.5)
        assert np.all(pv[0, 0, c] == expect)
    # two LANCZOS resizes: longest edge to 256 (90x40 -> 256x114), then the 64x64 square
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (40, 90, 3), dtype=np.uint8)
    step1 = Image.fromarray(pixels).resize((256, 114), resample=Image.LANCZOS)
    step2 = np.array(step1.resize((64, 64), resample=Image.LANCZOS))
    expect = ((step2.astype(np.float64) / 255).astype(np.float32) - np.float32(0.5)) / np.float32(0.5)
    np.testing.assert_array_equal(proc.preprocess(Image.fromarray(pixels))[0][0, 0], expect.transpose(2, 0, 1))


def test_idefics3_alpha_is_composited_on_white():
    rgba = np.zeros((64, 64, 4), dtype=np.uint8)  # fully transparent black
    pv = preprocess(get_preset("tiny-idefics3").preprocessor, Image.fromarray(rgba, mode="RGBA"))
    assert pv.shape == (1, 1, 3, 64, 64) and np.all(pv == 1.0)


def test_unsupported_configs_are_errors():
    cfg = dict(get_preset("tiny-idefics3").preprocessor, do_image_splitting=True)
    with pytest.raises(ImageProcessingError, match="do_image_splitting is true"):
        image_processor_for(cfg)
    with pytest.raises(ImageProcessingError, match="image_processor_type 'SiglipImageProcessor'"):
        image_processor_for({"image_processor_type": "SiglipImageProcessor"})
    with pytest.raises(ImageProcessingError, match="resample 9"):
        CLIPImageProcessor(dict(clip_config(16, 16), resample=9))


def test_load_image_applies_exif_orientation(tmp_path):
    pixels = np.zeros((10, 20, 3), dtype=np.uint8)
    pixels[:, :5] = 255
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    path = str(tmp_path / "rot.jpg")
    img.save(path, exif=exif, quality=100)
    loaded = load_image(path)
    assert loaded.mode == "RGB" and loaded.size == (10, 20)
