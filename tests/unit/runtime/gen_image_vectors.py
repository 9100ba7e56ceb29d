#!/usr/bin/python3
"""Test vectors for the runtime's image preprocessing (tests/unit/runtime/image_test.cc).

Usage: /usr/bin/python3 gen_image_vectors.py OUT_DIR

Writes, into OUT_DIR:
  images/<name>.npy          uint8 [H, W, 3] inputs (random, structured, 1x1, 1xN, odd sizes)
  resize/<case>.npy          uint8 [h, w, 3] = PIL Image.fromarray(image).resize((w, h), filter)
  preprocess/<case>.npy      float32 [3, S, S] = the reference image processor's pixel_values
  resize_cases.txt           one line per resize case:
                               <image> <out_width> <out_height> <filter> <expected>
  preprocess_cases.txt       one line per processor case:
                               <image> <expected> key=value ...
                             keys: processor (clip|idefics3), image_size, do_resize,
                             shortest_edge, resize (HxW), longest_edge, max_image_edge,
                             resample, do_center_crop, crop (HxW), do_rescale,
                             rescale_factor, do_normalize, mean (a,b,c), std (a,b,c)
                             (float32 mean/std written as the exact decimal of the float32)
  VERSIONS                   Pillow and NumPy versions used

The reference is tests/models/kiln_models/image_processing.py (transformers' slow
CLIPImageProcessor / Idefics3ImageProcessor on PIL + numpy). Deterministic: fixed seeds.
"""

import os
import sys

import numpy as np
from PIL import Image

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.normpath(os.path.join(HERE, "..", "..", "models"))
if MODELS not in sys.path:
    sys.path.insert(0, MODELS)

from kiln_models.image_processing import (CLIPImageProcessor, Idefics3ImageProcessor,  # noqa: E402
                                          RESAMPLE)

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
RESCALE = 0.00392156862745098  # 1/255 as written in hub preprocessor configs
FILTERS = [0, 1, 2, 3, 4, 5]   # NEAREST LANCZOS BILINEAR BICUBIC BOX HAMMING


def make_images():
    rng = np.random.default_rng(20240611)
    images = {}

    def rand(h, w):
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)

    for h, w in [(1, 1), (1, 9), (9, 1), (2, 3), (3, 2), (5, 7), (13, 17), (31, 29), (64, 48),
                 (97, 131), (128, 128), (129, 257), (300, 1)]:
        images[f"rand_{h}x{w}"] = rand(h, w)

    yy, xx = np.mgrid[0:37, 0:53]
    checker = (((yy + xx) % 2) * 255).astype(np.uint8)           # worst case for overshoot/clipping
    images["checker_37x53"] = np.stack([checker, 255 - checker, checker], axis=-1)
    stripes = ((xx // 3) % 2 * 255).astype(np.uint8)
    images["stripes_37x53"] = np.stack([stripes, stripes, 255 - stripes], axis=-1)
    grad = np.stack([(xx * 255 // 52), (yy * 255 // 36), ((xx + yy) * 255 // 88)], axis=-1)
    images["gradient_37x53"] = grad.astype(np.uint8)
    images["white_8x6"] = np.full((8, 6, 3), 255, dtype=np.uint8)
    images["black_8x6"] = np.zeros((8, 6, 3), dtype=np.uint8)
    dot = np.zeros((15, 15, 3), dtype=np.uint8)
    dot[7, 7] = (255, 128, 1)
    images["dot_15x15"] = dot
    return images


def make_photo(h, w, seed):
    """A photo-like image: smooth shading, hard edges and sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(xx / 37.0) * np.cos(yy / 53.0)
    g = 255 * (xx + yy) / (h + w)
    b = np.where((xx - w / 2) ** 2 + (yy - h / 2) ** 2 < (min(h, w) / 3) ** 2, 220.0, 30.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def resize_targets(h, w):
    targets = [(1, 1), (7, 5), (w, h), (w + 3, h), (w, h + 4), (2 * w + 1, 3 * h),
               (max(1, w // 2), max(1, h // 3)), (w * 5 // 3 + 1, max(1, h * 2 // 3)),
               (max(1, w // 7), max(1, h // 5) + 1), (33, 1), (1, 29)]
    seen, out = set(), []
    for t in targets:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def f32_str(v):
    """Exact decimal of a float32 (parsed as double, it casts back to the same float32)."""
    return repr(float(np.float32(v)))


def spec_line(cfg):
    kind = cfg["image_processor_type"]
    mean = ",".join(f32_str(v) for v in cfg["image_mean"])
    std = ",".join(f32_str(v) for v in cfg["image_std"])
    common = (f"resample={cfg['resample']} do_resize={int(cfg['do_resize'])} "
              f"do_rescale={int(cfg['do_rescale'])} rescale_factor={cfg['rescale_factor']!r} "
              f"do_normalize={int(cfg['do_normalize'])} mean={mean} std={std}")
    if kind == "CLIPImageProcessor":
        crop = cfg["crop_size"]
        size = cfg["size"]
        s = crop["height"] if cfg["do_center_crop"] else size.get("height", size.get("shortest_edge"))
        line = (f"processor=clip image_size={s} do_center_crop={int(cfg['do_center_crop'])} "
                f"crop={crop['height']}x{crop['width']} ")
        if "shortest_edge" in size:
            line += f"shortest_edge={size['shortest_edge']} "
        else:
            line += f"resize={size['height']}x{size['width']} "
        return line + common
    tile = cfg["max_image_size"]["longest_edge"]
    return (f"processor=idefics3 image_size={tile} max_image_edge={tile} "
            f"longest_edge={cfg['size']['longest_edge']} " + common)


def clip_cfg(edge, crop, **kw):
    cfg = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "do_center_crop": True,
           "size": {"shortest_edge": edge}, "crop_size": {"height": crop, "width": crop},
           "resample": 3, "do_rescale": True, "rescale_factor": RESCALE, "do_normalize": True,
           "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD, "do_convert_rgb": True}
    cfg.update(kw)
    return cfg


def idefics3_cfg(longest, tile, **kw):
    cfg = {"image_processor_type": "Idefics3ImageProcessor", "do_image_splitting": False,
           "do_resize": True, "size": {"longest_edge": longest},
           "max_image_size": {"longest_edge": tile}, "resample": 1, "do_rescale": True,
           "rescale_factor": RESCALE, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
           "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True}
    cfg.update(kw)
    return cfg


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = argv[1]
    for sub in ("images", "resize", "preprocess"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)

    images = make_images()
    photos = {"photo_720x1280": make_photo(720, 1280, 1), "photo_500x333": make_photo(500, 333, 2),
              "photo_100x80": make_photo(100, 80, 3), "photo_47x300": make_photo(47, 300, 4)}
    for name, img in {**images, **photos}.items():
        np.save(os.path.join(out, "images", name + ".npy"), np.ascontiguousarray(img))

    resize_lines = []
    for name, img in images.items():
        h, w = img.shape[:2]
        pil = Image.fromarray(img)
        for ow, oh in resize_targets(h, w):
            for f in FILTERS:
                case = f"{name}_to_{ow}x{oh}_f{f}"
                res = np.array(pil.resize((ow, oh), resample=RESAMPLE[f]))
                assert res.shape == (oh, ow, 3) and res.dtype == np.uint8
                np.save(os.path.join(out, "resize", case + ".npy"), res)
                resize_lines.append(f"{name} {ow} {oh} {f} resize/{case}.npy")
    # A photo-sized downscale and upscale per filter.
    photo = photos["photo_500x333"]
    for ow, oh in [(224, 336), (337, 501), (333, 224)]:
        for f in FILTERS:
            case = f"photo_500x333_to_{ow}x{oh}_f{f}"
            res = np.array(Image.fromarray(photo).resize((ow, oh), resample=RESAMPLE[f]))
            np.save(os.path.join(out, "resize", case + ".npy"), res)
            resize_lines.append(f"photo_500x333 {ow} {oh} {f} resize/{case}.npy")

    configs = {
        "clip336": clip_cfg(336, 336),                                    # LLaVA-1.5
        "clip64": clip_cfg(64, 64),
        "clip48_crop64": clip_cfg(48, 64),                                # crop larger: zero padding
        "clip_noresize_crop64": clip_cfg(64, 64, do_resize=False),        # pads and crops the original
        "clip_fixed224": clip_cfg(224, 224, size={"height": 224, "width": 224}, do_center_crop=False),
        "clip_bilinear_nonorm": clip_cfg(40, 32, resample=2, do_normalize=False, rescale_factor=0.5),
        "clip_norescale": clip_cfg(32, 32, resample=1, do_rescale=False),
        "clip_raw": clip_cfg(24, 24, resample=0, do_rescale=False, do_normalize=False),
        "idefics3_2048_512": idefics3_cfg(2048, 512),                     # SmolVLM-256M/500M
        "idefics3_1456_364": idefics3_cfg(4 * 364, 364),                  # Idefics3 / SmolVLM-2B
        "idefics3_noresize_64": idefics3_cfg(256, 64, do_resize=False),
        "idefics3_bicubic_96": idefics3_cfg(200, 96, resample=3),
    }
    plan = {
        "clip336": ["photo_720x1280", "photo_500x333", "photo_100x80", "photo_47x300", "rand_1x1",
                    "rand_300x1"],
        "clip64": ["photo_720x1280", "photo_500x333", "rand_97x131", "rand_1x9", "checker_37x53"],
        "clip48_crop64": ["photo_500x333", "rand_97x131", "rand_2x3"],
        "clip_noresize_crop64": ["rand_31x29", "rand_97x131", "rand_129x257"],
        "clip_fixed224": ["photo_500x333", "rand_13x17"],
        "clip_bilinear_nonorm": ["photo_100x80", "gradient_37x53"],
        "clip_norescale": ["photo_100x80"],
        "clip_raw": ["rand_64x48", "photo_47x300"],
        "idefics3_2048_512": ["photo_720x1280", "photo_500x333", "rand_1x1", "rand_300x1"],
        "idefics3_1456_364": ["photo_720x1280", "photo_100x80", "rand_129x257"],
        "idefics3_noresize_64": ["rand_97x131", "rand_1x9"],
        "idefics3_bicubic_96": ["photo_47x300", "checker_37x53"],
    }
    all_images = {**images, **photos}
    pre_lines = []
    for cname, cfg in configs.items():
        proc = (CLIPImageProcessor if cfg["image_processor_type"] == "CLIPImageProcessor"
                else Idefics3ImageProcessor)(cfg)
        for iname in plan[cname]:
            res = proc.preprocess(Image.fromarray(all_images[iname]))
            if isinstance(res, tuple):
                res = res[0][0]
            pv = np.ascontiguousarray(res[0], dtype=np.float32)
            assert pv.ndim == 3 and pv.shape[0] == 3 and pv.shape[1] == pv.shape[2], pv.shape
            case = f"{cname}__{iname}"
            np.save(os.path.join(out, "preprocess", case + ".npy"), pv)
            pre_lines.append(f"{iname} preprocess/{case}.npy {spec_line(cfg)}")

    with open(os.path.join(out, "resize_cases.txt"), "w") as f:
        f.write("\n".join(resize_lines) + "\n")
    with open(os.path.join(out, "preprocess_cases.txt"), "w") as f:
        f.write("\n".join(pre_lines) + "\n")
    with open(os.path.join(out, "VERSIONS"), "w") as f:
        f.write(f"Pillow {Image.__version__}\nnumpy {np.__version__}\n")
    print(f"{len(resize_lines)} resize cases, {len(pre_lines)} preprocess cases -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
