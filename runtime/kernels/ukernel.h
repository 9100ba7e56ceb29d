/*
 * ukernel.h — the runtime's built-in micro-kernels: the portable reference kernels
 * (every op, every CPU) and the hand-written ones per ISA. Their parameter structs
 * and the calling convention are the ABI of formats/ukernel_abi.h, which generated
 * kernels share.
 */
#ifndef KILN_RUNTIME_KERNELS_UKERNEL_H_
#define KILN_RUNTIME_KERNELS_UKERNEL_H_

#include "formats/ukernel_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* matmul */
/* Scratch per thread, in floats: */
size_t kiln_uk_matmul_scratch_ref(int64_t K);
void kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                        int64_t n_end, float* scratch);
void kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                        int64_t n_end, float* scratch);
/* x86-64 AVX-512 (F, BW, VL, VNNI) with FMA and F16C: runtime/kernels/x86/avx512. */
size_t kiln_uk_matmul_scratch_x86_avx512(int64_t K);
void kiln_uk_matmul_bias_f32_f32_wany_4x4_x86_avx512(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                     int64_t n_end, float* scratch);
void kiln_uk_matmul_bias_f32_qai8dx_wq_4x4_x86_avx512vnni(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                          int64_t n_end, float* scratch);

/* quant_rows */
void kiln_uk_lhs_quant_qai8dx_f32_ref_portable(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                               int64_t row_end);
void kiln_uk_lhs_quant_qai8dx_f32_x86_avx512(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                             int64_t row_end);
void kiln_uk_lhs_quant_qai8dx_f32_arm_neon(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                           int64_t row_end);

/* norms */
void kiln_uk_rmsnorm_f32_f32_wfloat_ref_portable(const kiln_uk_norm_params_t* p, int64_t row_begin,
                                                 int64_t row_end, float* scratch);
void kiln_uk_layernorm_f32_f32_wfloat_ref_portable(const kiln_uk_norm_params_t* p, int64_t row_begin,
                                                   int64_t row_end, float* scratch);
void kiln_uk_rmsnorm_f32_f32_wfloat_x86_avx512(const kiln_uk_norm_params_t* p, int64_t row_begin, int64_t row_end,
                                               float* scratch);
void kiln_uk_layernorm_f32_f32_wfloat_x86_avx512(const kiln_uk_norm_params_t* p, int64_t row_begin, int64_t row_end,
                                                 float* scratch);

/* element-wise */
void kiln_uk_add_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_mul_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_add_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_mul_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_act_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
/* y = act(a) * b (the gated MLP's middle). */
void kiln_uk_gatedact_f32_f32_f32_ref_portable(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_act_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);
void kiln_uk_gatedact_f32_f32_f32_x86_avx512(const kiln_uk_eltwise_params_t* p, int64_t begin, int64_t end);

/* rope */
void kiln_uk_rope_f32_f32_ref_portable(const kiln_uk_rope_params_t* p, int64_t row_begin, int64_t row_end);

/* attention */
void kiln_uk_attention_f32_f32_f32_ref_portable(const kiln_uk_attention_params_t* p, int64_t task_begin,
                                                int64_t task_end, float* scratch);
void kiln_uk_attention_f32_f32_f32_x86_avx512(const kiln_uk_attention_params_t* p, int64_t task_begin,
                                              int64_t task_end, float* scratch);
/* Both read f32 and encoded KV caches (kv_encoding); the AVX-512 one the groups this
 * says it does (1), the reference every valid one. */
int kiln_uk_attention_kv_supported_x86_avx512(const kiln_uk_attention_params_t* p);

/* gather */
void kiln_uk_gather_f32_wany_ref_portable(const kiln_uk_gather_params_t* p, int64_t row_begin, int64_t row_end,
                                          float* scratch);

/* im2col */
void kiln_uk_im2col_f32_f32_ref_portable(const kiln_uk_im2col_params_t* p, int64_t patch_begin, int64_t patch_end);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_RUNTIME_KERNELS_UKERNEL_H_ */
