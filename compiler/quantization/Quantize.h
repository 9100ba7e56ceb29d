//===- Quantize.h - weight quantisation --------------------------*- C++ -*-===//
//
// Turns float weights into the storage encodings of formats/encoding.h:
// round-to-nearest (the exact rules of the NumPy reference
// tests/models/kiln_models/quant.py), and error-compensated rounding in the spirit of
// GPTQ (Frantar et al., 2022) using the layer's calibration Hessian.
//
//===----------------------------------------------------------------------===//
#ifndef KILN_COMPILER_QUANTIZATION_QUANTIZE_H
#define KILN_COMPILER_QUANTIZATION_QUANTIZE_H

#include <cstdint>
#include <vector>

#include "formats/encoding.h"

namespace kiln::quant {

/// Storage bytes of a [rows, cols] row-major float matrix in encoding `spec`
/// (floats are converted; quantised encodings use round-to-nearest).
std::vector<uint8_t> quantizeRtn(const float* w, uint64_t rows, uint64_t cols,
                                 const format::EncodingSpec& spec);

/// GPTQ: quantises columns in order, spreading each column's rounding error over
/// the columns not yet quantised through the inverse Hessian. `hessian` is the
/// [cols, cols] row-major matrix X^T X / n of the layer's inputs (f64). `damp` is
/// the fraction of the mean diagonal added to it. Only fp8, int8 and int4.
std::vector<uint8_t> quantizeGptq(const float* w, uint64_t rows, uint64_t cols,
                                  const format::EncodingSpec& spec, const double* hessian,
                                  double damp = 0.01, int block = 128);

/// The values a stored tensor stands for (row-major f32).
void dequantize(const uint8_t* data, uint64_t rows, uint64_t cols, const format::EncodingSpec& spec,
                float* out);

} // namespace kiln::quant

#endif // KILN_COMPILER_QUANTIZATION_QUANTIZE_H
