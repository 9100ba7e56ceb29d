"""Image preprocessing exactly as transformers' *slow* (PIL + numpy) image processors do it,
driven by a checkpoint's preprocessor_config.json dict.

CLIPImageProcessor (LLaVA), image_processing_clip.py + image_transforms.py:
  1. convert to RGB (PIL .convert("RGB") for non-RGB images)
  2. resize with PIL (uint8 in, uint8 out): {"shortest_edge": s} scales the short side to s and the
     long side to int(s * long / short); {"height", "width"} resizes to exactly that
  3. center crop to crop_size: top = (H - h) // 2, left = (W - w) // 2 (zero padding if smaller)
  4. rescale: (uint8 as float64 * rescale_factor) cast to float32
  5. normalize in float32: (x - mean) / std, per channel
  6. HWC -> CHW; output [1, 3, H, W] float32

Idefics3ImageProcessor (SmolVLM), single tile (do_image_splitting false), image_processing_idefics3.py:
  1. convert to RGB by alpha-compositing onto white (RGBA images)
  2. resize so the longest edge is size["longest_edge"] (the other edge int(...) rounded up to even,
     at most 4096), PIL resample (LANCZOS = 1 in hub configs)
  3. resize to max_image_size["longest_edge"] squared (transformers squares the image when it does
     not split it)
  4. rescale and normalize as above; output pixel_values [1, 1, 3, S, S] and an all-ones
     pixel_attention_mask [1, 1, S, S]

`load_image` mirrors transformers.image_utils.load_image: EXIF orientation applied, then RGB.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, Tuple

import numpy as np
from PIL import Image, ImageOps

# PILImageResampling values (transformers.image_utils) are PIL's own filter numbers.
RESAMPLE = {0: Image.NEAREST, 1: Image.LANCZOS, 2: Image.BILINEAR, 3: Image.BICUBIC, 4: Image.BOX, 5: Image.HAMMING}
IDEFICS3_MAX_IMAGE_SIZE = 4096  # image_processing_idefics3: absolute maximum edge


class ImageProcessingError(ValueError):
    pass


def load_image(path: str) -> Image.Image:
    image = Image.open(path)
    image = ImageOps.exif_transpose(image)
    return image.convert("RGB")


def _resample(cfg: Mapping, default: int, where: str):
    value = cfg.get("resample", default)
    if value not in RESAMPLE:
        raise ImageProcessingError(f"{where}: unsupported resample {value!r} (PIL filter numbers 0-5)")
    return RESAMPLE[value]


def _to_uint8_hwc(image) -> np.ndarray:
    if isinstance(image, Image.Image):
        arr = np.array(image)
    else:
        arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise ImageProcessingError(f"expected a uint8 image (0..255), got {arr.dtype}")
    if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
        raise ImageProcessingError(f"expected an HxWx3 (or x4) image, got shape {arr.shape}")
    return arr


def pil_resize(arr: np.ndarray, height: int, width: int, resample) -> np.ndarray:
    """image_transforms.resize for a uint8 HWC array: through PIL and back, no rescaling."""
    return np.array(Image.fromarray(arr).resize((width, height), resample=resample))


def rescale(arr: np.ndarray, factor: float) -> np.ndarray:
    # image_transforms.rescale: upcast to float64 first, then downcast to float32
    return (arr.astype(np.float64) * factor).astype(np.float32)


def normalize(arr: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    # image_transforms.normalize (channels last): float32 arithmetic with float32 mean/std
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float32)
    c = arr.shape[-1]
    mean = list(mean) if isinstance(mean, (list, tuple)) else [mean] * c
    std = list(std) if isinstance(std, (list, tuple)) else [std] * c
    if len(mean) != c or len(std) != c:
        raise ImageProcessingError(f"image_mean/image_std need {c} values, got {len(mean)}/{len(std)}")
    return (arr - np.array(mean, dtype=arr.dtype)) / np.array(std, dtype=arr.dtype)


def shortest_edge_size(height: int, width: int, size: int) -> Tuple[int, int]:
    """get_resize_output_image_size(default_to_square=False): (new_h, new_w)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop(arr: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """image_transforms.center_crop on an HWC array (zero padding when the image is smaller)."""
    h, w = arr.shape[:2]
    top = (h - crop_h) // 2
    left = (w - crop_w) // 2
    if top >= 0 and left >= 0 and top + crop_h <= h and left + crop_w <= w:
        return arr[top:top + crop_h, left:left + crop_w]
    new_h, new_w = max(crop_h, h), max(crop_w, w)
    padded = np.zeros((new_h, new_w) + arr.shape[2:], dtype=arr.dtype)
    top_pad, left_pad = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
    padded[top_pad:top_pad + h, left_pad:left_pad + w] = arr
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top):min(new_h, top + crop_h), max(0, left):min(new_w, left + crop_w)]


def _size_dict(value, default_to_square: bool, where: str, key: str) -> dict:
    # image_processing_utils.get_size_dict for the forms found in hub configs
    if isinstance(value, int):
        return {"height": value, "width": value} if default_to_square else {"shortest_edge": value}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"height": int(value[0]), "width": int(value[1])}
    if isinstance(value, Mapping):
        return dict(value)
    raise ImageProcessingError(f"{where}: cannot interpret {key}={value!r}")


class CLIPImageProcessor:
    def __init__(self, config: Mapping, where: str = "preprocessor_config.json"):
        self.where = where
        self.do_convert_rgb = config.get("do_convert_rgb", True)
        self.do_resize = config.get("do_resize", True)
        self.size = _size_dict(config.get("size", {"shortest_edge": 224}), False, where, "size")
        self.resample = _resample(config, 3, where)  # BICUBIC
        self.do_center_crop = config.get("do_center_crop", True)
        self.crop_size = _size_dict(config.get("crop_size", {"height": 224, "width": 224}), True, where, "crop_size")
        self.do_rescale = config.get("do_rescale", True)
        self.rescale_factor = config.get("rescale_factor", 1 / 255)
        self.do_normalize = config.get("do_normalize", True)
        self.image_mean = config.get("image_mean", [0.48145466, 0.4578275, 0.40821073])
        self.image_std = config.get("image_std", [0.26862954, 0.26130258, 0.27577711])

    def resize(self, arr: np.ndarray) -> np.ndarray:
        h, w = arr.shape[:2]
        if "shortest_edge" in self.size:
            nh, nw = shortest_edge_size(h, w, int(self.size["shortest_edge"]))
        elif "height" in self.size and "width" in self.size:
            nh, nw = int(self.size["height"]), int(self.size["width"])
        else:
            raise ImageProcessingError(f"{self.where}: size must have 'shortest_edge' or 'height' and 'width'")
        return pil_resize(arr, nh, nw, self.resample)

    def preprocess(self, image) -> np.ndarray:
        """-> pixel_values float32 [1, 3, H, W]"""
        if isinstance(image, Image.Image) and self.do_convert_rgb and image.mode != "RGB":
            image = image.convert("RGB")
        arr = _to_uint8_hwc(image)
        if self.do_resize:
            arr = self.resize(arr)
        if self.do_center_crop:
            arr = center_crop(arr, int(self.crop_size["height"]), int(self.crop_size["width"]))
        out = arr
        if self.do_rescale:
            out = rescale(out, self.rescale_factor)
        if self.do_normalize:
            out = normalize(out, self.image_mean, self.image_std)
        return np.ascontiguousarray(out.astype(np.float32, copy=False).transpose(2, 0, 1)[None])


def idefics3_longest_edge_size(height: int, width: int, max_len: int) -> Tuple[int, int]:
    """_resize_output_size_rescale_to_max_len then _resize_output_size_scale_below_upper_bound."""
    aspect = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect)
        if height % 2 != 0:
            height += 1
    else:
        height = max_len
        width = int(height * aspect)
        if width % 2 != 0:
            width += 1
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > IDEFICS3_MAX_IMAGE_SIZE:
        width = IDEFICS3_MAX_IMAGE_SIZE
        height = int(width / aspect)
    elif height > width and height > IDEFICS3_MAX_IMAGE_SIZE:
        height = IDEFICS3_MAX_IMAGE_SIZE
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def composite_on_white(arr: np.ndarray) -> np.ndarray:
    """Idefics3 convert_to_rgb: RGBA alpha-composited onto an opaque white background."""
    if arr.shape[-1] == 3:
        return arr
    rgba = Image.fromarray(arr, mode="RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255))
    return np.array(Image.alpha_composite(background, rgba).convert("RGB"))


class Idefics3ImageProcessor:
    def __init__(self, config: Mapping, where: str = "preprocessor_config.json"):
        self.where = where
        if config.get("do_image_splitting", True):
            raise ImageProcessingError(
                f"{where}: do_image_splitting is true; Kiln runs a single tile per image, set it to false "
                f"(transformers then squares the image to max_image_size, as done here)")
        self.do_convert_rgb = config.get("do_convert_rgb", True)
        self.do_resize = config.get("do_resize", True)
        self.size = config.get("size", {"longest_edge": 4 * 364})
        self.max_image_size = config.get("max_image_size", {"longest_edge": 364})
        self.resample = _resample(config, 1, where)  # LANCZOS
        self.do_rescale = config.get("do_rescale", True)
        self.rescale_factor = config.get("rescale_factor", 1 / 255)
        self.do_normalize = config.get("do_normalize", True)
        self.image_mean = config.get("image_mean", [0.5, 0.5, 0.5])
        self.image_std = config.get("image_std", [0.5, 0.5, 0.5])
        for key, value in (("size", self.size), ("max_image_size", self.max_image_size)):
            if not isinstance(value, Mapping) or "longest_edge" not in value:
                raise ImageProcessingError(f"{where}: {key} must be {{\"longest_edge\": N}}, got {value!r}")

    @property
    def tile(self) -> int:
        return int(self.max_image_size["longest_edge"])

    def preprocess(self, image) -> Tuple[np.ndarray, np.ndarray]:
        """-> (pixel_values float32 [1, 1, 3, S, S], pixel_attention_mask int64 [1, 1, S, S])"""
        arr = _to_uint8_hwc(image.convert("RGBA") if isinstance(image, Image.Image)
                            and image.mode not in ("RGB", "RGBA") else image)
        if self.do_convert_rgb:
            arr = composite_on_white(arr)
        if self.do_resize:
            h, w = idefics3_longest_edge_size(arr.shape[0], arr.shape[1], int(self.size["longest_edge"]))
            arr = pil_resize(arr, h, w, self.resample)
        arr = pil_resize(arr, self.tile, self.tile, self.resample)
        out = arr
        if self.do_rescale:
            out = rescale(out, self.rescale_factor)
        if self.do_normalize:
            out = normalize(out, self.image_mean, self.image_std)
        pixel_values = np.ascontiguousarray(out.astype(np.float32, copy=False).transpose(2, 0, 1)[None, None])
        mask = np.ones((1, 1, self.tile, self.tile), dtype=np.int64)
        return pixel_values, mask


PROCESSORS = {"CLIPImageProcessor": CLIPImageProcessor, "Idefics3ImageProcessor": Idefics3ImageProcessor}


def image_processor_for(config: Mapping, where: str = "preprocessor_config.json"):
    kind = config.get("image_processor_type")
    if kind not in PROCESSORS:
        raise ImageProcessingError(f"{where}: image_processor_type {kind!r} is not supported; "
                                   f"supported: {sorted(PROCESSORS)}")
    return PROCESSORS[kind](config, where)


def preprocess(config: Mapping, image, where: str = "preprocessor_config.json") -> np.ndarray:
    """pixel_values as the model consumes it: [1, 3, H, W] (CLIP) or [1, 1, 3, S, S] (Idefics3)."""
    proc = image_processor_for(config, where)
    out = proc.preprocess(image)
    return out[0] if isinstance(out, tuple) else out
