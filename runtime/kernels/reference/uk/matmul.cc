// Reference micro-kernels of the matmul family: float activations against any weight
// encoding (weights decoded a block of rows at a time), int8 per-token activations
// against int8/int4 weights (exact integer accumulation, docs/precision.md), and
// the dynamic quantisation of activation rows.
#include <algorithm>

#include "kernels/reference/uk/common.h"

using namespace kiln;
using namespace kiln::uk;

namespace {

constexpr int64_t kRowBlock = 16;

// Integer dot product of an int8 activation row with row `n` of an int8 or int4
// weight, dequantised: int8: float(acc) * sx * sw; int4: sx * sum over groups of
// float(acc_g) * s_g, groups in order.
float DotInt8(const int8_t* xq, float sx, const kiln_uk_weight_t& w, int64_t n) {
  const int64_t k = w.cols;
  if (w.encoding == format::kEncINT8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.data) + n * k;
    int32_t acc = 0;
    for (int64_t i = 0; i < k; ++i) acc += static_cast<int32_t>(xq[i]) * static_cast<int32_t>(q[i]);
    float sw;
    std::memcpy(&sw, w.data + w.rows * k + 4 * n, 4);
    return static_cast<float>(acc) * sx * sw;
  }
  const format::Int4View v =
      format::Int4View::Of(SpecOf(w), w.data, static_cast<uint64_t>(w.rows), static_cast<uint64_t>(k));
  const int64_t group = w.group, groups = k / group;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const int32_t z = v.zero(n, g);
    int32_t acc = 0;
    for (int64_t i = g * group; i < (g + 1) * group; ++i)
      acc += static_cast<int32_t>(xq[i]) * (static_cast<int32_t>(v.code(n, i)) - z);
    sum += static_cast<float>(acc) * v.scale(n, g);
  }
  return sum * sx;
}

}  // namespace

extern "C" {

size_t kiln_uk_matmul_scratch_ref(int64_t K) { return static_cast<size_t>(kRowBlock * K); }

void kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                        int64_t n_end, float* scratch) {
  const int64_t k = p->K;
  float bvals[kRowBlock];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kRowBlock) {
    const int64_t n1 = std::min(n_end, n0 + kRowBlock);
    const float* wrow[kRowBlock];
    for (int64_t j = n0; j < n1; ++j) wrow[j - n0] = WeightRow(p->w, j, scratch + (j - n0) * k);
    if (p->bias != nullptr) DecodeElements(*p->bias, n0, n1 - n0, bvals);
    for (int64_t r = 0; r < p->M; ++r) {
      const float* xr = p->x + (p->xq == nullptr && p->x_rows != nullptr ? p->x_rows[r] : r) * p->ldx;
      float* yr = p->y + r * p->ldy;
      for (int64_t j = n0; j < n1; ++j) {
        float v = Dot(xr, wrow[j - n0], k);
        yr[j] = p->bias != nullptr ? v + bvals[j - n0] : v;
      }
    }
  }
}

void kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                        int64_t n_end, float*) {
  for (int64_t j = n_begin; j < n_end; ++j) {
    float b = 0.0f;
    if (p->bias != nullptr) DecodeElements(*p->bias, j, 1, &b);
    for (int64_t r = 0; r < p->M; ++r) {
      float v = DotInt8(p->xq + r * p->K, p->xs[r], p->w, j);
      p->y[r * p->ldy + j] = p->bias != nullptr ? v + b : v;
    }
  }
}

void kiln_uk_lhs_quant_qai8dx_f32_ref_portable(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                               int64_t row_end) {
  const int64_t k = p->K;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * p->ldx;
    float absmax = 0.0f;
    for (int64_t i = 0; i < k; ++i) absmax = std::max(absmax, std::fabs(xr[i]));
    float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
    p->s[r] = s;
    for (int64_t i = 0; i < k; ++i) {
      float q = std::nearbyint(xr[i] / s);
      p->q[r * k + i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
    }
  }
}

void kiln_uk_im2col_f32_f32_ref_portable(const kiln_uk_im2col_params_t* p, int64_t patch_begin, int64_t patch_end) {
  const int64_t pz = p->patch, gw = p->width / pz, kdim = p->channels * pz * pz, plane = p->height * p->width;
  for (int64_t q = patch_begin; q < patch_end; ++q) {
    const int64_t py = q / gw, px = q % gw;
    float* buf = p->y + q * kdim;
    for (int64_t c = 0; c < p->channels; ++c)
      for (int64_t ky = 0; ky < pz; ++ky)
        std::memcpy(buf + (c * pz + ky) * pz, p->pixels + c * plane + (py * pz + ky) * p->width + px * pz,
                    static_cast<size_t>(pz) * 4);
  }
}

void kiln_uk_gather_f32_wany_ref_portable(const kiln_uk_gather_params_t* p, int64_t row_begin, int64_t row_end,
                                          float* scratch) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* out = p->y + r * p->ldy;
    if (p->ids != nullptr && p->ids[r] == p->placeholder) {
      std::memset(out, 0, static_cast<size_t>(p->cols) * 4);
      continue;
    }
    const int64_t row = p->ids != nullptr ? p->ids[r] : r;
    if (p->x == nullptr) {
      const float* w = WeightRow(p->table, row, out);
      if (w != out) std::memcpy(out, w, static_cast<size_t>(p->cols) * 4);
      continue;
    }
    DecodeElements(p->table, row * p->table.cols, p->cols, scratch);
    const float* xr = p->x + r * p->cols;
    for (int64_t i = 0; i < p->cols; ++i) out[i] = xr[i] + scratch[i];
  }
}

}  // extern "C"
