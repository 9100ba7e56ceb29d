//===- Quantize.cpp - weight quantisation ------------------------*- C++ -*-===//
#include "compiler/quantization/Quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/numeric.h"
#include <Eigen/Dense>

namespace kiln::quant {
namespace {

using format::EncodingSpec;

// Per-row (fp8, int8) or per-(row, group) (int4) quantisation parameters, computed
// from the values of the row or group exactly as quant.py does.
struct Params {
  float scale;  // as stored (int4: the float16 value)
  float zero;   // int4 asymmetric zero point, else 0
};

Params paramsFor(const float* v, uint64_t n, const EncodingSpec& spec) {
  float lo = 0.0f, hi = 0.0f, absmax = 0.0f;
  for (uint64_t i = 0; i < n; ++i) {
    absmax = std::max(absmax, std::fabs(v[i]));
    lo = i == 0 ? v[i] : std::min(lo, v[i]);
    hi = i == 0 ? v[i] : std::max(hi, v[i]);
  }
  switch (spec.id) {
  case format::kEncFP8_E4M3:
    return {absmax > 0.0f ? absmax / 448.0f : 1.0f, 0.0f};
  case format::kEncFP8_E5M2:
    return {absmax > 0.0f ? absmax / 57344.0f : 1.0f, 0.0f};
  case format::kEncINT8:
    return {absmax > 0.0f ? absmax / 127.0f : 1.0f, 0.0f};
  case format::kEncINT4:
    if (spec.symmetric) {
      float s = absmax > 0.0f ? absmax / 7.0f : 1.0f;
      return {numeric::F16ToF32(numeric::F32ToF16(s)), 0.0f};
    } else {
      float s = hi > lo ? (hi - lo) / 15.0f : 1.0f;
      s = numeric::F16ToF32(numeric::F32ToF16(s));
      float z = std::min(15.0f, std::max(0.0f, std::nearbyint(-lo / s)));
      return {s, z};
    }
  default:
    return {1.0f, 0.0f};
  }
}

// The code of one value, and the value it stands for.
uint8_t encodeValue(float v, const Params& p, const EncodingSpec& spec, float* deq) {
  switch (spec.id) {
  case format::kEncFP8_E4M3:
  case format::kEncFP8_E5M2: {
    bool e4m3 = spec.id == format::kEncFP8_E4M3;
    uint8_t c = format::F32ToFp8(v / p.scale, e4m3);
    *deq = format::Fp8ToF32(c, e4m3) * p.scale;
    return c;
  }
  case format::kEncINT8: {
    float q = std::min(127.0f, std::max(-127.0f, std::nearbyint(v / p.scale)));
    *deq = q * p.scale;
    return static_cast<uint8_t>(static_cast<int8_t>(q));
  }
  case format::kEncINT4: {
    float c;
    if (spec.symmetric) {
      c = std::min(7.0f, std::max(-8.0f, std::nearbyint(v / p.scale))) + 8.0f;
      *deq = (c - 8.0f) * p.scale;
    } else {
      c = std::min(15.0f, std::max(0.0f, std::nearbyint(v / p.scale) + p.zero));
      *deq = (c - p.zero) * p.scale;
    }
    return static_cast<uint8_t>(c);
  }
  default:
    *deq = v;
    return 0;
  }
}

// Lays codes (one per element) and parameters out in the storage format.
std::vector<uint8_t> pack(const std::vector<uint8_t>& codes, const std::vector<Params>& params, uint64_t rows,
                          uint64_t cols, const EncodingSpec& spec) {
  std::vector<uint8_t> out(format::StorageBytes(spec, rows, cols), 0);
  uint64_t n = rows * cols;
  if (spec.id == format::kEncINT4) {
    for (uint64_t i = 0; i < n; ++i)
      format::Int4View::SetCode(out.data(), i, codes[i]);
    uint64_t groups = params.size();
    const uint64_t scales = format::Int4ScalesOffset(rows, cols), zeros = format::Int4ZerosOffset(rows, cols, spec.group);
    for (uint64_t g = 0; g < groups; ++g) {
      uint16_t h = numeric::F32ToF16(params[g].scale);
      std::memcpy(out.data() + scales + 2 * g, &h, 2);
      if (!spec.symmetric)
        out[zeros + g] = static_cast<uint8_t>(params[g].zero);
    }
  } else {
    std::memcpy(out.data(), codes.data(), n);
    for (uint64_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + n + 4 * r, &params[r].scale, 4);
  }
  return out;
}

std::vector<uint8_t> convertFloat(const float* w, uint64_t n, uint8_t id) {
  std::vector<uint8_t> out(format::StorageBytes(EncodingSpec{id, 0, true}, 1, n));
  format::EncodeFloatElements(id, w, n, out.data());
  return out;
}

} // namespace

std::vector<uint8_t> quantizeRtn(const float* w, uint64_t rows, uint64_t cols, const EncodingSpec& spec) {
  if (!format::IsQuantized(spec.id))
    return convertFloat(w, rows * cols, spec.id);
  std::vector<uint8_t> codes(rows * cols);
  std::vector<Params> params;
  float deq;
  if (spec.id == format::kEncINT4) {
    uint64_t g = spec.group;
    for (uint64_t r = 0; r < rows; ++r)
      for (uint64_t c0 = 0; c0 < cols; c0 += g) {
        const float* v = w + r * cols + c0;
        Params p = paramsFor(v, g, spec);
        params.push_back(p);
        for (uint64_t i = 0; i < g; ++i)
          codes[r * cols + c0 + i] = encodeValue(v[i], p, spec, &deq);
      }
  } else {
    for (uint64_t r = 0; r < rows; ++r) {
      Params p = paramsFor(w + r * cols, cols, spec);
      params.push_back(p);
      for (uint64_t i = 0; i < cols; ++i)
        codes[r * cols + i] = encodeValue(w[r * cols + i], p, spec, &deq);
    }
  }
  return pack(codes, params, rows, cols, spec);
}

std::vector<uint8_t> quantizeGptq(const float* w, uint64_t rows, uint64_t cols, const EncodingSpec& spec,
                                  const double* hessian, double damp, int block) {
  if (!format::IsQuantized(spec.id))
    return quantizeRtn(w, rows, cols, spec);
  const Eigen::Index n = static_cast<Eigen::Index>(cols);
  Eigen::MatrixXd H = Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      hessian, n, n);
  // W as [rows, cols] in double; dead inputs (never active) are zeroed.
  Eigen::MatrixXd W(rows, n);
  for (uint64_t r = 0; r < rows; ++r)
    for (Eigen::Index c = 0; c < n; ++c)
      W(static_cast<Eigen::Index>(r), c) = w[r * cols + static_cast<uint64_t>(c)];
  for (Eigen::Index c = 0; c < n; ++c)
    if (H(c, c) == 0.0) {
      H(c, c) = 1.0;
      W.col(c).setZero();
    }
  double mean_diag = H.diagonal().mean();
  H.diagonal().array() += damp * mean_diag;
  // The upper Cholesky factor of H^-1 (GPTQ's Hinv).
  Eigen::LLT<Eigen::MatrixXd> llt(H);
  Eigen::MatrixXd Hinv = llt.solve(Eigen::MatrixXd::Identity(n, n));
  Eigen::LLT<Eigen::MatrixXd> llt2(Hinv);
  if (llt.info() != Eigen::Success || llt2.info() != Eigen::Success)
    return quantizeRtn(w, rows, cols, spec);  // not positive definite: plain rounding
  Eigen::MatrixXd U = llt2.matrixU();

  std::vector<uint8_t> codes(rows * cols);
  const uint64_t groupsPerRow = spec.id == format::kEncINT4 ? cols / spec.group : 1;
  std::vector<Params> params(rows * groupsPerRow);
  std::vector<float> tmp(std::max<uint64_t>(cols, 1));
  // Per-row parameters of fp8/int8 come from the original weights.
  if (spec.id != format::kEncINT4)
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) tmp[c] = static_cast<float>(W(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)));
      params[r] = paramsFor(tmp.data(), cols, spec);
    }
  for (Eigen::Index b0 = 0; b0 < n; b0 += block) {
    Eigen::Index b1 = std::min<Eigen::Index>(b0 + block, n), count = b1 - b0;
    Eigen::MatrixXd Err(rows, count);
    for (Eigen::Index i = b0; i < b1; ++i) {
      if (spec.id == format::kEncINT4 && static_cast<uint64_t>(i) % spec.group == 0) {
        // Group parameters from the current (error-updated) weights of the group.
        for (uint64_t r = 0; r < rows; ++r) {
          for (uint64_t k = 0; k < spec.group; ++k)
            tmp[k] = static_cast<float>(W(static_cast<Eigen::Index>(r), i + static_cast<Eigen::Index>(k)));
          params[r * groupsPerRow + static_cast<uint64_t>(i) / spec.group] = paramsFor(tmp.data(), spec.group, spec);
        }
      }
      double d = U(i, i);
      for (uint64_t r = 0; r < rows; ++r) {
        const Params& p = params[spec.id == format::kEncINT4 ? r * groupsPerRow + static_cast<uint64_t>(i) / spec.group : r];
        float deq;
        float v = static_cast<float>(W(static_cast<Eigen::Index>(r), i));
        codes[r * cols + static_cast<uint64_t>(i)] = encodeValue(v, p, spec, &deq);
        Err(static_cast<Eigen::Index>(r), i - b0) = (W(static_cast<Eigen::Index>(r), i) - deq) / d;
      }
      // Spread this column's error over the rest of the block.
      if (i + 1 < b1)
        W.block(0, i + 1, static_cast<Eigen::Index>(rows), b1 - i - 1).noalias() -=
            Err.col(i - b0) * U.block(i, i + 1, 1, b1 - i - 1);
    }
    // ... and over the columns after the block.
    if (b1 < n)
      W.block(0, b1, static_cast<Eigen::Index>(rows), n - b1).noalias() -= Err * U.block(b0, b1, count, n - b1);
  }
  return pack(codes, params, rows, cols, spec);
}

void dequantize(const uint8_t* data, uint64_t rows, uint64_t cols, const EncodingSpec& spec, float* out) {
  for (uint64_t r = 0; r < rows; ++r)
    format::DecodeRow(spec, data, rows, cols, r, out + r * cols);
}

} // namespace kiln::quant
