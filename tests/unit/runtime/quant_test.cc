// The runtime's dequantisation of every weight encoding, bit for bit against the
// NumPy reference (gen_quant_vectors.py), and the int8-activation matrix product.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/encoding.h"
#include "kernels/reference/common.h"
#include "support/allocator.h"
#include "thread_pool.h"
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
  kiln::rt::Allocator allocator;
  kiln::rt::ThreadPool* pool = kiln::rt::ThreadPool::Create(1, &allocator);
  ASSERT_NE(pool, nullptr);
  for (const Case& c : Cases(dir)) {
    if (!c.has_y) continue;
    std::vector<uint8_t> bytes = ReadBytes(dir + "/" + c.name + ".bin");
    kiln::npy::Array x, y;
    std::string error;
    ASSERT_TRUE(kiln::npy::Read(dir + "/" + c.name + ".x.npy", &x, &error)) << error;
    ASSERT_TRUE(kiln::npy::Read(dir + "/" + c.name + ".y.npy", &y, &error)) << error;
    kiln::rt::WeightView w;
    w.data = bytes.data();
    w.spec = {EncodingId(c.encoding), c.group, c.symmetric};
    w.encoding = static_cast<kiln::fb::Encoding>(w.spec.id);
    w.int8_activations = true;
    w.rows = c.rows;
    w.cols = c.cols;
    std::vector<float> xs = x.AsFloat(), want = y.AsFloat();
    int64_t rows = static_cast<int64_t>(x.shape[0]);
    std::vector<float> got(rows * c.rows), scratch(kiln::rt::ref::WeightScratch(c.cols, 1, rows));
    kiln::rt::ref::MatMulT(xs.data(), rows, c.cols, w, nullptr, got.data(), c.rows, pool, scratch.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << c.name;
  }
  kiln::rt::ThreadPool::Destroy(pool);
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

}  // namespace
