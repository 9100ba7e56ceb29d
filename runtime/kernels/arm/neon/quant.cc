// Armv8.0 NEON micro-kernels the runtime runs beside generated kernels.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>

#include "kernels/ukernel.h"

extern "C" {

void kiln_uk_lhs_quant_qai8dx_f32_arm_neon(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                           int64_t row_end) {
  // The reference's arithmetic (absmax / 127, then nearbyint(x / s) clamped to
  // [-127, 127]), 16 lanes at a time: FRINTN rounds to nearest even, as nearbyint does
  // in the default rounding mode, and the division is IEEE's, so the codes and scales
  // are the reference's bit for bit.
  const int64_t k = p->K, k16 = k / 16 * 16;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * p->ldx;
    float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0, m2 = m0, m3 = m0;
    for (int64_t i = 0; i < k16; i += 16) {
      m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(xr + i)));
      m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(xr + i + 4)));
      m2 = vmaxq_f32(m2, vabsq_f32(vld1q_f32(xr + i + 8)));
      m3 = vmaxq_f32(m3, vabsq_f32(vld1q_f32(xr + i + 12)));
    }
    float absmax = vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)));
    for (int64_t i = k16; i < k; ++i) absmax = std::max(absmax, std::fabs(xr[i]));
    const float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
    p->s[r] = s;
    const float32x4_t sv = vdupq_n_f32(s), lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    int8_t* q = p->q + r * k;
    auto code = [&](const float* at) {
      return vcvtq_s32_f32(vminq_f32(hi, vmaxq_f32(lo, vrndnq_f32(vdivq_f32(vld1q_f32(at), sv)))));
    };
    for (int64_t i = 0; i < k16; i += 16) {
      const int16x8_t a = vcombine_s16(vmovn_s32(code(xr + i)), vmovn_s32(code(xr + i + 4)));
      const int16x8_t b = vcombine_s16(vmovn_s32(code(xr + i + 8)), vmovn_s32(code(xr + i + 12)));
      vst1q_s8(q + i, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
    }
    for (int64_t i = k16; i < k; ++i) {
      const float c = std::nearbyint(xr[i] / s);
      q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, c)));
    }
  }
}

}  // extern "C"
