// Image preprocessing: an 8-bit RGB photo in, the pixel_values tensor [3, S, S] float32
// out, bit-exact with what the checkpoint's Hugging Face *slow* image processor produces
// (PIL resize on uint8 + numpy rescale/normalise; reference:
// tests/models/kiln_models/image_processing.py).
//
// The resize replicates Pillow's Image.resize (9.x; reducing_gap=None, as transformers
// calls it) on uint8 RGB images: NEAREST through the affine "scale" transform, every other
// filter through ImagingResample's separable convolution (float coefficients per output
// pixel, converted to 22-bit fixed point; horizontal pass, then vertical pass).
//
// Rows are streamed: each resize keeps only a ring of the horizontally resampled rows its
// vertical filter needs, resizes can be chained without materialising the intermediate
// image, and only the pixels that survive a centre crop are computed. Peak memory is a
// few rows per stage plus the filter coefficients, not whole images.
//
// Thread-safety: every function here is reentrant; it touches only its arguments and the
// memory it allocates through the given Allocator.
#ifndef KILN_RUNTIME_IMAGE_PREPROCESS_H_
#define KILN_RUNTIME_IMAGE_PREPROCESS_H_

#include <cstddef>
#include <cstdint>

#include "kiln/kiln.h"
#include "support/allocator.h"

namespace kiln::rt {

class ThreadPool;

// Largest accepted input side (pixels) and output side S.
inline constexpr int32_t kMaxImageSide = 16384;
// Largest side of an intermediate resized image (a CLIP shortest-edge resize of a very
// long, thin image). Only the part that survives the centre crop is ever computed.
inline constexpr int64_t kMaxResizedSide = int64_t{1} << 24;

// PIL filter numbers (PIL.Image.Resampling, = transformers' PILImageResampling).
enum ResampleFilter : int32_t {
  kResampleNearest = 0,
  kResampleLanczos = 1,
  kResampleBilinear = 2,
  kResampleBicubic = 3,
  kResampleBox = 4,
  kResampleHamming = 5,
};

// What a checkpoint's preprocessor_config.json asks for, reduced to one RGB image and one
// tile. The input is RGB already, so do_convert_rgb has no effect (kept for fidelity).
struct ImagePreprocessSpec {
  enum class Processor { kClip, kIdefics3 };
  Processor processor = Processor::kClip;
  int32_t image_size = 0;          // S: output is [3, S, S]
  bool do_convert_rgb = true;
  bool do_resize = true;
  int32_t shortest_edge = 0;       // CLIP: resize so the shorter side is this (aspect kept, HF's rounding)
  int32_t longest_edge = 0;        // Idefics3: first resize so the longer side is this (aspect kept)
  int32_t resample = 3;            // PIL filter code (ResampleFilter)
  bool do_center_crop = false;
  int32_t crop_height = 0, crop_width = 0;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  float image_mean[3] = {0, 0, 0};  // float32, as numpy casts the config's values
  float image_std[3] = {1, 1, 1};
  int32_t max_image_edge = 0;      // Idefics3: the single tile is resized to max_image_edge x max_image_edge
  // CLIP with size {"height": h, "width": w} instead of {"shortest_edge": s}: used when
  // shortest_edge is 0 and both are > 0.
  int32_t resize_height = 0, resize_width = 0;
};

// Runs the processor on `rgb` (height rows of width RGB triplets, rows `stride` bytes
// apart, stride >= 3 * width) and writes [3, S, S] float32, channel-major, to out_pixels
// (`capacity` floats, at least 3 * S * S).
// Errors: KILN_ERROR_INVALID_ARGUMENT (a NULL pointer, a spec inconsistent with S or out
// of range), KILN_ERROR_INPUT_IMAGE (bad size or stride, an image that the spec cannot
// turn into S x S), KILN_ERROR_BUFFER_TOO_SMALL, KILN_ERROR_OUT_OF_MEMORY. out_pixels is
// written only on success. Temporary memory comes from `allocator` and is freed before
// returning. With a `pool`, its active threads resize ranges of rows side by side (the
// same pixels; the temporary memory once per thread).
kiln_status_t PreprocessImage(const ImagePreprocessSpec& spec, const uint8_t* rgb, int32_t width,
                              int32_t height, size_t stride, Allocator* allocator, float* out_pixels,
                              size_t capacity, kiln_error_t* error, ThreadPool* pool = nullptr);

// PIL-exact uint8 RGB resize: Image.fromarray(src).resize((out_width, out_height), filter).
// `out` receives out_height rows of out_width RGB triplets, tightly packed
// (3 * out_width * out_height bytes); it may not overlap `src`. Sides are limited to
// kMaxImageSide. Errors as PreprocessImage.
kiln_status_t ResizeRgb8(const uint8_t* src, int32_t width, int32_t height, size_t stride,
                         int32_t out_width, int32_t out_height, int32_t filter, Allocator* allocator,
                         uint8_t* out, kiln_error_t* error);

// The resampling loops ResizeRgb8 and PreprocessImage run from now on: the widest this
// CPU has (kWidest, the default: AVX2 on x86-64 CPUs that have it) or those of the
// build's baseline ISA. The bytes are the same; tests compare both with Pillow.
enum class ResampleLoops { kWidest, kBaseline };
void SetResampleLoops(ResampleLoops loops);

// transformers' get_resize_output_image_size(default_to_square=False) for an int size:
// the short side becomes `shortest_edge`, the long side int(shortest_edge * long / short).
// Returns false (and leaves the outputs alone) if the arguments are not positive or the long
// side would exceed kMaxResizedSide.
bool ShortestEdgeResizeSize(int32_t height, int32_t width, int32_t shortest_edge,
                            int32_t* out_height, int32_t* out_width);

// Idefics3: _resize_output_size_rescale_to_max_len (longest side = longest_edge, the
// other int(...) rounded up to even, at least 1) then
// _resize_output_size_scale_below_upper_bound (no side above 4096). Returns false if the
// arguments are not positive.
bool Idefics3ResizeSize(int32_t height, int32_t width, int32_t longest_edge, int32_t* out_height,
                        int32_t* out_width);

}  // namespace kiln::rt

#endif  // KILN_RUNTIME_IMAGE_PREPROCESS_H_
