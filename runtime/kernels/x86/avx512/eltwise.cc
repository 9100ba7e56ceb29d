// AVX-512 element-wise micro-kernels: the activations (and the gated MLP's
// act(gate) * up) with vectorised exp, tanh and erf, 16 elements at a time (the
// reference, runtime/kernels/reference/uk/eltwise.cc, calls libm per element); RMSNorm
// and LayerNorm (LayerNorm's mean and variance summed in f64 lanes, as the reference
// sums in f64); add and multiply.
#include <immintrin.h>

#include <cmath>

#include "kernels/reference/uk/common.h"
#include "kernels/ukernel.h"
#include "kernels/x86/avx512/common.h"

using kiln::x86::Exp;

namespace {

// tanh(x) = 1 - 2 / (e^(2x) + 1) (exact limits: e^(2x) overflows to inf for large x).
inline __m512 Tanh(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(Exp(_mm512_add_ps(x, x)), one)));
}

// erf(x): Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), odd symmetry.
inline __m512 Erf(__m512 x) {
  const __m512 a = _mm512_abs_ps(x);
  const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), a, _mm512_set1_ps(1.0f)));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  p = _mm512_mul_ps(p, t);
  const __m512 y = _mm512_fnmadd_ps(p, Exp(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), a), a)), _mm512_set1_ps(1.0f));
  // Restore the sign of x.
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y),
                                             _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}

template <int Kind>
inline __m512 Activate(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  if constexpr (Kind == KILN_UK_SILU) {
    return _mm512_div_ps(x, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
  } else if constexpr (Kind == KILN_UK_GELU) {
    return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, Erf(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)))));
  } else if constexpr (Kind == KILN_UK_GELU_TANH) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 in = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
    return _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, Tanh(in)));
  } else if constexpr (Kind == KILN_UK_QUICK_GELU) {
    return _mm512_div_ps(x, _mm512_add_ps(one, Exp(_mm512_mul_ps(_mm512_set1_ps(-1.702f), x))));
  } else {
    return _mm512_max_ps(x, _mm512_setzero_ps());
  }
}

template <int Kind, bool Gated>
void Run(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = end - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (end - i)) - 1);
    __m512 y = Activate<Kind>(_mm512_maskz_loadu_ps(m, p->a + i));
    if constexpr (Gated) y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(m, p->b + i));
    _mm512_mask_storeu_ps(p->y + i, m, y);
  }
}

template <bool Gated>
void Dispatch(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  switch (p->activation) {
    case KILN_UK_SILU: return Run<KILN_UK_SILU, Gated>(p, begin, end);
    case KILN_UK_GELU: return Run<KILN_UK_GELU, Gated>(p, begin, end);
    case KILN_UK_GELU_TANH: return Run<KILN_UK_GELU_TANH, Gated>(p, begin, end);
    case KILN_UK_QUICK_GELU: return Run<KILN_UK_QUICK_GELU, Gated>(p, begin, end);
    case KILN_UK_RELU: return Run<KILN_UK_RELU, Gated>(p, begin, end);
  }
  // An activation this file does not know (the runner checked the kind): the reference.
  if (Gated) kiln_uk_gatedact_f32_f32_f32_ref_portable(p, begin, end);
  else kiln_uk_act_f32_f32_ref_portable(p, begin, end);
}

inline __mmask16 Mask(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }

// The upper 8 floats of a vector (AVX-512 F only: no DQ).
inline __m256 High8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// Sum of x[0, n) accumulated in f64 lanes.
inline double SumF64(const float* x, int64_t n) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(Mask(n - i), x + i);
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(High8(v)));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

}  // namespace

extern "C" {

void kiln_uk_rmsnorm_f32_f32_wfloat_x86_avx512(const kiln_uk_norm_params_t* p, int64_t row_begin, int64_t row_end,
                                               float* scratch) {
  const int64_t n = p->cols;
  float* w = scratch;
  kiln::uk::DecodeElements(p->weight, 0, n, w);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * n;
    float* yr = p->y + r * n;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(Mask(n - i), xr + i);
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(n) + p->epsilon);
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Mask(n - i);
      _mm512_mask_storeu_ps(yr + i, m,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), iv)));
    }
  }
}

void kiln_uk_layernorm_f32_f32_wfloat_x86_avx512(const kiln_uk_norm_params_t* p, int64_t row_begin, int64_t row_end,
                                                 float* scratch) {
  const int64_t n = p->cols;
  float* w = scratch;
  float* bias = w + n;
  kiln::uk::DecodeElements(p->weight, 0, n, w);
  kiln::uk::DecodeElements(p->bias, 0, n, bias);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * n;
    float* yr = p->y + r * n;
    const float mean = static_cast<float>(SumF64(xr, n) / static_cast<double>(n));
    const __m512 mv = _mm512_set1_ps(mean);
    // Sum of (x - mean)^2 in f64, as the reference.
    const __m512d md = _mm512_set1_pd(mean);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Mask(n - i);
      const __m512 x = _mm512_maskz_loadu_ps(m, xr + i);
      const __m512d dl = _mm512_maskz_sub_pd(static_cast<__mmask8>(m), _mm512_cvtps_pd(_mm512_castps512_ps256(x)), md);
      const __m512d dh =
          _mm512_maskz_sub_pd(static_cast<__mmask8>(m >> 8), _mm512_cvtps_pd(High8(x)), md);
      lo = _mm512_fmadd_pd(dl, dl, lo);
      hi = _mm512_fmadd_pd(dh, dh, hi);
    }
    const double var = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
    const float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(n) + p->epsilon));
    const __m512 iv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = Mask(n - i);
      const __m512 y = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + i), mv), iv),
                                       _mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, bias + i));
      _mm512_mask_storeu_ps(yr + i, m, y);
    }
  }
}

void kiln_uk_add_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = Mask(end - i);
    _mm512_mask_storeu_ps(p->y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, p->a + i), _mm512_maskz_loadu_ps(m, p->b + i)));
  }
}

void kiln_uk_mul_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = Mask(end - i);
    _mm512_mask_storeu_ps(p->y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p->a + i), _mm512_maskz_loadu_ps(m, p->b + i)));
  }
}

void kiln_uk_act_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  Dispatch<false>(p, begin, end);
}

void kiln_uk_gatedact_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  Dispatch<true>(p, begin, end);
}

}  // extern "C"
