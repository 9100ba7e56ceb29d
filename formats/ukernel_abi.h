/*
 * ukernel_abi.h — the micro-kernel ABI: the parameter structs every micro-kernel
 * (the runtime's built-in kernels and the kernels codegen/generators emits into an
 * artifact's code segment) is called with. Part of the compiler/runtime contract:
 * generated code reads these structs by their C layout (LP64).
 *
 * Plain C (C11 / C++17 compatible), no FlatBuffers types, no runtime types. A
 * micro-kernel receives a parameter struct (shapes, strides, pointers, encodings),
 * a tile range [begin, end) in the unit its family documents, and per-thread scratch
 * of the size the family's runner computed. It never allocates, never makes a system
 * call, never touches globals, never fails: the runner (runtime/src/ops) validates
 * everything first and splits the work into tile ranges across the thread pool.
 * Packing (weights: at compile time; activations: the `quant_rows` family) is
 * separate from compute.
 *
 * Names follow KleidiAI's grammar:
 *   kiln_uk_<op>_<fused>_<dst>_<lhs>_<rhs>_<MxN tile>_<isa>_<feature>
 * with lhs/rhs types: f32, qai8dx (int8 per-row dynamic), wany (any weight encoding
 * of formats/encodings.def), wq (int8 or int4 weights), wfloat (f32/f16/bf16).
 */
#ifndef KILN_FORMATS_UKERNEL_ABI_H_
#define KILN_FORMATS_UKERNEL_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A stored weight viewed as [rows, cols] (cols = product of all but the first dim),
 * in its storage encoding (formats/encoding.h defines the bytes). */
typedef struct kiln_uk_weight_t {
  const uint8_t* data;
  int64_t rows;
  int64_t cols;
  uint8_t encoding;         /* formats/encodings.def id */
  uint8_t symmetric;        /* int4 */
  uint8_t int8_activations; /* W8A8 / W4A8: multiply int8 per-token activations */
  uint8_t layout;           /* 0: row-major */
  uint32_t group;           /* int4 group size */
} kiln_uk_weight_t;

/* ---- matmul: y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for m < M ----
 * Tile unit: output channels n. Float activations read x; int8 activations read
 * xq/xs, produced by the quant_rows family first. */
typedef struct kiln_uk_matmul_params_t {
  const float* x;        /* [M, K], row stride ldx */
  int64_t ldx;
  const int8_t* xq;      /* [M, K] int8 activations (W8A8 / W4A8), else NULL */
  union {
    const float* xs;     /* int8 activations: [M] their scales */
    /* Float activations (xq NULL): row m of x is row x_rows[m] (a mixture's tokens,
     * read where they are instead of copied), or row m when NULL. Read by the
     * reference kernel and the generated ones of schema 1.17 and later
     * (UkernelSet.matmul_reads_rows); older runtimes leave it NULL. */
    const int32_t* x_rows;
  };
  int64_t M, N, K;
  kiln_uk_weight_t w;    /* [N, K] */
  const kiln_uk_weight_t* bias; /* [N] float encoding, or NULL */
  float* y;              /* [M, N], row stride ldy */
  int64_t ldy;
} kiln_uk_matmul_params_t;
typedef void (*kiln_uk_matmul_fn)(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end,
                                  float* scratch);


/* ---- quant_rows: dynamic per-row int8 quantisation of activations ----
 * q = rint(x / s), s = absmax / 127 (1 for a zero row), clamped to [-127, 127].
 * Tile unit: rows. */
typedef struct kiln_uk_quant_rows_params_t {
  const float* x;
  int64_t ldx;
  int64_t K;
  int8_t* q;  /* [rows, K] */
  float* s;   /* [rows] */
} kiln_uk_quant_rows_params_t;

/* ---- norms: tile unit rows; scratch per thread: 2 * cols floats ---- */
typedef struct kiln_uk_norm_params_t {
  const float* x;
  float* y;
  int64_t cols;
  float epsilon;
  kiln_uk_weight_t weight; /* [cols] float encoding */
  kiln_uk_weight_t bias;   /* layer norm: [cols]; rms norm: data NULL */
} kiln_uk_norm_params_t;

/* ---- element-wise: tile unit elements ---- */
enum kiln_uk_activation_t {
  KILN_UK_SILU = 0, KILN_UK_GELU = 1, KILN_UK_GELU_TANH = 2, KILN_UK_QUICK_GELU = 3, KILN_UK_RELU = 4
};
typedef struct kiln_uk_eltwise_params_t {
  const float* a;
  const float* b;        /* binary ops and the gated activation's `up` */
  float* y;
  int32_t activation;    /* kiln_uk_activation_t */
} kiln_uk_eltwise_params_t;

/* ---- rope: rotate-half rotary embedding; tile unit rows ---- */
typedef struct kiln_uk_rope_params_t {
  const float* x;
  float* y;
  int64_t ld;            /* row stride of x and y */
  const int32_t* positions;
  const float* inv_freq; /* [head_dim / 2] */
  int64_t heads, head_dim;
} kiln_uk_rope_params_t;

/* ---- attention: softmax(q k^T * scale) v per head; tile unit (row, head) tasks,
 * task = row * heads + head; scratch per thread: KILN_UK_ATTENTION_SCRATCH(n_keys,
 * head_dim, positions given) floats: with positions (KV cache) a few rows of scores
 * of one head and one decoded row of a head; without (all keys in the inputs, e.g. vision encoders) also room for
 * the keys of one head transposed (rows padded) and its values packed (schema 1.12: generated kernels of 1.12
 * artifacts need this larger scratch).
 * Row t attends to keys [0, limit(t)): limit = n_keys, or t + 1 when causal, or
 * positions[t] + 1 when positions is given (KV cache).
 * A KV cache may hold keys and values encoded (kv_encoding, a formats/encodings.def
 * id): F32 (0) reads k and v; F16 (1), INT8 (5) and INT4 (6) read kc and vc, row
 * stride ldkv elements, INT8/INT4 with one f32 scale per kv_group elements of a row
 * (ks, vs; row stride ldkv / kv_group), symmetric: x = code * scale. INT4 packs each
 * group of g elements into g / 2 bytes, byte i holding element i in its low nibble
 * and element i + g / 2 in its high nibble, both as code + 8. Groups never straddle
 * heads (kv_group divides head_dim). Kernels built before schema 1.6 read k and v
 * only: the runtime calls them with F32 caches alone.
 * A paged cache (kv_blocks not NULL) keeps position j in physical row
 * kv_blocks[j >> kv_block_shift] * 2^kv_block_shift + j % 2^kv_block_shift of k, v,
 * kc, vc, ks and vs (blocks of 2^kv_block_shift positions taken from a pool in any
 * order); NULL: row j. Kernels built before schema 1.7 ignore kv_blocks: the runtime
 * calls them with unpaged caches alone.
 * Spans (kv_span = S > 0, INT8/INT4 caches with S == kv_group, S a power of two
 * dividing a paged cache's block): the keys of positions [s, s + S) (s a multiple of
 * S) share one scale per element of the row (keys per channel, as KIVI quantises them):
 * key element e of position j is code * ks[row(s) * (ldkv / kv_group) + e], the S rows'
 * scale slots of the span holding its ldkv scales; values keep their groups per row.
 * Row t reads positions [positions[t] & ~(S - 1), positions[t]] (its own span, not
 * complete) at full precision from kr and vr: position j at row j - kv_exact_from
 * (row stride ldkv; kv_exact_from <= the least such position of the call). Kernels
 * built before schema 1.8 read caches without spans alone. */
#define KILN_UK_ATTENTION_SCRATCH_ROWS 8
#define KILN_UK_ATTENTION_SCRATCH(n_keys, head_dim, cached)                             \
  ((cached) ? (size_t)KILN_UK_ATTENTION_SCRATCH_ROWS * (size_t)(n_keys) + (size_t)(head_dim) \
            : ((size_t)KILN_UK_ATTENTION_SCRATCH_ROWS + 2 * (size_t)(head_dim)) *       \
                  (((size_t)(n_keys) + 31) / 32 * 32 + 16))
typedef struct kiln_uk_attention_params_t {
  const float* q;
  int64_t ldq;
  const float* k;
  const float* v;
  int64_t ldkv;          /* row stride of k and v */
  float* y;
  int64_t ldy;
  int64_t heads, kv_heads, head_dim;
  int64_t n_keys;
  float scale;
  int32_t causal;
  const int32_t* positions;
  /* appended in schema 1.6: an encoded KV cache (see above) */
  int32_t kv_encoding;
  int32_t kv_group;
  const void* kc;
  const void* vc;
  const float* ks;
  const float* vs;
  /* appended in schema 1.7: a paged cache (see above) */
  const int32_t* kv_blocks;
  int32_t kv_block_shift;
  /* appended in schema 1.8: keys per channel over spans, the open span exact */
  int32_t kv_span;
  int64_t kv_exact_from;
  const float* kr;
  const float* vr;
} kiln_uk_attention_params_t;

/* ---- gather rows of a weight table (embedding, position and class embeddings) ----
 * y[r, :] = decode(W[ids[r], :]) (+ x[r, :] when x is given); ids NULL: row r.
 * Tile unit rows; scratch per thread: cols floats. */
typedef struct kiln_uk_gather_params_t {
  const int32_t* ids;
  int64_t placeholder;   /* id that yields a zero row (-1: none) */
  const float* x;        /* added when not NULL */
  float* y;
  int64_t ldy;
  int64_t cols;
  kiln_uk_weight_t table;
} kiln_uk_gather_params_t;

/* ---- im2col for a stride-p patch convolution: patches of [C, H, W] pixels as rows
 * of (c, ky, kx) values. Tile unit patches. */
typedef struct kiln_uk_im2col_params_t {
  const float* pixels;   /* [C, H, W] */
  int64_t channels, height, width, patch;
  float* y;              /* [patches, C * p * p] */
} kiln_uk_im2col_params_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_FORMATS_UKERNEL_ABI_H_ */
