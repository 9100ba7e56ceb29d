#include "image/preprocess.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>

#include "support/error.h"
#include "support/vec.h"
#include "thread_pool.h"

// Bit-exactness with Pillow depends on evaluating the coefficient arithmetic exactly as
// written, in double precision, one rounding per operation: no fused multiply-add (which
// clang would otherwise form on targets that have it, such as every aarch64 CPU) and
// never -ffast-math for this file. Pillow itself is built for x86-64 without FMA.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// The horizontal pass accumulates R, G, B as lanes of a 4 x int32 vector where 32-bit
// vector multiplies are cheap (NEON, SSE4.1); plain SSE2 lacks them and stays scalar.
#if (defined(__clang__) || defined(__GNUC__)) && \
    (defined(__ARM_NEON) || defined(__aarch64__) || defined(__SSE4_1__))
#define KILN_IMAGE_VECTOR_HORIZONTAL 1
#else
#define KILN_IMAGE_VECTOR_HORIZONTAL 0
#endif

// On x86-64 the resampling loops are compiled a second time for AVX2 (32-bit vector
// multiplies, 8 lanes) and chosen at run time on a CPU that has it.
#if (defined(__clang__) || defined(__GNUC__)) && defined(__x86_64__) && !defined(__AVX2__)
#define KILN_IMAGE_AVX2_LOOPS 1
#else
#define KILN_IMAGE_AVX2_LOOPS 0
#endif

namespace kiln::rt {
namespace {

// ------------------------------------------------------------------------------------
// Pillow's resampling filters (libImaging/Resample.c), evaluated exactly as there.
// ------------------------------------------------------------------------------------

constexpr double kPi = 3.14159265358979323846;  // M_PI

double BoxFilter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double BilinearFilter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

double HammingFilter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * kPi;
  // The float literals are Pillow's: 0.54f and 0.46f promoted to double.
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}

double BicubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double SincFilter(double x) {
  if (x == 0.0) return 1.0;
  x = x * kPi;
  return std::sin(x) / x;
}

double LanczosFilter(double x) {
  // truncated sinc
  if (-3.0 <= x && x < 3.0) return SincFilter(x) * SincFilter(x / 3);
  return 0.0;
}

struct Filter {
  double (*fn)(double);
  double support;
};

bool FilterFor(int32_t code, Filter* out) {
  switch (code) {
    case kResampleLanczos:
      *out = {LanczosFilter, 3.0};
      return true;
    case kResampleBilinear:
      *out = {BilinearFilter, 1.0};
      return true;
    case kResampleBicubic:
      *out = {BicubicFilter, 2.0};
      return true;
    case kResampleBox:
      *out = {BoxFilter, 0.5};
      return true;
    case kResampleHamming:
      *out = {HammingFilter, 1.0};
      return true;
    default:
      return false;
  }
}

// 8 bits of result, 2 bits of headroom for negative lobes and overshoot.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);

// Pillow's clip8: a lookup of (v >> PRECISION_BITS) in a table that clamps to [0, 255].
inline uint8_t Clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic shift, as Pillow relies on
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// One axis of a separable resize: for each output index of interest, the first input
// index, the number of taps and ksize fixed-point coefficients (22 fractional bits).
struct AxisCoeffs {
  explicit AxisCoeffs(Allocator* allocator) : bounds(allocator), coeffs(allocator) {}
  Vec<int32_t> bounds;  // [2 * count]: first input index, tap count
  Vec<int32_t> coeffs;  // [count * ksize]
  int32_t ksize = 0;
  int32_t max_taps = 0;
};

// Pillow's precompute_coeffs (box = [0, in_size]) followed by normalize_coeffs_8bpc, for
// the outputs [first, first + count) of an in_size -> out_size resize.
kiln_status_t PrecomputeCoeffs(int32_t in_size, int32_t out_size, const Filter& filter,
                               int32_t first, int32_t count, Allocator* allocator, AxisCoeffs* axis,
                               kiln_error_t* error) {
  // in0 = 0.0f and in1 = (float)in_size; in1 - in0 is evaluated in float (exact here).
  const float in0 = 0.0f;
  const float in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  double filterscale = scale;
  if (filterscale < 1.0) filterscale = 1.0;
  const double support = filter.support * filterscale;
  const double ceil_support = std::ceil(support);
  if (!(ceil_support < 1e9)) {
    return Fail(error, KILN_ERROR_INTERNAL, "resize %d -> %d: filter support out of range", in_size,
                out_size);
  }
  const int32_t ksize = static_cast<int32_t>(ceil_support) * 2 + 1;
  const size_t n = static_cast<size_t>(count);
  const size_t k = static_cast<size_t>(ksize);
  Vec<double> weights(allocator);
  if (n > SIZE_MAX / 2 || (k != 0 && n > SIZE_MAX / k) || !axis->bounds.resize(2 * n) ||
      !axis->coeffs.resize(n * k) || !weights.resize(k)) {
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY,
                "resize %d -> %d: cannot allocate %zu x %d filter coefficients", in_size, out_size,
                n, ksize);
  }
  axis->ksize = ksize;
  axis->max_taps = 0;
  double* w = weights.data();
  for (int32_t i = 0; i < count; ++i) {
    const int32_t xx = first + i;
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    // Round the value
    int32_t xmin = static_cast<int32_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    // Round the value
    int32_t xmax = static_cast<int32_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    if (xmax < 0 || xmax > ksize) {
      return Fail(error, KILN_ERROR_INTERNAL,
                  "resize %d -> %d: output %d has %d taps, more than the %d computed", in_size,
                  out_size, xx, xmax, ksize);
    }
    for (int32_t x = 0; x < xmax; ++x) {
      const double v = filter.fn((x + xmin - center + 0.5) * ss);
      w[x] = v;
      ww += v;
    }
    for (int32_t x = 0; x < xmax; ++x) {
      if (ww != 0.0) w[x] /= ww;
    }
    int32_t* kk = axis->coeffs.data() + static_cast<size_t>(i) * k;
    for (int32_t x = 0; x < ksize; ++x) {
      const double v = x < xmax ? w[x] : 0.0;
      if (v < 0) {
        kk[x] = static_cast<int32_t>(-0.5 + v * (1 << kPrecisionBits));
      } else {
        kk[x] = static_cast<int32_t>(0.5 + v * (1 << kPrecisionBits));
      }
    }
    axis->bounds[2 * static_cast<size_t>(i)] = xmin;
    axis->bounds[2 * static_cast<size_t>(i) + 1] = xmax;
    if (xmax > axis->max_taps) axis->max_taps = xmax;
  }
  return KILN_OK;
}

// Pillow's ImagingScaleAffine positions for NEAREST: the source index of every output
// index of [first, first + count), or -1 where Pillow fills with zeros. The position is
// accumulated (xo += a) from the first output on, exactly as Pillow does.
kiln_status_t NearestTable(int32_t in_size, int32_t out_size, int32_t first, int32_t count,
                           Vec<int32_t>* table, kiln_error_t* error) {
  if (!table->resize(static_cast<size_t>(count))) {
    return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "resize %d -> %d: cannot allocate %d indices",
                in_size, out_size, count);
  }
  const float box0 = 0.0f;
  const float box1 = static_cast<float>(in_size);
  const double a = static_cast<double>(box1 - box0) / out_size;
  double xo = box0 + a * 0.5;
  for (int32_t x = 0; x < first + count; ++x) {
    const int32_t xin = xo < 0.0 ? -1 : static_cast<int32_t>(xo);
    if (x >= first)
      (*table)[static_cast<size_t>(x - first)] = (xin >= 0 && xin < in_size) ? xin : -1;
    xo += a;
  }
  return KILN_OK;
}

// ------------------------------------------------------------------------------------
// Resampling loops
// ------------------------------------------------------------------------------------

// The inner loops of one horizontal and one vertical pass, inlined into the baseline
// build's functions and, on x86-64, into AVX2 ones as well (KILN_IMAGE_AVX2_LOOPS). The
// sums are integers: every version gives the same bytes.
#define KILN_RESAMPLE_INLINE inline __attribute__((always_inline))

typedef int32_t V4i __attribute__((vector_size(16)));
typedef uint8_t V4u8 __attribute__((vector_size(4)));
typedef int32_t V8i __attribute__((vector_size(32)));
typedef uint8_t V8u8 __attribute__((vector_size(8)));

// What one horizontal pass reads: per output column of the region, the first source
// pixel and the tap count (bounds), ksize coefficients; columns [0, vector_end) never
// read the last source pixel.
struct HorizontalPass {
  const int32_t* bounds;
  const int32_t* coeffs;
  size_t ksize;
  int32_t vector_end;
  int32_t width;
};

// ImagingResampleHorizontal_8bpc for one row (region columns only). `in` is a full
// source row. The sums are integers (order-independent, no overflow: Pillow relies on
// the same), so the three channels can be accumulated as lanes of one vector. kLanes 4:
// each tap loads 4 bytes (R, G, B and the next pixel's R, whose lane is ignored); 8: two
// taps at a time load 8 bytes (two pixels and the R, G of the next), lanes 0-2 take the
// first tap's coefficient and 3-5 the second's. Outputs whose window reaches the last
// source pixel would load past the row: scalar path (kLanes 0 is scalar throughout).
template <int kLanes>
KILN_RESAMPLE_INLINE void HorizontalLoop(const HorizontalPass& h, const uint8_t* in, uint8_t* out) {
  int32_t i = 0;
  if constexpr (kLanes == 8) {
    typedef int32_t V2i __attribute__((vector_size(8)));
    for (; i < h.vector_end; ++i) {
      const int32_t xmin = h.bounds[2 * i];
      const int32_t taps = h.bounds[2 * i + 1];
      const int32_t* k = h.coeffs + static_cast<size_t>(i) * h.ksize;
      const uint8_t* p = in + 3 * static_cast<size_t>(xmin);
      V8i acc = {kHalf, kHalf, kHalf, 0, 0, 0, 0, 0};
      int32_t t = 0;
      for (; t + 2 <= taps; t += 2) {
        V8u8 px;
        std::memcpy(&px, p + 3 * static_cast<size_t>(t), 8);
        V2i kk;
        std::memcpy(&kk, k + t, 8);
        acc += __builtin_convertvector(px, V8i) * __builtin_shufflevector(kk, kk, 0, 0, 0, 1, 1, 1, 1, 1);
      }
      int32_t s0 = acc[0] + acc[3], s1 = acc[1] + acc[4], s2 = acc[2] + acc[5];
      if (t < taps) {
        const uint8_t* q = p + 3 * static_cast<size_t>(t);
        s0 += q[0] * k[t];
        s1 += q[1] * k[t];
        s2 += q[2] * k[t];
      }
      out[3 * static_cast<size_t>(i)] = Clip8(s0);
      out[3 * static_cast<size_t>(i) + 1] = Clip8(s1);
      out[3 * static_cast<size_t>(i) + 2] = Clip8(s2);
    }
  }
  if constexpr (kLanes == 4) {
    for (; i < h.vector_end; ++i) {
      const int32_t xmin = h.bounds[2 * i];
      const int32_t taps = h.bounds[2 * i + 1];
      const int32_t* k = h.coeffs + static_cast<size_t>(i) * h.ksize;
      const uint8_t* p = in + 3 * static_cast<size_t>(xmin);
      V4i acc = {kHalf, kHalf, kHalf, kHalf};
      for (int32_t t = 0; t < taps; ++t) {
        V4u8 px;
        std::memcpy(&px, p + 3 * static_cast<size_t>(t), 4);
        acc += __builtin_convertvector(px, V4i) * k[t];
      }
      out[3 * static_cast<size_t>(i)] = Clip8(acc[0]);
      out[3 * static_cast<size_t>(i) + 1] = Clip8(acc[1]);
      out[3 * static_cast<size_t>(i) + 2] = Clip8(acc[2]);
    }
  }
  for (; i < h.width; ++i) {
    const int32_t xmin = h.bounds[2 * i];
    const int32_t taps = h.bounds[2 * i + 1];
    const int32_t* k = h.coeffs + static_cast<size_t>(i) * h.ksize;
    const uint8_t* p = in + 3 * static_cast<size_t>(xmin);
    int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
    for (int32_t t = 0; t < taps; ++t) {
      const int32_t kt = k[t];
      s0 += p[0] * kt;
      s1 += p[1] * kt;
      s2 += p[2] * kt;
      p += 3;
    }
    out[3 * static_cast<size_t>(i)] = Clip8(s0);
    out[3 * static_cast<size_t>(i) + 1] = Clip8(s1);
    out[3 * static_cast<size_t>(i) + 2] = Clip8(s2);
  }
}

// ImagingResampleVertical_8bpc for one output row of `bytes` bytes from the source rows
// rows[0..taps). Integer sums do not depend on the order of the terms: 8 bytes at a time,
// the sum of all taps in one vector, then the tail.
KILN_RESAMPLE_INLINE void VerticalLoop(const uint8_t* const* rows, const int32_t* k, int32_t taps,
                                       size_t bytes, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    V8i acc = {kHalf, kHalf, kHalf, kHalf, kHalf, kHalf, kHalf, kHalf};
    for (int32_t t = 0; t < taps; ++t) {
      V8u8 px;
      std::memcpy(&px, rows[t] + i, 8);
      acc += __builtin_convertvector(px, V8i) * k[t];
    }
    for (int j = 0; j < 8; ++j) out[i + j] = Clip8(acc[j]);
  }
  for (; i < bytes; ++i) {
    int32_t acc = kHalf;
    for (int32_t t = 0; t < taps; ++t) acc += rows[t][i] * k[t];
    out[i] = Clip8(acc);
  }
}

void HorizontalBaseline(const HorizontalPass& h, const uint8_t* in, uint8_t* out) {
  HorizontalLoop<KILN_IMAGE_VECTOR_HORIZONTAL ? 4 : 0>(h, in, out);
}

void VerticalBaseline(const uint8_t* const* rows, const int32_t* k, int32_t taps, size_t bytes, uint8_t* out) {
  VerticalLoop(rows, k, taps, bytes, out);
}

#if KILN_IMAGE_AVX2_LOOPS
__attribute__((target("avx2"))) void HorizontalAvx2(const HorizontalPass& h, const uint8_t* in, uint8_t* out) {
  HorizontalLoop<8>(h, in, out);
}

__attribute__((target("avx2"))) void VerticalAvx2(const uint8_t* const* rows, const int32_t* k, int32_t taps,
                                                  size_t bytes, uint8_t* out) {
  VerticalLoop(rows, k, taps, bytes, out);
}
#endif

std::atomic<int> g_resample_loops{static_cast<int>(ResampleLoops::kWidest)};

// The loops a resizer runs: AVX2 where the CPU has it, unless SetResampleLoops asked for
// the baseline.
struct LoopSet {
  void (*horizontal)(const HorizontalPass&, const uint8_t*, uint8_t*);
  void (*vertical)(const uint8_t* const*, const int32_t*, int32_t, size_t, uint8_t*);
};

LoopSet ChooseLoops() {
#if KILN_IMAGE_AVX2_LOOPS
  if (g_resample_loops.load(std::memory_order_relaxed) == static_cast<int>(ResampleLoops::kWidest) &&
      __builtin_cpu_supports("avx2")) {
    return {HorizontalAvx2, VerticalAvx2};
  }
#endif
  return {HorizontalBaseline, VerticalBaseline};
}

// ------------------------------------------------------------------------------------
// Row streaming
// ------------------------------------------------------------------------------------

// A source of packed RGB rows. Row(y) returns row y; the pointer stays valid until the
// next call. Rows are meant to be requested in nondecreasing order (every consumer here
// does); other orders are correct but recompute.
class RowSource {
 public:
  virtual const uint8_t* Row(int32_t y) = 0;

 protected:
  ~RowSource() = default;
};

class ImageRows final : public RowSource {
 public:
  ImageRows(const uint8_t* data, size_t stride) : data_(data), stride_(stride) {}
  const uint8_t* Row(int32_t y) override { return data_ + static_cast<size_t>(y) * stride_; }

 private:
  const uint8_t* data_;
  size_t stride_;
};

// The rectangle [x0, x0 + width) x [y0, y0 + height) of a resize's output.
struct Region {
  int32_t x0, y0, width, height;
};

// One Pillow resize (in_w x in_h -> out_w x out_h) of the rows of `src`, producing the
// rows of `region` of its output. Row(y) is output row region.y0 + y, columns
// [region.x0, region.x0 + region.width). All memory is allocated by Init; Row cannot fail.
class Resizer final : public RowSource {
 public:
  explicit Resizer(Allocator* allocator)
      : allocator_(allocator),
        horizontal_(allocator),
        vertical_(allocator),
        xtab_(allocator),
        ytab_(allocator),
        ring_(allocator),
        tap_rows_(allocator),
        out_(allocator) {}

  // `like`, if not null, is a resizer initialised with the same sizes, filter and region
  // that outlives this one: its filter coefficients are read instead of computed again
  // (the same numbers: every part of a picture resizes alike).
  kiln_status_t Init(RowSource* src, int32_t in_w, int32_t in_h, int32_t out_w, int32_t out_h,
                     int32_t filter, Region region, kiln_error_t* error, const Resizer* like = nullptr) {
    src_ = src;
    region_ = region;
    h_ = &horizontal_;
    v_ = &vertical_;
    const Args args{in_w, in_h, out_w, out_h, filter, region};
    args_ = args;
    const bool shared = like != nullptr && like->mode_ == Mode::kConvolve && like->args_ == args;
    row_bytes_ = static_cast<size_t>(region.width) * 3;
    if (in_w == out_w && in_h == out_h) {
      // Pillow returns a copy when the size does not change, whatever the filter.
      mode_ = Mode::kCopy;
      return KILN_OK;
    }
    if (!out_.resize(row_bytes_)) {
      return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "resize: cannot allocate a %zu-byte row",
                  row_bytes_);
    }
    if (filter == kResampleNearest) {
      mode_ = Mode::kNearest;
      kiln_status_t s = NearestTable(in_w, out_w, region.x0, region.width, &xtab_, error);
      if (s != KILN_OK) return s;
      return NearestTable(in_h, out_h, region.y0, region.height, &ytab_, error);
    }
    Filter f;
    if (!FilterFor(filter, &f)) {
      return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "resize: unsupported PIL filter %d", filter);
    }
    mode_ = Mode::kConvolve;
    loops_ = ChooseLoops();
    need_horizontal_ = out_w != in_w;
    need_vertical_ = out_h != in_h;
    if (need_horizontal_) {
      if (shared) {
        h_ = like->h_;
      } else {
        kiln_status_t s = PrecomputeCoeffs(in_w, out_w, f, region.x0, region.width, allocator_,
                                           &horizontal_, error);
        if (s != KILN_OK) return s;
      }
      // Windows only move right: the outputs that never read the last source pixel are a
      // prefix of the region.
      vector_end_ = 0;
      while (vector_end_ < region.width &&
             h_->bounds[2 * static_cast<size_t>(vector_end_)] +
                     h_->bounds[2 * static_cast<size_t>(vector_end_) + 1] <
                 in_w) {
        ++vector_end_;
      }
    }
    if (need_vertical_) {
      if (shared) {
        v_ = like->v_;
      } else if (need_horizontal_ && in_h == in_w && out_h == out_w && region.y0 == region.x0 &&
                 region.height == region.width) {
        v_ = h_;  // a square resize: both axes have the same coefficients
      } else {
        kiln_status_t s =
            PrecomputeCoeffs(in_h, out_h, f, region.y0, region.height, allocator_, &vertical_, error);
        if (s != KILN_OK) return s;
      }
      ring_rows_ = v_->max_taps > 0 ? v_->max_taps : 1;
      if (row_bytes_ != 0 && static_cast<size_t>(ring_rows_) > SIZE_MAX / row_bytes_) {
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY, "resize: ring of %d rows too large",
                    ring_rows_);
      }
      if (!ring_.resize(static_cast<size_t>(ring_rows_) * row_bytes_) ||
          !tap_rows_.resize(static_cast<size_t>(ring_rows_))) {
        return Fail(error, KILN_ERROR_OUT_OF_MEMORY,
                    "resize %dx%d -> %dx%d: cannot allocate %d rows of %zu bytes", in_w, in_h,
                    out_w, out_h, ring_rows_, row_bytes_);
      }
      ring_lo_ = ring_next_ = 0;
    }
    return KILN_OK;
  }

  const uint8_t* Row(int32_t y) override {
    const int32_t yy = region_.y0 + y;
    switch (mode_) {
      case Mode::kCopy:
        return src_->Row(yy) + static_cast<size_t>(region_.x0) * 3;
      case Mode::kNearest:
        NearestRow(y);
        return out_.data();
      case Mode::kConvolve:
        break;
    }
    if (!need_vertical_) {
      HorizontalRow(src_->Row(yy), out_.data());
      return out_.data();
    }
    const int32_t ymin = v_->bounds[2 * static_cast<size_t>(y)];
    const int32_t taps = v_->bounds[2 * static_cast<size_t>(y) + 1];
    EnsureRows(ymin, ymin + taps);
    VerticalRow(y, ymin, taps);
    return out_.data();
  }

 private:
  enum class Mode { kCopy, kNearest, kConvolve };
  struct Args {
    int32_t in_w, in_h, out_w, out_h, filter;
    Region region;
    bool operator==(const Args& o) const {
      return in_w == o.in_w && in_h == o.in_h && out_w == o.out_w && out_h == o.out_h && filter == o.filter &&
             region.x0 == o.region.x0 && region.y0 == o.region.y0 && region.width == o.region.width &&
             region.height == o.region.height;
    }
  };

  void NearestRow(int32_t y) {
    uint8_t* out = out_.data();
    const int32_t yi = ytab_[static_cast<size_t>(y)];
    if (yi < 0) {
      std::memset(out, 0, row_bytes_);
      return;
    }
    const uint8_t* in = src_->Row(yi);
    const int32_t* xt = xtab_.data();
    for (int32_t i = 0; i < region_.width; ++i) {
      const int32_t xi = xt[i];
      uint8_t* o = out + 3 * static_cast<size_t>(i);
      if (xi < 0) {
        o[0] = o[1] = o[2] = 0;
      } else {
        const uint8_t* p = in + 3 * static_cast<size_t>(xi);
        o[0] = p[0];
        o[1] = p[1];
        o[2] = p[2];
      }
    }
  }

  // ImagingResampleHorizontal_8bpc for one row (region columns only); `in` is a full
  // source row.
  void HorizontalRow(const uint8_t* in, uint8_t* out) const {
    const HorizontalPass pass{h_->bounds.data(), h_->coeffs.data(), static_cast<size_t>(h_->ksize),
                              vector_end_, region_.width};
    loops_.horizontal(pass, in, out);
  }

  uint8_t* RingRow(int32_t r) {
    return ring_.data() + static_cast<size_t>(r % ring_rows_) * row_bytes_;
  }

  // Makes the horizontally resampled rows [lo, hi) (hi - lo <= ring_rows_) available in
  // the ring. Valid rows are [ring_lo_, ring_next_).
  void EnsureRows(int32_t lo, int32_t hi) {
    if (lo < ring_lo_ || lo > ring_next_) ring_lo_ = ring_next_ = lo;  // restart the window
    for (; ring_next_ < hi; ++ring_next_) {
      const uint8_t* in = src_->Row(ring_next_);
      uint8_t* slot = RingRow(ring_next_);
      if (need_horizontal_) {
        HorizontalRow(in, slot);
      } else {
        std::memcpy(slot, in + static_cast<size_t>(region_.x0) * 3, row_bytes_);
      }
      if (ring_next_ + 1 - ring_lo_ > ring_rows_) ring_lo_ = ring_next_ + 1 - ring_rows_;
    }
  }

  // ImagingResampleVertical_8bpc for one output row, from the ring's rows
  // [ymin, ymin + taps).
  void VerticalRow(int32_t y, int32_t ymin, int32_t taps) {
    const int32_t* k = v_->coeffs.data() + static_cast<size_t>(y) * v_->ksize;
    const uint8_t** rows = tap_rows_.data();
    for (int32_t t = 0; t < taps; ++t) rows[t] = RingRow(ymin + t);
    loops_.vertical(rows, k, taps, row_bytes_, out_.data());
  }

  Allocator* allocator_;
  RowSource* src_ = nullptr;
  Mode mode_ = Mode::kCopy;
  Region region_{0, 0, 0, 0};
  size_t row_bytes_ = 0;
  bool need_horizontal_ = false;
  bool need_vertical_ = false;
  int32_t vector_end_ = 0;  // region columns [0, vector_end_) may take the vector loop
  AxisCoeffs horizontal_;
  AxisCoeffs vertical_;
  // The coefficients the passes read: horizontal_ and vertical_, or those of the resizer
  // Init was given as `like`, or horizontal_ for both axes of a square resize.
  const AxisCoeffs* h_ = &horizontal_;
  const AxisCoeffs* v_ = &vertical_;
  Args args_{0, 0, 0, 0, 0, {0, 0, 0, 0}};
  Vec<int32_t> xtab_;
  Vec<int32_t> ytab_;
  Vec<uint8_t> ring_;
  Vec<const uint8_t*> tap_rows_;  // VerticalRow's source rows, ring_rows_ of them
  LoopSet loops_{HorizontalBaseline, VerticalBaseline};
  int32_t ring_rows_ = 1;
  int32_t ring_lo_ = 0;
  int32_t ring_next_ = 0;
  Vec<uint8_t> out_;
};

// ------------------------------------------------------------------------------------
// Validation helpers
// ------------------------------------------------------------------------------------

kiln_status_t CheckImage(const char* what, const uint8_t* rgb, int32_t width, int32_t height,
                         size_t stride, kiln_error_t* error) {
  if (rgb == nullptr) return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "%s: rgb is NULL", what);
  if (width <= 0 || height <= 0) {
    return Fail(error, KILN_ERROR_INPUT_IMAGE, "%s: image size %dx%d is not positive", what, width,
                height);
  }
  if (width > kMaxImageSide || height > kMaxImageSide) {
    return Fail(error, KILN_ERROR_INPUT_IMAGE,
                "%s: image size %dx%d exceeds the limit of %d pixels per side", what, width, height,
                kMaxImageSide);
  }
  const size_t row = static_cast<size_t>(width) * 3;
  if (stride < row) {
    return Fail(error, KILN_ERROR_INPUT_IMAGE,
                "%s: row stride %zu is less than 3 * width = %zu bytes", what, stride, row);
  }
  if (stride > (SIZE_MAX - row) / static_cast<size_t>(height)) {
    return Fail(error, KILN_ERROR_INPUT_IMAGE, "%s: row stride %zu x %d rows overflows", what,
                stride, height);
  }
  return KILN_OK;
}

// transformers' center_crop: output index i reads input index i + offset (outside the
// input: zero padding). Python's floor division and ceil.
int32_t CropOffset(int32_t size, int32_t crop) {
  return size >= crop ? (size - crop) / 2 : -((crop - size + 1) / 2);
}

// The float32 value of every uint8 per channel: rescale in float64 then float32, normalise
// in float32 (subtract, then divide), as numpy does in the reference.
void BuildLut(const ImagePreprocessSpec& spec, float lut[3][256]) {
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float f;
      if (spec.do_rescale) {
        f = static_cast<float>(static_cast<double>(v) * spec.rescale_factor);
      } else {
        f = static_cast<float>(v);
      }
      if (spec.do_normalize) {
        const float centred = f - spec.image_mean[c];
        f = centred / spec.image_std[c];
      }
      lut[c][v] = f;
    }
  }
}

kiln_status_t CheckSpec(const ImagePreprocessSpec& spec, kiln_error_t* error) {
  const int32_t s = spec.image_size;
  if (s <= 0 || s > kMaxImageSide) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "image_size %d is not in 1..%d", s,
                kMaxImageSide);
  }
  if (spec.resample < kResampleNearest || spec.resample > kResampleHamming) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                "resample %d is not a PIL filter (0 NEAREST, 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, "
                "4 BOX, 5 HAMMING)",
                spec.resample);
  }
  if (spec.do_rescale && !std::isfinite(spec.rescale_factor)) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "rescale_factor %g is not finite",
                spec.rescale_factor);
  }
  if (spec.do_normalize) {
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(spec.image_mean[c]) || !std::isfinite(spec.image_std[c]) ||
          spec.image_std[c] == 0.0f) {
        return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                    "image_mean[%d] = %g / image_std[%d] = %g: need finite values and a "
                    "non-zero std",
                    c, static_cast<double>(spec.image_mean[c]), c,
                    static_cast<double>(spec.image_std[c]));
      }
    }
  }
  switch (spec.processor) {
    case ImagePreprocessSpec::Processor::kClip:
      if (spec.do_resize) {
        const bool by_edge = spec.shortest_edge > 0;
        const bool by_size = spec.resize_height > 0 && spec.resize_width > 0;
        if (spec.shortest_edge < 0 || (!by_edge && !by_size)) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                      "CLIP resize needs shortest_edge > 0 (or resize_height and resize_width "
                      "> 0), got shortest_edge %d, resize %dx%d",
                      spec.shortest_edge, spec.resize_width, spec.resize_height);
        }
        if (by_edge && spec.shortest_edge > kMaxImageSide) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "shortest_edge %d exceeds %d",
                      spec.shortest_edge, kMaxImageSide);
        }
        if (!by_edge && (spec.resize_height > kMaxImageSide || spec.resize_width > kMaxImageSide)) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "resize size %dx%d exceeds %d",
                      spec.resize_width, spec.resize_height, kMaxImageSide);
        }
      }
      if (spec.do_center_crop) {
        if (spec.crop_height != s || spec.crop_width != s) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                      "crop size %dx%d (height x width) does not match image_size %d",
                      spec.crop_height, spec.crop_width, s);
        }
      } else if (spec.do_resize) {
        if (spec.shortest_edge > 0 && spec.shortest_edge != s) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                      "without a center crop, shortest_edge %d must equal image_size %d",
                      spec.shortest_edge, s);
        }
        if (spec.shortest_edge == 0 && (spec.resize_height != s || spec.resize_width != s)) {
          return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                      "without a center crop, resize size %dx%d (height x width) must equal "
                      "image_size %d",
                      spec.resize_height, spec.resize_width, s);
        }
      }
      return KILN_OK;
    case ImagePreprocessSpec::Processor::kIdefics3:
      if (spec.max_image_edge != s) {
        return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                    "Idefics3 max_image_edge %d does not match image_size %d", spec.max_image_edge,
                    s);
      }
      if (spec.do_resize && spec.longest_edge <= 0) {
        return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                    "Idefics3 resize needs longest_edge > 0, got %d", spec.longest_edge);
      }
      return KILN_OK;
  }
  return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "unknown image processor %d",
              static_cast<int>(spec.processor));
}

// Writes the S x S window of `rows` (whose row r is resized row r + region.y0, columns
// from region.x0) that starts at resized (offset_y, offset_x), zero padding outside the
// region, converted through the lookup table to [3, S, S]: output rows [i_begin, i_end).
void WritePixels(RowSource* rows, Region region, int32_t offset_y, int32_t offset_x, int32_t s,
                 const float lut[3][256], float* out, int32_t i_begin, int32_t i_end) {
  const size_t plane = static_cast<size_t>(s) * static_cast<size_t>(s);
  // Output columns [j0, j1) come from the region; the rest is padding (value 0).
  int32_t j0 = region.x0 - offset_x;
  int32_t j1 = region.x0 + region.width - offset_x;
  if (j0 < 0) j0 = 0;
  if (j1 > s) j1 = s;
  for (int32_t i = i_begin; i < i_end; ++i) {
    float* o0 = out + static_cast<size_t>(i) * static_cast<size_t>(s);
    float* o1 = o0 + plane;
    float* o2 = o1 + plane;
    const int32_t r = i + offset_y - region.y0;
    if (r < 0 || r >= region.height) {
      for (int32_t j = 0; j < s; ++j) {
        o0[j] = lut[0][0];
        o1[j] = lut[1][0];
        o2[j] = lut[2][0];
      }
      continue;
    }
    const uint8_t* row = rows->Row(r);
    for (int32_t j = 0; j < j0; ++j) {
      o0[j] = lut[0][0];
      o1[j] = lut[1][0];
      o2[j] = lut[2][0];
    }
    const uint8_t* p = row + 3 * static_cast<size_t>(j0 + offset_x - region.x0);
    for (int32_t j = j0; j < j1; ++j, p += 3) {
      o0[j] = lut[0][p[0]];
      o1[j] = lut[1][p[1]];
      o2[j] = lut[2][p[2]];
    }
    for (int32_t j = j1 < j0 ? j0 : j1; j < s; ++j) {
      o0[j] = lut[0][0];
      o1[j] = lut[1][0];
      o2[j] = lut[2][0];
    }
  }
}

// Up to this many ranges of output rows, each resized by its own resizers.
constexpr int kMaxImageParts = 8;

// A chain of one or two resizers (CLIP: one; Idefics3: to the longest edge, then to
// the tile).
struct ResizeChain {
  explicit ResizeChain(Allocator* allocator) : first(allocator), second(allocator) {}
  Resizer first, second;
};

// Output rows [0, s) in one range per active thread of `pool` (one range without a
// pool), each range written by write(chain, i_begin, i_end) from its own chain, which
// init(chain, first) prepares on this thread (Init allocates; Row does not, and a
// resizer restarts its window of source rows where a range starts); `first` is the
// first chain (null when preparing it), whose coefficients the others read. A range
// recomputes the few source rows its neighbour's window shares with it: the integer
// sums are the same, so the pixels do not depend on the split.
template <typename InitFn, typename WriteFn>
kiln_status_t InParts(ThreadPool* pool, int32_t s, Allocator* allocator, InitFn init, WriteFn write) {
  int parts = pool != nullptr ? std::min(pool->active_threads(), kMaxImageParts) : 1;
  parts = std::max(1, std::min(parts, s));
  alignas(ResizeChain) unsigned char storage[kMaxImageParts][sizeof(ResizeChain)];
  ResizeChain* chains[kMaxImageParts];
  int built = 0;
  kiln_status_t status = KILN_OK;
  while (built < parts && status == KILN_OK) {
    chains[built] = new (storage[built]) ResizeChain(allocator);
    status = init(chains[built], built == 0 ? nullptr : chains[0]);
    ++built;
  }
  if (status == KILN_OK) {
    auto range = [&](int64_t part) {
      write(chains[part], static_cast<int32_t>(s * part / parts), static_cast<int32_t>(s * (part + 1) / parts));
    };
    if (parts == 1) {
      range(0);
    } else {
      pool->For(parts, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t part = b; part < e; ++part) range(part);
      });
    }
  }
  for (int i = 0; i < built; ++i) chains[i]->~ResizeChain();
  return status;
}

// The rows [first, first + count) of a resized axis of `size` pixels that a window of
// `crop` pixels at `offset` reads.
void NeededRange(int32_t size, int32_t crop, int32_t offset, int32_t* first, int32_t* count) {
  int64_t lo = offset < 0 ? 0 : offset;
  int64_t hi = static_cast<int64_t>(offset) + crop;
  if (hi > size) hi = size;
  *first = static_cast<int32_t>(lo);
  *count = static_cast<int32_t>(hi > lo ? hi - lo : 0);
}

}  // namespace

bool ShortestEdgeResizeSize(int32_t height, int32_t width, int32_t shortest_edge,
                            int32_t* out_height, int32_t* out_width) {
  if (height <= 0 || width <= 0 || shortest_edge <= 0) return false;
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height;
  const int64_t long_side = portrait ? height : width;
  // Python: int(size * long / short); the product is exact, the division correctly rounded.
  const double q =
      static_cast<double>(int64_t{shortest_edge} * long_side) / static_cast<double>(short_side);
  if (!(q < static_cast<double>(kMaxResizedSide) + 1.0)) return false;
  const int32_t new_long = static_cast<int32_t>(q);
  if (new_long < 1) return false;
  *out_height = portrait ? new_long : shortest_edge;
  *out_width = portrait ? shortest_edge : new_long;
  return true;
}

bool Idefics3ResizeSize(int32_t height, int32_t width, int32_t longest_edge, int32_t* out_height,
                        int32_t* out_width) {
  constexpr int64_t kIdefics3MaxImageSize = 4096;
  if (height <= 0 || width <= 0 || longest_edge <= 0) return false;
  // _resize_output_size_rescale_to_max_len
  double aspect = static_cast<double>(width) / static_cast<double>(height);
  int64_t h, w;
  if (width >= height) {
    w = longest_edge;
    h = static_cast<int64_t>(static_cast<double>(w) / aspect);
    if (h % 2 != 0) h += 1;
  } else {
    h = longest_edge;
    w = static_cast<int64_t>(static_cast<double>(h) * aspect);
    if (w % 2 != 0) w += 1;
  }
  if (h < 1) h = 1;
  if (w < 1) w = 1;
  // _resize_output_size_scale_below_upper_bound
  aspect = static_cast<double>(w) / static_cast<double>(h);
  if (w >= h && w > kIdefics3MaxImageSize) {
    w = kIdefics3MaxImageSize;
    h = static_cast<int64_t>(static_cast<double>(w) / aspect);
  } else if (h > w && h > kIdefics3MaxImageSize) {
    h = kIdefics3MaxImageSize;
    w = static_cast<int64_t>(static_cast<double>(h) * aspect);
  }
  if (h < 1) h = 1;
  if (w < 1) w = 1;
  *out_height = static_cast<int32_t>(h);
  *out_width = static_cast<int32_t>(w);
  return true;
}

kiln_status_t ResizeRgb8(const uint8_t* src, int32_t width, int32_t height, size_t stride,
                         int32_t out_width, int32_t out_height, int32_t filter,
                         Allocator* allocator, uint8_t* out, kiln_error_t* error) {
  kiln_status_t status = CheckImage("ResizeRgb8", src, width, height, stride, error);
  if (status != KILN_OK) return status;
  if (out == nullptr || allocator == nullptr) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "ResizeRgb8: %s is NULL",
                out == nullptr ? "out" : "allocator");
  }
  if (out_width <= 0 || out_height <= 0 || out_width > kMaxImageSide ||
      out_height > kMaxImageSide) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT,
                "ResizeRgb8: output size %dx%d is not in 1..%d per side", out_width, out_height,
                kMaxImageSide);
  }
  if (filter < kResampleNearest || filter > kResampleHamming) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "ResizeRgb8: unsupported PIL filter %d",
                filter);
  }
  ImageRows image(src, stride);
  Resizer resizer(allocator);
  status = resizer.Init(&image, width, height, out_width, out_height, filter,
                        Region{0, 0, out_width, out_height}, error);
  if (status != KILN_OK) return status;
  const size_t row_bytes = static_cast<size_t>(out_width) * 3;
  for (int32_t y = 0; y < out_height; ++y) {
    std::memcpy(out + static_cast<size_t>(y) * row_bytes, resizer.Row(y), row_bytes);
  }
  return KILN_OK;
}

kiln_status_t PreprocessImage(const ImagePreprocessSpec& spec, const uint8_t* rgb, int32_t width,
                              int32_t height, size_t stride, Allocator* allocator,
                              float* out_pixels, size_t capacity, kiln_error_t* error,
                              ThreadPool* pool) {
  kiln_status_t status = CheckImage("PreprocessImage", rgb, width, height, stride, error);
  if (status != KILN_OK) return status;
  if (out_pixels == nullptr || allocator == nullptr) {
    return Fail(error, KILN_ERROR_INVALID_ARGUMENT, "PreprocessImage: %s is NULL",
                out_pixels == nullptr ? "out_pixels" : "allocator");
  }
  status = CheckSpec(spec, error);
  if (status != KILN_OK) return status;
  const int32_t s = spec.image_size;
  const size_t needed = 3 * static_cast<size_t>(s) * static_cast<size_t>(s);
  if (capacity < needed) {
    return Fail(error, KILN_ERROR_BUFFER_TOO_SMALL,
                "PreprocessImage: out_pixels holds %zu floats, [3, %d, %d] needs %zu", capacity, s,
                s, needed);
  }
  ImageRows image(rgb, stride);
  float lut[3][256];
  BuildLut(spec, lut);

  if (spec.processor == ImagePreprocessSpec::Processor::kIdefics3) {
    int32_t h1 = height, w1 = width;
    if (spec.do_resize && !Idefics3ResizeSize(height, width, spec.longest_edge, &h1, &w1)) {
      return Fail(error, KILN_ERROR_INPUT_IMAGE,
                  "Idefics3: cannot resize a %dx%d image to longest edge %d", width, height,
                  spec.longest_edge);
    }
    return InParts(
        pool, s, allocator,
        [&](ResizeChain* c, const ResizeChain* like) {
          kiln_status_t st = c->first.Init(&image, width, height, w1, h1, spec.resample, Region{0, 0, w1, h1},
                                           error, like ? &like->first : nullptr);
          if (st != KILN_OK) return st;
          return c->second.Init(&c->first, w1, h1, s, s, spec.resample, Region{0, 0, s, s}, error,
                                like ? &like->second : nullptr);
        },
        [&](ResizeChain* c, int32_t i0, int32_t i1) {
          WritePixels(&c->second, Region{0, 0, s, s}, 0, 0, s, lut, out_pixels, i0, i1);
        });
  }

  // CLIP: resize (shortest edge or fixed size), center crop, rescale, normalise.
  int32_t rh = height, rw = width;
  if (spec.do_resize) {
    if (spec.shortest_edge > 0) {
      if (!ShortestEdgeResizeSize(height, width, spec.shortest_edge, &rh, &rw)) {
        return Fail(error, KILN_ERROR_INPUT_IMAGE,
                    "CLIP: a %dx%d image resized to shortest edge %d would have a side above "
                    "%lld pixels (aspect ratio too extreme)",
                    width, height, spec.shortest_edge, static_cast<long long>(kMaxResizedSide));
      }
    } else {
      rh = spec.resize_height;
      rw = spec.resize_width;
    }
  }
  int32_t oy = 0, ox = 0;
  if (spec.do_center_crop) {
    oy = CropOffset(rh, spec.crop_height);
    ox = CropOffset(rw, spec.crop_width);
  } else if (rh != s || rw != s) {
    return Fail(error, KILN_ERROR_INPUT_IMAGE,
                "CLIP without center crop: a %dx%d image becomes %dx%d, the model needs %dx%d",
                width, height, rw, rh, s, s);
  }
  Region region{0, 0, 0, 0};
  NeededRange(rh, s, oy, &region.y0, &region.height);
  NeededRange(rw, s, ox, &region.x0, &region.width);
  return InParts(
      pool, s, allocator,
      [&](ResizeChain* c, const ResizeChain* like) {
        return c->first.Init(&image, width, height, rw, rh, spec.resample, region, error,
                             like ? &like->first : nullptr);
      },
      [&](ResizeChain* c, int32_t i0, int32_t i1) {
        WritePixels(&c->first, region, oy, ox, s, lut, out_pixels, i0, i1);
      });
}

void SetResampleLoops(ResampleLoops loops) {
  g_resample_loops.store(static_cast<int>(loops), std::memory_order_relaxed);
}

}  // namespace kiln::rt
