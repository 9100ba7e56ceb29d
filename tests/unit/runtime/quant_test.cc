// The runtime's dequantisation of every weight encoding, bit for bit against the
// NumPy reference (gen_quant_vectors.py), and the int8-activation matrix product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/encoding.h"
#include "formats/kiln_format.h"
#include "formats/kv_codec.h"
#include "kernels/ukernel.h"
#include "platform/platform.h"
#include "support/npy.h"

namespace {

std::string VectorsDir() {
  const char* dir = std::getenv("KILN_QUANT_VECTORS");
#ifdef KILN_DEFAULT_QUANT_VECTORS
  if (dir == nullptr) dir = KILN_DEFAULT_QUANT_VECTORS;
#endif
  return dir != nullptr ? dir : "";
}

struct Case {
  std::string name, encoding;
  uint32_t group;
  bool symmetric;
  int64_t rows, cols;
  bool has_y;
};

uint8_t EncodingId(const std::string& e) {
  if (e == "fp8_e4m3") return kiln::format::kEncFP8_E4M3;
  if (e == "fp8_e5m2") return kiln::format::kEncFP8_E5M2;
  if (e == "int8") return kiln::format::kEncINT8;
  return kiln::format::kEncINT4;
}

std::vector<Case> Cases(const std::string& dir) {
  std::vector<Case> out;
  std::ifstream f(dir + "/cases.txt");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    Case c;
    int sym, y;
    s >> c.name >> c.encoding >> c.group >> sym >> c.rows >> c.cols >> y;
    c.symmetric = sym != 0;
    c.has_y = y != 0;
    out.push_back(c);
  }
  return out;
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(Encodings, DequantizationMatchesNumpyBitForBit) {
  std::string dir = VectorsDir();
  if (dir.empty()) GTEST_SKIP() << "no quantisation vectors";
  std::vector<Case> cases = Cases(dir);
  ASSERT_GE(cases.size(), 8u);
  for (const Case& c : cases) {
    kiln::format::EncodingSpec spec{EncodingId(c.encoding), c.group, c.symmetric};
    std::vector<uint8_t> bytes = ReadBytes(dir + "/" + c.name + ".bin");
    ASSERT_EQ(bytes.size(), kiln::format::StorageBytes(spec, c.rows, c.cols)) << c.name;
    kiln::npy::Array expected;
    std::string error;
    ASSERT_TRUE(kiln::npy::Read(dir + "/" + c.name + ".dequant.npy", &expected, &error)) << error;
    std::vector<float> want = expected.AsFloat(), row(c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
      kiln::format::DecodeRow(spec, bytes.data(), c.rows, c.cols, r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), want.data() + r * c.cols, c.cols * 4), 0) << c.name << " row " << r;
    }
  }
}

TEST(Encodings, Int8ActivationMatmulMatchesNumpy) {
  std::string dir = VectorsDir();
  if (dir.empty()) GTEST_SKIP() << "no quantisation vectors";
  for (const Case& c : Cases(dir)) {
    if (!c.has_y) continue;
    std::vector<uint8_t> bytes = ReadBytes(dir + "/" + c.name + ".bin");
    kiln::npy::Array x, y;
    std::string error;
    ASSERT_TRUE(kiln::npy::Read(dir + "/" + c.name + ".x.npy", &x, &error)) << error;
    ASSERT_TRUE(kiln::npy::Read(dir + "/" + c.name + ".y.npy", &y, &error)) << error;
    kiln_uk_matmul_params_t p = {};
    p.w.data = bytes.data();
    p.w.rows = c.rows;
    p.w.cols = c.cols;
    p.w.encoding = EncodingId(c.encoding);
    p.w.group = c.group;
    p.w.symmetric = c.symmetric;
    p.w.int8_activations = 1;
    std::vector<float> xs = x.AsFloat(), want = y.AsFloat();
    const int64_t rows = static_cast<int64_t>(x.shape[0]);
    std::vector<int8_t> xq(rows * c.cols);
    std::vector<float> xscale(rows), got(rows * c.rows);
    kiln_uk_quant_rows_params_t q = {xs.data(), c.cols, c.cols, xq.data(), xscale.data()};
    kiln_uk_lhs_quant_qai8dx_f32_ref_portable(&q, 0, rows);
    p.xq = xq.data();
    p.xs = xscale.data();
    p.M = rows;
    p.N = c.rows;
    p.K = c.cols;
    p.y = got.data();
    p.ldy = c.rows;
    kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(&p, 0, c.rows, nullptr);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << c.name;
  }
}

TEST(Encodings, VectorisedActivationQuantisersAreTheReferenceBitForBit) {
  // The runtime quantises a generated W8A8/W4A8 matmul's activations with the fastest
  // quantiser of the CPU; its codes and scales must be the reference's.
  using Quant = void (*)(const kiln_uk_quant_rows_params_t*, int64_t, int64_t);
  std::vector<std::pair<const char*, Quant>> quantisers;
#if defined(__aarch64__)
  quantisers.emplace_back("arm_neon", kiln_uk_lhs_quant_qai8dx_f32_arm_neon);
#endif
#if defined(__x86_64__)
  constexpr uint64_t kAvx512 = kiln::format::kCpuX86Avx2 | kiln::format::kCpuX86Fma | kiln::format::kCpuX86F16c |
                               kiln::format::kCpuX86Avx512F | kiln::format::kCpuX86Avx512Bw |
                               kiln::format::kCpuX86Avx512Vl | kiln::format::kCpuX86Avx512Vnni;
  if ((kiln::rt::DetectCpuFeatures() & kAvx512) == kAvx512)
    quantisers.emplace_back("x86_avx512", kiln_uk_lhs_quant_qai8dx_f32_x86_avx512);
#endif
  if (quantisers.empty()) GTEST_SKIP() << "no vectorised quantiser for this CPU";
  uint64_t state = 88172645463325252ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int64_t k : {1, 5, 16, 37, 100, 256, 2053}) {
    const int64_t rows = 6;
    std::vector<float> x(rows * k);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < k; ++i) {
        float v = static_cast<float>(static_cast<int64_t>(next() >> 41) - (1 << 22)) / (1 << 18);
        if (r == 1) v = 0.0f;                         // a zero row: scale 1
        if (r == 2) v = (i % 2 ? 0.5f : -2.5f) * 1.0f;  // ties after the division (absmax 2.5 -> s 2.5/127)
        if (r == 3 && i == k / 2) v = 3.0e4f;        // one outlier
        if (r == 4) v = static_cast<float>(i % 255 - 127);  // codes that are the values
        x[r * k + i] = v;
      }
    std::vector<int8_t> want_q(rows * k), got_q(rows * k);
    std::vector<float> want_s(rows), got_s(rows);
    kiln_uk_quant_rows_params_t ref = {x.data(), k, k, want_q.data(), want_s.data()};
    kiln_uk_lhs_quant_qai8dx_f32_ref_portable(&ref, 0, rows);
    for (const auto& [name, fn] : quantisers) {
      kiln_uk_quant_rows_params_t q = {x.data(), k, k, got_q.data(), got_s.data()};
      fn(&q, 0, rows);
      EXPECT_EQ(std::memcmp(got_q.data(), want_q.data(), got_q.size()), 0) << name << " codes, K=" << k;
      EXPECT_EQ(std::memcmp(got_s.data(), want_s.data(), got_s.size() * 4), 0) << name << " scales, K=" << k;
    }
  }
}

TEST(Encodings, Fp8RoundTripsEveryCode) {
  for (bool e4m3 : {true, false}) {
    for (int code = 0; code < 256; ++code) {
      float v = kiln::format::Fp8ToF32(static_cast<uint8_t>(code), e4m3);
      if (std::isnan(v) || std::isinf(v) || code == 0x80) continue;  // NaN, inf, -0
      EXPECT_EQ(kiln::format::F32ToFp8(v, e4m3), code) << (e4m3 ? "e4m3 " : "e5m2 ") << code;
    }
  }
  EXPECT_EQ(kiln::format::F32ToFp8(1e9f, true), 0x7E);    // saturates at 448
  EXPECT_EQ(kiln::format::F32ToFp8(-1e9f, true), 0xFE);
}

TEST(Encodings, StorageBytes) {
  using kiln::format::EncodingSpec;
  EXPECT_EQ(kiln::format::StorageBytes(EncodingSpec{kiln::format::kEncINT4, 32, true}, 4, 64), 4u * 32 + 2 * 8);
  EXPECT_EQ(kiln::format::StorageBytes(EncodingSpec{kiln::format::kEncINT4, 32, false}, 4, 64), 4u * 32 + 3 * 8);
  EXPECT_EQ(kiln::format::StorageBytes(EncodingSpec{kiln::format::kEncINT4, 32, true}, 4, 48), 0u);
  EXPECT_EQ(kiln::format::StorageBytes(EncodingSpec{kiln::format::kEncINT8, 0, true}, 4, 64), 4u * 64 + 16);
}

// KV-cache rows (formats/kv_codec.h): codes within half a step of the value, the int4
// nibble layout, the sizes, and the encodings and groups a cache accepts.
// int4_p128k4 (formats/encoding.h): panels of 128 rows (the last of 44 here), each
// step of 4 columns its rows' codes as consecutive nibbles, the scales by panel; the
// repacking is undone exactly and refuses what the layout cannot hold.
TEST(Layouts, Int4P128K4PlacesEachCodeAndScale) {
  namespace fmt = kiln::format;
  fmt::EncodingSpec spec;
  spec.id = fmt::kEncINT4;
  spec.group = 32;
  spec.symmetric = true;
  const uint64_t rows = 300, cols = 64, steps = cols / 4, groups = cols / 32;
  const uint64_t bytes = fmt::StorageBytes(spec, rows, cols);
  std::vector<uint8_t> plain(bytes), packed(bytes), back(bytes);
  uint32_t state = 12345;
  for (uint8_t& b : plain) b = static_cast<uint8_t>((state = state * 1103515245u + 12345u) >> 16);
  ASSERT_TRUE(fmt::LayoutFits(fmt::kLayoutInt4P128K4, spec, rows, cols));
  fmt::RepackLayout(true, fmt::kLayoutInt4P128K4, spec, plain.data(), rows, cols, packed.data());
  fmt::RepackLayout(false, fmt::kLayoutInt4P128K4, spec, packed.data(), rows, cols, back.data());
  EXPECT_EQ(plain, back);
  for (uint64_t r : {0ull, 1ull, 127ull, 128ull, 255ull, 256ull, 299ull})
    for (uint64_t c = 0; c < cols; ++c) {
      // Panel of r, its height, then step-major with the panel's rows 4 codes each.
      const uint64_t first = r / 128 * 128, height = std::min<uint64_t>(128, rows - first);
      const uint64_t nibble = first * cols + (c / 4) * height * 4 + (r - first) * 4 + c % 4;
      ASSERT_EQ(fmt::Int4View::Code(packed.data(), nibble), fmt::Int4View::Code(plain.data(), r * cols + c))
          << "row " << r << " column " << c;
    }
  const uint64_t scales = fmt::Int4ScalesOffset(rows, cols);
  for (uint64_t r : {0ull, 130ull, 299ull})
    for (uint64_t g = 0; g < groups; ++g) {
      const uint64_t first = r / 128 * 128, height = std::min<uint64_t>(128, rows - first);
      const uint64_t at = scales + 2 * (first * groups + g * height + (r - first));
      EXPECT_EQ(0, std::memcmp(packed.data() + at, plain.data() + scales + 2 * (r * groups + g), 2));
    }
  EXPECT_EQ(steps, 16u);
  // Asymmetric int4, a group that is not a multiple of 4, int8: not this layout.
  fmt::EncodingSpec asym = spec;
  asym.symmetric = false;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P128K4, asym, rows, cols));
  fmt::EncodingSpec odd = spec;
  odd.group = 6;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P128K4, odd, rows, 36));
  fmt::EncodingSpec i8;
  i8.id = fmt::kEncINT8;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P128K4, i8, rows, cols));
  EXPECT_STREQ(fmt::LayoutName(fmt::kLayoutInt4P128K4), "int4_p128k4");
}

// Only the generated W4A8 matmuls of code that assumes SME2 read int4_p128k4.
TEST(Layouts, Int4P128K4IsReadOnlyBySme2GeneratedW4A8) {
  namespace fmt = kiln::format;
  const uint32_t int4 = fmt::EncodingBit(fmt::kEncINT4);
  EXPECT_TRUE(fmt::KernelReadsLayout(fmt::kLayoutInt4P128K4, true, int4, fmt::kOpLinear, 0, true, fmt::kCpuArmSme2));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P128K4, true, int4, fmt::kOpLinear, 0, true, 0));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P128K4, true, int4, fmt::kOpLinear, 0, false, fmt::kCpuArmSme2));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P128K4, false, int4, fmt::kOpLinear, 0, true, fmt::kCpuArmSme2));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P128K4, true, int4, fmt::kOpEmbedding, 0, true, fmt::kCpuArmSme2));
}

// int4_p16k16 (formats/encoding.h): panels of 16 rows, each step of 16 columns its 8
// channel pairs' 16 bytes (row 2j's 8 bytes, then row 2j + 1's), byte i holding
// columns 16s + i (low nibble) and 16s + 8 + i (high), the scales by panel; the
// repacking is undone exactly and refuses what the layout cannot hold.
TEST(Layouts, Int4P16K16PlacesEachCodeAndScale) {
  namespace fmt = kiln::format;
  fmt::EncodingSpec spec;
  spec.id = fmt::kEncINT4;
  spec.group = 32;
  spec.symmetric = true;
  const uint64_t rows = 48, cols = 96, groups = cols / 32;
  const uint64_t bytes = fmt::StorageBytes(spec, rows, cols);
  std::vector<uint8_t> plain(bytes), packed(bytes), back(bytes);
  uint32_t state = 4321;
  for (uint8_t& b : plain) b = static_cast<uint8_t>((state = state * 1103515245u + 12345u) >> 16);
  ASSERT_TRUE(fmt::LayoutFits(fmt::kLayoutInt4P16K16, spec, rows, cols));
  fmt::RepackLayout(true, fmt::kLayoutInt4P16K16, spec, plain.data(), rows, cols, packed.data());
  fmt::RepackLayout(false, fmt::kLayoutInt4P16K16, spec, packed.data(), rows, cols, back.data());
  EXPECT_EQ(plain, back);
  for (uint64_t r : {0ull, 1ull, 14ull, 15ull, 16ull, 33ull, 47ull})
    for (uint64_t c = 0; c < cols; ++c) {
      // Panel of r, then step-major: 128 bytes a step, 16 a pair, 8 a row.
      const uint64_t byte = r / 16 * 16 * cols / 2 + (c / 16) * 128 + (r % 16 / 2) * 16 + (r % 2) * 8 + c % 8;
      const uint8_t code = c % 16 < 8 ? packed[byte] & 0xF : packed[byte] >> 4;
      ASSERT_EQ(code, fmt::Int4View::Code(plain.data(), r * cols + c)) << "row " << r << " column " << c;
    }
  const uint64_t scales = fmt::Int4ScalesOffset(rows, cols);
  for (uint64_t r : {0ull, 17ull, 47ull})
    for (uint64_t g = 0; g < groups; ++g) {
      const uint64_t at = scales + 2 * (r / 16 * 16 * groups + g * 16 + r % 16);
      EXPECT_EQ(0, std::memcmp(packed.data() + at, plain.data() + scales + 2 * (r * groups + g), 2));
    }
  // Rows not a multiple of 16, a group not a multiple of 16, zero points, int8: not
  // this layout.
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P16K16, spec, 40, cols));
  fmt::EncodingSpec g8 = spec;
  g8.group = 8;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P16K16, g8, rows, cols));
  fmt::EncodingSpec asym = spec;
  asym.symmetric = false;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P16K16, asym, rows, cols));
  fmt::EncodingSpec i8;
  i8.id = fmt::kEncINT8;
  EXPECT_FALSE(fmt::LayoutFits(fmt::kLayoutInt4P16K16, i8, rows, cols));
  EXPECT_STREQ(fmt::LayoutName(fmt::kLayoutInt4P16K16), "int4_p16k16");
}

// Only the generated W4A8 matmuls of code that assumes i8mm read int4_p16k16.
TEST(Layouts, Int4P16K16IsReadOnlyByI8mmGeneratedW4A8) {
  namespace fmt = kiln::format;
  const uint32_t int4 = fmt::EncodingBit(fmt::kEncINT4);
  EXPECT_TRUE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, int4, fmt::kOpLinear, 0, true, fmt::kCpuArmI8mm));
  EXPECT_TRUE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, int4, fmt::kOpGatedMlp, 0, true,
                                     fmt::kCpuArmDotProd | fmt::kCpuArmI8mm));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, int4, fmt::kOpLinear, 0, true, fmt::kCpuArmDotProd));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, int4, fmt::kOpLinear, 0, false, fmt::kCpuArmI8mm));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, false, int4, fmt::kOpLinear, 0, true, fmt::kCpuArmI8mm));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, int4, fmt::kOpEmbedding, 0, true, fmt::kCpuArmI8mm));
  EXPECT_FALSE(fmt::KernelReadsLayout(fmt::kLayoutInt4P16K16, true, fmt::EncodingBit(fmt::kEncINT8), fmt::kOpLinear, 0,
                                      true, fmt::kCpuArmI8mm));
}

TEST(KvCodec, RoundTripAndLayout) {
  using namespace kiln::format;
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 7 == 0 ? 9.0f : 1.0f);
  x[5] = 0.0f;
  for (uint8_t enc : {kEncF32, kEncF16, kEncINT8, kEncINT4}) {
    const uint32_t group = KvDefaultGroup(enc, 64);
    ASSERT_TRUE(KvEncodingValid(enc, group, 64)) << int(enc);
    std::vector<uint8_t> codes(KvRowBytes(enc, x.size()));
    std::vector<float> scales(KvRowScales(enc, x.size(), group) + 1), back(x.size());
    EncodeKvRow(enc, group, x.data(), x.size(), codes.data(), scales.data());
    DecodeKvSpan(enc, group, codes.data(), scales.data(), 0, x.size(), back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float step = enc == kEncF32 ? 0.0f
                         : enc == kEncF16 ? std::fabs(x[i]) / 1024.0f
                                          : scales[i / group];
      EXPECT_LE(std::fabs(back[i] - x[i]), step / 2 + 1e-7f) << "encoding " << int(enc) << " element " << i;
    }
    // Decoding a head on its own gives the same values as decoding the row.
    std::vector<float> head(64);
    DecodeKvSpan(enc, group, codes.data(), scales.data(), 64, 64, head.data());
    EXPECT_EQ(std::memcmp(head.data(), back.data() + 64, 64 * 4), 0) << int(enc);
  }
  EXPECT_EQ(KvRowBytes(kEncF16, 128), 256u);
  EXPECT_EQ(KvRowBytes(kEncINT4, 128), 64u);
  EXPECT_EQ(KvRowScales(kEncINT8, 128, 32), 4u);
  EXPECT_EQ(KvRowScales(kEncF16, 128, 0), 0u);
  // int4: byte i of a group holds element i (low nibble) and i + g/2 (high), as code + 8.
  std::vector<float> ramp(32);
  for (int i = 0; i < 32; ++i) ramp[i] = i < 16 ? 7.0f : -7.0f;
  uint8_t packed[16];
  float scale;
  EncodeKvRow(kEncINT4, 32, ramp.data(), 32, packed, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(packed[0], (7 + 8) | ((-7 + 8) << 4));
  // Non-finite keys (a broken model): no undefined conversion, NaN codes 0.
  std::vector<float> odd(32, 1.0f);
  odd[3] = std::nanf("");
  odd[9] = INFINITY;
  int8_t codes8[32];
  float scale8;
  EncodeKvRow(kEncINT8, 32, odd.data(), 32, codes8, &scale8);
  EXPECT_EQ(codes8[3], 0);
  EXPECT_EQ(KvDefaultGroup(kEncINT8, 72), 72u);
  EXPECT_FALSE(KvEncodingValid(kEncINT8, 48, 64));
  EXPECT_FALSE(KvEncodingValid(kEncINT4, 7, 14));
  EXPECT_FALSE(KvEncodingValid(kEncBF16, 0, 64));
  EXPECT_FALSE(KvEncodingValid(kEncF16, 32, 64));
}

}  // namespace
