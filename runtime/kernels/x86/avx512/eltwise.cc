// AVX-512 element-wise micro-kernels: the activations (and the gated MLP's
// act(gate) * up) with vectorised exp, tanh and erf, 16 elements at a time. The
// reference (runtime/kernels/reference/uk/eltwise.cc) calls libm per element.
#include <immintrin.h>

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

}  // namespace

extern "C" {

void kiln_uk_act_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  Dispatch<false>(p, begin, end);
}

void kiln_uk_gatedact_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end) {
  Dispatch<true>(p, begin, end);
}

}  // extern "C"
