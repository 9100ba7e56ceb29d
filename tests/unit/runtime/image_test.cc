// Image preprocessing: PIL-exact resize and the Hugging Face processors' pixel_values.
//
// The comparisons with PIL / the Python reference read vectors written by
// gen_image_vectors.py into the directory named by KILN_IMAGE_VECTORS (skipped when unset).
// Everything else (argument checking, allocation behaviour, invariants) runs always.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "image/preprocess.h"
#include "kiln/kiln.h"
#include "support/npy.h"
#include "support/allocator.h"
#include "thread_pool.h"

namespace kiln::rt {
namespace {

using NpyArray = npy::Array;

const char* VectorsDir() {
  const char* dir = std::getenv("KILN_IMAGE_VECTORS");
#ifdef KILN_DEFAULT_IMAGE_VECTORS
  if (dir == nullptr) dir = KILN_DEFAULT_IMAGE_VECTORS;  // the ctest fixture's output
#endif
  return (dir != nullptr && dir[0] != '\0') ? dir : nullptr;
}

#define REQUIRE_VECTORS()                                       \
  const char* vectors = VectorsDir();                           \
  if (vectors == nullptr)                                       \
    GTEST_SKIP() << "KILN_IMAGE_VECTORS is not set (run "       \
                    "tests/unit/runtime/gen_image_vectors.py)"; \
  const std::string dir(vectors)

std::vector<uint8_t> RandomImage(int32_t w, int32_t h, uint32_t seed) {
  std::vector<uint8_t> img(static_cast<size_t>(w) * h * 3);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : img) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<uint8_t>(x >> 24);
  }
  return img;
}

// Copies a packed image into rows `stride` bytes apart, the padding filled with junk.
std::vector<uint8_t> WithStride(const uint8_t* packed, int32_t w, int32_t h, size_t stride) {
  std::vector<uint8_t> out(stride * h, 0xA5);
  for (int32_t y = 0; y < h; ++y) {
    std::memcpy(out.data() + y * stride, packed + static_cast<size_t>(y) * w * 3,
                static_cast<size_t>(w) * 3);
  }
  return out;
}

ImagePreprocessSpec ClipSpec(int32_t edge, int32_t crop) {
  ImagePreprocessSpec spec;
  spec.processor = ImagePreprocessSpec::Processor::kClip;
  spec.image_size = crop;
  spec.shortest_edge = edge;
  spec.do_center_crop = true;
  spec.crop_height = spec.crop_width = crop;
  const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
  const float std_[3] = {0.26862954f, 0.26130258f, 0.27577711f};
  for (int c = 0; c < 3; ++c) {
    spec.image_mean[c] = mean[c];
    spec.image_std[c] = std_[c];
  }
  return spec;
}

ImagePreprocessSpec Idefics3Spec(int32_t longest, int32_t tile) {
  ImagePreprocessSpec spec;
  spec.processor = ImagePreprocessSpec::Processor::kIdefics3;
  spec.image_size = tile;
  spec.longest_edge = longest;
  spec.max_image_edge = tile;
  spec.resample = kResampleLanczos;
  for (int c = 0; c < 3; ++c) spec.image_mean[c] = spec.image_std[c] = 0.5f;
  return spec;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ------------------------------------------------------------------------------------
// Output sizes (the same expectations as tests/models/test_image_processing.py)
// ------------------------------------------------------------------------------------

TEST(ImageSizes, ShortestEdge) {
  int32_t h = 0, w = 0;
  ASSERT_TRUE(ShortestEdgeResizeSize(300, 200, 224, &h, &w));
  EXPECT_EQ(h, 336);
  EXPECT_EQ(w, 224);
  ASSERT_TRUE(ShortestEdgeResizeSize(200, 300, 224, &h, &w));
  EXPECT_EQ(h, 224);
  EXPECT_EQ(w, 336);
  ASSERT_TRUE(ShortestEdgeResizeSize(480, 640, 336, &h, &w));
  EXPECT_EQ(h, 336);
  EXPECT_EQ(w, 448);
  ASSERT_TRUE(ShortestEdgeResizeSize(100, 333, 10, &h, &w));  // int() truncates
  EXPECT_EQ(h, 10);
  EXPECT_EQ(w, 33);
  ASSERT_TRUE(ShortestEdgeResizeSize(1, 16384, 336, &h, &w));  // long and thin: allowed
  EXPECT_EQ(h, 336);
  EXPECT_EQ(w, 336 * 16384);
  EXPECT_FALSE(ShortestEdgeResizeSize(1, 16384, 16384, &h, &w));  // beyond kMaxResizedSide
  EXPECT_FALSE(ShortestEdgeResizeSize(0, 10, 10, &h, &w));
  EXPECT_FALSE(ShortestEdgeResizeSize(10, 10, 0, &h, &w));
}

TEST(ImageSizes, Idefics3LongestEdge) {
  int32_t h = 0, w = 0;
  ASSERT_TRUE(Idefics3ResizeSize(300, 200, 2048, &h, &w));
  EXPECT_EQ(h, 2048);
  EXPECT_EQ(w, 1366);
  ASSERT_TRUE(Idefics3ResizeSize(203, 300, 2048, &h, &w));  // int(1385.8) = 1385 -> 1386
  EXPECT_EQ(h, 1386);
  EXPECT_EQ(w, 2048);
  ASSERT_TRUE(Idefics3ResizeSize(200, 301, 2048, &h, &w));  // int(1360.8) = 1360, even
  EXPECT_EQ(h, 1360);
  EXPECT_EQ(w, 2048);
  ASSERT_TRUE(Idefics3ResizeSize(64, 64, 256, &h, &w));
  EXPECT_EQ(h, 256);
  EXPECT_EQ(w, 256);
  ASSERT_TRUE(Idefics3ResizeSize(1, 16384, 2048, &h, &w));  // the short side stays >= 1
  EXPECT_EQ(h, 1);
  EXPECT_EQ(w, 2048);
  ASSERT_TRUE(Idefics3ResizeSize(100, 100, 5001, &h, &w));  // 5001 x 5002, then capped at 4096
  EXPECT_EQ(h, 4096);
  EXPECT_EQ(w, 4095);
  EXPECT_FALSE(Idefics3ResizeSize(10, 10, 0, &h, &w));
}

// ------------------------------------------------------------------------------------
// Invariants that need no reference
// ------------------------------------------------------------------------------------

TEST(ResizeRgb8, SameSizeIsACopyForEveryFilter) {
  const int32_t w = 23, h = 11;
  std::vector<uint8_t> img = RandomImage(w, h, 7);
  std::vector<uint8_t> strided = WithStride(img.data(), w, h, w * 3 + 5);
  Allocator allocator;
  for (int32_t f = 0; f <= 5; ++f) {
    std::vector<uint8_t> out(img.size(), 0);
    kiln_error_t err{};
    ASSERT_EQ(ResizeRgb8(strided.data(), w, h, w * 3 + 5, w, h, f, &allocator, out.data(), &err),
              KILN_OK)
        << err.message;
    EXPECT_EQ(out, img) << "filter " << f;
  }
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

TEST(ResizeRgb8, ConstantImageStaysConstant) {
  Allocator allocator;
  const int32_t sizes[][4] = {{17, 9, 40, 3}, {1, 1, 5, 7}, {64, 48, 7, 5}, {5, 80, 5, 13}};
  for (int32_t f = 0; f <= 5; ++f) {
    for (const auto& s : sizes) {
      for (uint8_t value : {uint8_t{0}, uint8_t{1}, uint8_t{128}, uint8_t{254}, uint8_t{255}}) {
        std::vector<uint8_t> img(static_cast<size_t>(s[0]) * s[1] * 3, value);
        std::vector<uint8_t> out(static_cast<size_t>(s[2]) * s[3] * 3, 0x5A);
        ASSERT_EQ(ResizeRgb8(img.data(), s[0], s[1], s[0] * 3, s[2], s[3], f, &allocator,
                             out.data(), nullptr),
                  KILN_OK);
        for (uint8_t v : out) ASSERT_EQ(v, value) << "filter " << f << " " << s[0] << "x" << s[1];
      }
    }
  }
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

// PreprocessImage computes only the cropped part of the resize, streaming; it must equal
// the whole resize (ResizeRgb8) cropped and normalised afterwards.
TEST(PreprocessImage, ClipEqualsFullResizeThenCrop) {
  const int32_t w = 97, h = 61;
  std::vector<uint8_t> img = RandomImage(w, h, 11);
  Allocator allocator;
  struct Case {
    int32_t edge, crop;
  } cases[] = {{40, 32}, {40, 40}, {24, 32}, {61, 64}, {7, 9}};
  for (int32_t f = 0; f <= 5; ++f) {
    for (const Case& c : cases) {
      ImagePreprocessSpec spec = ClipSpec(c.edge, c.crop);
      spec.resample = f;
      int32_t rh = 0, rw = 0;
      ASSERT_TRUE(ShortestEdgeResizeSize(h, w, c.edge, &rh, &rw));
      std::vector<uint8_t> resized(static_cast<size_t>(rw) * rh * 3);
      ASSERT_EQ(ResizeRgb8(img.data(), w, h, w * 3, rw, rh, f, &allocator, resized.data(), nullptr),
                KILN_OK);
      const int32_t s = c.crop;
      std::vector<float> out(3 * static_cast<size_t>(s) * s);
      kiln_error_t err{};
      ASSERT_EQ(
          PreprocessImage(spec, img.data(), w, h, w * 3, &allocator, out.data(), out.size(), &err),
          KILN_OK)
          << err.message;
      // transformers' center_crop offsets; zero padding outside the resized image.
      const int32_t top = rh >= s ? (rh - s) / 2 : -((s - rh + 1) / 2);
      const int32_t left = rw >= s ? (rw - s) / 2 : -((s - rw + 1) / 2);
      size_t mismatches = 0;
      for (int ch = 0; ch < 3; ++ch) {
        for (int32_t i = 0; i < s; ++i) {
          for (int32_t j = 0; j < s; ++j) {
            const int32_t y = i + top, x = j + left;
            const uint8_t v = (y >= 0 && y < rh && x >= 0 && x < rw)
                                  ? resized[(static_cast<size_t>(y) * rw + x) * 3 + ch]
                                  : 0;
            const float rescaled = static_cast<float>(v * spec.rescale_factor);
            const float expected = (rescaled - spec.image_mean[ch]) / spec.image_std[ch];
            mismatches += Bits(out[(static_cast<size_t>(ch) * s + i) * s + j]) != Bits(expected);
          }
        }
      }
      EXPECT_EQ(mismatches, 0u) << "filter " << f << " edge " << c.edge << " crop " << c.crop;
    }
  }
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

// A photo-sized input streams through a few rows per resize: no whole-image buffers.
TEST(PreprocessImage, StreamsWithSmallPeakMemory) {
  const int32_t w = 1920, h = 1080;
  std::vector<uint8_t> img = RandomImage(w, h, 3);
  std::vector<float> out(3 * 512 * 512);
  Allocator allocator;
  kiln_error_t err{};
  ASSERT_EQ(PreprocessImage(Idefics3Spec(2048, 512), img.data(), w, h, w * 3, &allocator,
                            out.data(), out.size(), &err),
            KILN_OK)
      << err.message;
  EXPECT_EQ(allocator.current_bytes(), 0u);
  EXPECT_LT(allocator.peak_bytes(), 1u << 20) << "the 2048x1152 intermediate was materialised";

  Allocator clip_allocator;
  std::vector<float> clip(3 * 336 * 336);
  ASSERT_EQ(PreprocessImage(ClipSpec(336, 336), img.data(), w, h, w * 3, &clip_allocator,
                            clip.data(), clip.size(), &err),
            KILN_OK)
      << err.message;
  EXPECT_EQ(clip_allocator.current_bytes(), 0u);
  EXPECT_LT(clip_allocator.peak_bytes(), 1u << 20);
}

// With a thread pool, ranges of rows are resized side by side, each by its own
// resizers: the pixels are those of one thread, bit for bit, for every filter and split.
TEST(PreprocessImage, ThreadsGiveTheSamePixels) {
  const int32_t w = 301, h = 203;
  std::vector<uint8_t> img = RandomImage(w, h, 17);
  Allocator allocator;
  struct Case {
    ImagePreprocessSpec spec;
    int32_t s;
  } cases[] = {{Idefics3Spec(1024, 96), 96}, {ClipSpec(40, 32), 32}, {ClipSpec(61, 64), 64}, {ClipSpec(7, 9), 9}};
  for (int threads = 2; threads <= 4; ++threads) {
    ThreadPool* pool = ThreadPool::Create(threads, &allocator);
    ASSERT_NE(pool, nullptr);
    for (int32_t f = 0; f <= 5; ++f) {
      for (Case c : cases) {
        c.spec.resample = f;
        const size_t n = 3 * static_cast<size_t>(c.s) * c.s;
        std::vector<float> one(n, -1.0f), many(n, -2.0f);
        kiln_error_t err{};
        ASSERT_EQ(PreprocessImage(c.spec, img.data(), w, h, w * 3, &allocator, one.data(), n, &err), KILN_OK)
            << err.message;
        ASSERT_EQ(PreprocessImage(c.spec, img.data(), w, h, w * 3, &allocator, many.data(), n, &err, pool), KILN_OK)
            << err.message;
        size_t mismatches = 0;
        for (size_t i = 0; i < n; ++i) mismatches += Bits(one[i]) != Bits(many[i]);
        EXPECT_EQ(mismatches, 0u) << threads << " threads, filter " << f << ", size " << c.s;
      }
    }
    ThreadPool::Destroy(pool);
  }
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

// An allocator that fails after `budget` allocations.
struct FailingAllocator {
  int budget;
  static void* Alloc(void* user, size_t size, size_t alignment) {
    auto* self = static_cast<FailingAllocator*>(user);
    if (self->budget-- <= 0) return nullptr;
    void* p = nullptr;
    return posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment,
                          size == 0 ? 1 : size) == 0
               ? p
               : nullptr;
  }
  static void Free(void*, void* ptr) { std::free(ptr); }
};

TEST(PreprocessImage, AllocationFailureIsReportedWithoutLeaks) {
  const int32_t w = 300, h = 200;
  std::vector<uint8_t> img = RandomImage(w, h, 5);
  std::vector<float> out(3 * 64 * 64);
  Allocator pool_allocator;
  ThreadPool* pool = ThreadPool::Create(3, &pool_allocator);
  ASSERT_NE(pool, nullptr);
  // Without a pool, and with one (a chain of resizers per thread, all made before any
  // row is written).
  for (ThreadPool* with : {static_cast<ThreadPool*>(nullptr), pool}) {
    for (const ImagePreprocessSpec& spec : {ClipSpec(64, 64), Idefics3Spec(256, 64)}) {
      bool succeeded = false;
      for (int budget = 0; budget < 128 && !succeeded; ++budget) {
        FailingAllocator failing{budget};
        kiln_allocator_t raw{&FailingAllocator::Alloc, &FailingAllocator::Free, &failing};
        Allocator allocator(&raw);
        std::fill(out.begin(), out.end(), -7.0f);
        kiln_error_t err{};
        const kiln_status_t s =
            PreprocessImage(spec, img.data(), w, h, w * 3, &allocator, out.data(), out.size(), &err, with);
        EXPECT_EQ(allocator.current_bytes(), 0u);
        if (s == KILN_OK) {
          succeeded = true;
        } else {
          EXPECT_EQ(s, KILN_ERROR_OUT_OF_MEMORY) << err.message;
          EXPECT_EQ(err.status, KILN_ERROR_OUT_OF_MEMORY);
          EXPECT_GT(std::strlen(err.message), 0u);
          EXPECT_EQ(out[0], -7.0f) << "output written on failure";
        }
      }
      EXPECT_TRUE(succeeded);
    }
  }
  ThreadPool::Destroy(pool);
}

// ------------------------------------------------------------------------------------
// Argument checking
// ------------------------------------------------------------------------------------

class PreprocessErrors : public ::testing::Test {
 protected:
  kiln_status_t Run(const ImagePreprocessSpec& spec, int32_t w, int32_t h, size_t stride,
                    size_t capacity, const uint8_t* rgb = nullptr, bool null_rgb = false,
                    bool null_out = false, bool null_alloc = false) {
    if (rgb == nullptr && !null_rgb) rgb = pixels_.data();
    out_.assign(3 * 64 * 64 + 16, -3.0f);
    err_ = kiln_error_t{};
    const kiln_status_t s =
        PreprocessImage(spec, rgb, w, h, stride, null_alloc ? nullptr : &allocator_,
                        null_out ? nullptr : out_.data(), capacity, &err_);
    if (s != KILN_OK) {
      EXPECT_EQ(err_.status, s);
      EXPECT_GT(std::strlen(err_.message), 0u);
      for (float v : out_) EXPECT_EQ(v, -3.0f) << "output written on failure";
    }
    return s;
  }
  std::string message() const { return err_.message; }

  std::vector<uint8_t> pixels_ = RandomImage(40, 30, 1);
  std::vector<float> out_;
  Allocator allocator_;
  kiln_error_t err_{};
  const size_t cap_ = 3 * 64 * 64;
};

TEST_F(PreprocessErrors, NullPointers) {
  const ImagePreprocessSpec spec = ClipSpec(64, 64);
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_, nullptr, /*null_rgb=*/true), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("rgb"), std::string::npos) << message();
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_, nullptr, false, /*null_out=*/true),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("out_pixels"), std::string::npos) << message();
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_, nullptr, false, false, /*null_alloc=*/true),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("allocator"), std::string::npos) << message();
  // A NULL error pointer is allowed.
  EXPECT_EQ(PreprocessImage(spec, nullptr, 40, 30, 120, &allocator_, out_.data(), cap_, nullptr),
            KILN_ERROR_INVALID_ARGUMENT);
}

TEST_F(PreprocessErrors, BadImageGeometry) {
  const ImagePreprocessSpec spec = ClipSpec(64, 64);
  EXPECT_EQ(Run(spec, 0, 30, 120, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("0x30"), std::string::npos) << message();
  EXPECT_EQ(Run(spec, 40, -1, 120, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_EQ(Run(spec, 16385, 1, 3 * 16385, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("16384"), std::string::npos) << message();
  EXPECT_EQ(Run(spec, 1, 16385, 3, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_EQ(Run(spec, 40, 30, 119, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("stride"), std::string::npos) << message();
  EXPECT_EQ(Run(spec, 40, 30, SIZE_MAX / 8, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("overflow"), std::string::npos) << message();
}

TEST_F(PreprocessErrors, CapacityTooSmall) {
  EXPECT_EQ(Run(ClipSpec(64, 64), 40, 30, 120, cap_ - 1), KILN_ERROR_BUFFER_TOO_SMALL);
  EXPECT_NE(message().find("12288"), std::string::npos) << message();
  EXPECT_EQ(Run(ClipSpec(64, 64), 40, 30, 120, cap_), KILN_OK) << message();
}

TEST_F(PreprocessErrors, InconsistentSpec) {
  ImagePreprocessSpec spec = ClipSpec(64, 64);
  spec.image_size = 0;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("image_size"), std::string::npos) << message();
  spec = ClipSpec(64, 64);
  spec.image_size = 16385;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);

  spec = ClipSpec(64, 64);
  spec.crop_width = 63;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("crop"), std::string::npos) << message();

  spec = ClipSpec(64, 64);
  spec.resample = 6;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("resample"), std::string::npos) << message();
  spec.resample = -1;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);

  spec = ClipSpec(0, 64);
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("shortest_edge"), std::string::npos) << message();

  spec = ClipSpec(48, 64);
  spec.do_center_crop = false;  // the resized image is not 64x64
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);

  spec = ClipSpec(64, 64);
  spec.do_center_crop = false;  // shortest edge 64 of a 40x30 image: 85x64, not 64x64
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("85x64"), std::string::npos) << message();

  spec = ClipSpec(64, 64);
  spec.image_std[1] = 0.0f;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("image_std[1]"), std::string::npos) << message();
  spec = ClipSpec(64, 64);
  spec.image_mean[2] = NAN;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  spec = ClipSpec(64, 64);
  spec.rescale_factor = INFINITY;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("rescale_factor"), std::string::npos) << message();

  spec = Idefics3Spec(256, 64);
  spec.max_image_edge = 32;
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("max_image_edge"), std::string::npos) << message();
  spec = Idefics3Spec(0, 64);
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message().find("longest_edge"), std::string::npos) << message();
  spec.do_resize = false;  // longest_edge unused then
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_OK) << message();

  spec = ClipSpec(64, 64);
  spec.processor = static_cast<ImagePreprocessSpec::Processor>(9);
  EXPECT_EQ(Run(spec, 40, 30, 120, cap_), KILN_ERROR_INVALID_ARGUMENT);
}

TEST_F(PreprocessErrors, ExtremeAspectRatio) {
  // 1 x 16384 at shortest edge 16384 would be 16384 x 2^28: refused, not allocated.
  std::vector<uint8_t> tall(3 * 16384, 9);
  ImagePreprocessSpec spec = ClipSpec(16384, 64);
  EXPECT_EQ(Run(spec, 1, 16384, 3, cap_, tall.data()), KILN_ERROR_INPUT_IMAGE);
  EXPECT_NE(message().find("aspect"), std::string::npos) << message();
  // At shortest edge 64 it is 64 x 1048576 and only the crop is computed.
  spec = ClipSpec(64, 64);
  EXPECT_EQ(Run(spec, 1, 16384, 3, cap_, tall.data()), KILN_OK) << message();
}

TEST(ResizeRgb8Errors, Arguments) {
  std::vector<uint8_t> img = RandomImage(8, 8, 2);
  std::vector<uint8_t> out(3 * 16 * 16, 0x77);
  Allocator allocator;
  kiln_error_t err{};
  EXPECT_EQ(ResizeRgb8(nullptr, 8, 8, 24, 4, 4, 3, &allocator, out.data(), &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 24, 4, 4, 3, &allocator, nullptr, &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 24, 4, 4, 3, nullptr, out.data(), &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 23, 4, 4, 3, &allocator, out.data(), &err),
            KILN_ERROR_INPUT_IMAGE);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 0, 24, 4, 4, 3, &allocator, out.data(), &err),
            KILN_ERROR_INPUT_IMAGE);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 24, 0, 4, 3, &allocator, out.data(), &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("0x4"), std::string::npos) << err.message;
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 24, 4, 16385, 3, &allocator, out.data(), &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ResizeRgb8(img.data(), 8, 8, 24, 4, 4, 6, &allocator, out.data(), &err),
            KILN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err.message).find("filter 6"), std::string::npos) << err.message;
  for (uint8_t v : out) EXPECT_EQ(v, 0x77);
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

// ------------------------------------------------------------------------------------
// Against PIL and the Python reference
// ------------------------------------------------------------------------------------

struct ImageCache {
  std::map<std::string, NpyArray> images;
  const NpyArray* Get(const std::string& dir, const std::string& name) {
    auto it = images.find(name);
    if (it != images.end()) return &it->second;
    NpyArray a;
    std::string error;
    if (!npy::Read(dir + "/images/" + name + ".npy", &a, &error)) {
      ADD_FAILURE() << error;
      return nullptr;
    }
    if (a.dtype != "u1" || a.shape.size() != 3 || a.shape[2] != 3) {
      ADD_FAILURE() << name << ": not a uint8 [H, W, 3] image";
      return nullptr;
    }
    return &images.emplace(name, std::move(a)).first->second;
  }
};

// Each filter through the loops this CPU runs by default (AVX2 on an x86-64 CPU that
// has it) and through the build's baseline ones.
class ResizeMatchesPil : public ::testing::TestWithParam<std::tuple<int, ResampleLoops>> {
 protected:
  void TearDown() override { SetResampleLoops(ResampleLoops::kWidest); }
};

TEST_P(ResizeMatchesPil, BitExact) {
  REQUIRE_VECTORS();
  const int filter = std::get<0>(GetParam());
  SetResampleLoops(std::get<1>(GetParam()));
  std::ifstream cases(dir + "/resize_cases.txt");
  ASSERT_TRUE(cases) << "cannot open " << dir << "/resize_cases.txt";
  ImageCache cache;
  Allocator allocator;
  std::string line;
  int checked = 0, failed = 0;
  while (std::getline(cases, line)) {
    std::istringstream in(line);
    std::string name, expected_file;
    int32_t ow = 0, oh = 0, f = -1;
    if (!(in >> name >> ow >> oh >> f >> expected_file)) continue;
    if (f != filter) continue;
    const NpyArray* img = cache.Get(dir, name);
    ASSERT_NE(img, nullptr);
    NpyArray expected;
    std::string error;
    ASSERT_TRUE(npy::Read(dir + "/" + expected_file, &expected, &error)) << error;
    ASSERT_EQ(expected.count(), static_cast<size_t>(ow) * oh * 3) << expected_file;
    const int32_t w = static_cast<int32_t>(img->shape[1]);
    const int32_t h = static_cast<int32_t>(img->shape[0]);
    // Every other case reads the input through a padded stride.
    const bool padded = (checked % 2) == 1;
    const size_t stride = static_cast<size_t>(w) * 3 + (padded ? 13 : 0);
    std::vector<uint8_t> src = WithStride(img->bytes.data(), w, h, stride);
    std::vector<uint8_t> out(expected.count(), 0);
    kiln_error_t err{};
    ASSERT_EQ(ResizeRgb8(src.data(), w, h, stride, ow, oh, filter, &allocator, out.data(), &err),
              KILN_OK)
        << line << ": " << err.message;
    ++checked;
    size_t diffs = 0, first = 0;
    int max_diff = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const int d = std::abs(int{out[i]} - int{expected.bytes.data()[i]});
      if (d != 0 && diffs++ == 0) first = i;
      if (d > max_diff) max_diff = d;
    }
    if (diffs != 0) {
      ++failed;
      ADD_FAILURE() << line << ": " << diffs << " of " << out.size() << " bytes differ (max |diff| "
                    << max_diff << "), first at byte " << first << " (pixel " << first / 3 % ow
                    << "," << first / 3 / ow << ")";
    }
  }
  EXPECT_GT(checked, 150) << "too few resize cases for filter " << filter;
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(allocator.current_bytes(), 0u);
}

std::string FilterTestName(const ::testing::TestParamInfo<std::tuple<int, ResampleLoops>>& info) {
  static const char* const kNames[] = {"Nearest", "Lanczos", "Bilinear",
                                       "Bicubic", "Box",     "Hamming"};
  return std::string(kNames[std::get<0>(info.param)]) +
         (std::get<1>(info.param) == ResampleLoops::kWidest ? "" : "_BaselineLoops");
}

INSTANTIATE_TEST_SUITE_P(Filters, ResizeMatchesPil,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3, 4, 5),
                                            ::testing::Values(ResampleLoops::kWidest, ResampleLoops::kBaseline)),
                         FilterTestName);

bool ParseTriple(const std::string& v, float out[3]) {
  std::istringstream in(v);
  std::string part;
  for (int c = 0; c < 3; ++c) {
    if (!std::getline(in, part, ',')) return false;
    // The generator writes the exact decimal of each float32: parse as double, cast.
    out[c] = static_cast<float>(std::strtod(part.c_str(), nullptr));
  }
  return true;
}

bool ParseHxW(const std::string& v, int32_t* h, int32_t* w) {
  return std::sscanf(v.c_str(), "%dx%d", h, w) == 2;
}

bool ParseSpec(std::istringstream& in, ImagePreprocessSpec* spec, std::string* bad) {
  std::string token;
  while (in >> token) {
    const size_t eq = token.find('=');
    if (eq == std::string::npos) return *bad = token, false;
    const std::string key = token.substr(0, eq), v = token.substr(eq + 1);
    const int iv = std::atoi(v.c_str());
    if (key == "processor") {
      if (v == "clip")
        spec->processor = ImagePreprocessSpec::Processor::kClip;
      else if (v == "idefics3")
        spec->processor = ImagePreprocessSpec::Processor::kIdefics3;
      else
        return *bad = token, false;
    } else if (key == "image_size")
      spec->image_size = iv;
    else if (key == "do_resize")
      spec->do_resize = iv != 0;
    else if (key == "shortest_edge")
      spec->shortest_edge = iv;
    else if (key == "resize") {
      if (!ParseHxW(v, &spec->resize_height, &spec->resize_width)) return *bad = token, false;
    } else if (key == "longest_edge")
      spec->longest_edge = iv;
    else if (key == "max_image_edge")
      spec->max_image_edge = iv;
    else if (key == "resample")
      spec->resample = iv;
    else if (key == "do_center_crop")
      spec->do_center_crop = iv != 0;
    else if (key == "crop") {
      if (!ParseHxW(v, &spec->crop_height, &spec->crop_width)) return *bad = token, false;
    } else if (key == "do_rescale")
      spec->do_rescale = iv != 0;
    else if (key == "rescale_factor")
      spec->rescale_factor = std::strtod(v.c_str(), nullptr);
    else if (key == "do_normalize")
      spec->do_normalize = iv != 0;
    else if (key == "mean") {
      if (!ParseTriple(v, spec->image_mean)) return *bad = token, false;
    } else if (key == "std") {
      if (!ParseTriple(v, spec->image_std)) return *bad = token, false;
    } else {
      return *bad = token, false;
    }
  }
  return true;
}

TEST(PreprocessMatchesReference, BitExact) {
  REQUIRE_VECTORS();
  std::ifstream cases(dir + "/preprocess_cases.txt");
  ASSERT_TRUE(cases) << "cannot open " << dir << "/preprocess_cases.txt";
  ImageCache cache;
  Allocator allocator;
  std::string line;
  int checked = 0, clip = 0, idefics3 = 0;
  while (std::getline(cases, line)) {
    std::istringstream in(line);
    std::string name, expected_file, bad;
    if (!(in >> name >> expected_file)) continue;
    ImagePreprocessSpec spec;
    ASSERT_TRUE(ParseSpec(in, &spec, &bad)) << line << ": cannot parse '" << bad << "'";
    const NpyArray* img = cache.Get(dir, name);
    ASSERT_NE(img, nullptr);
    NpyArray expected_npy;
    std::string error;
    ASSERT_TRUE(npy::Read(dir + "/" + expected_file, &expected_npy, &error)) << error;
    ASSERT_EQ(expected_npy.dtype, "f4");
    const size_t s = static_cast<size_t>(spec.image_size);
    ASSERT_EQ(expected_npy.shape, (std::vector<size_t>{3, s, s})) << expected_file;
    const std::vector<float> expected = expected_npy.AsFloat();
    const int32_t w = static_cast<int32_t>(img->shape[1]);
    const int32_t h = static_cast<int32_t>(img->shape[0]);
    for (const bool padded : {false, true}) {
      const size_t stride = static_cast<size_t>(w) * 3 + (padded ? 5 : 0);
      std::vector<uint8_t> src = WithStride(img->bytes.data(), w, h, stride);
      std::vector<float> out(expected.size() + 1, -99.0f);
      kiln_error_t err{};
      ASSERT_EQ(PreprocessImage(spec, src.data(), w, h, stride, &allocator, out.data(),
                                expected.size(), &err),
                KILN_OK)
          << line << ": " << err.message;
      EXPECT_EQ(out.back(), -99.0f) << "wrote past capacity";
      size_t diffs = 0, first = 0;
      int64_t max_ulp = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        if (Bits(out[i]) != Bits(expected[i])) {
          if (diffs++ == 0) first = i;
          const int64_t ulp = std::llabs(static_cast<int64_t>(static_cast<int32_t>(Bits(out[i]))) -
                                         static_cast<int32_t>(Bits(expected[i])));
          if (ulp > max_ulp) max_ulp = ulp;
        }
      }
      EXPECT_EQ(diffs, 0u) << expected_file << (padded ? " (padded stride)" : "") << ": " << diffs
                           << " of " << expected.size() << " values differ, max " << max_ulp
                           << " ulp; first at [" << first / (s * s) << ", " << first / s % s << ", "
                           << first % s << "]: " << out[first] << " vs " << expected[first];
    }
    ++checked;
    (spec.processor == ImagePreprocessSpec::Processor::kClip ? clip : idefics3)++;
  }
  EXPECT_GE(clip, 10);
  EXPECT_GE(idefics3, 5);
  EXPECT_EQ(allocator.current_bytes(), 0u);
  RecordProperty("cases", checked);
}

}  // namespace
}  // namespace kiln::rt
