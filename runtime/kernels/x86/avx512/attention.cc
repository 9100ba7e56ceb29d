// AVX-512 attention micro-kernel: softmax(q k^T * scale) v per (row, head) task, as
// the reference (runtime/kernels/reference/uk/eltwise.cc) defines it: dot products
// along head_dim reduced 16 at a time by one transposing reduction, a vectorised exp,
// and the weighted sum of values along head_dim, for groups of rows of one head.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "formats/encoding.h"
#include "kernels/ukernel.h"
#include "kernels/x86/avx512/common.h"

using kiln::x86::Reduce16;

namespace {

inline __mmask16 Mask(int64_t n) { return n >= 16 ? 0xFFFF : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1); }

// Softmax of s[0, n) in place, zeros in [n, nmax); returns 1 / the sum.
inline float Softmax(float* s, int64_t n, int64_t nmax) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 km = Mask(n - j0);
    vmax = _mm512_mask_max_ps(vmax, km, vmax, _mm512_maskz_loadu_ps(km, s + j0));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const __mmask16 km = Mask(n - j0);
    const __m512 e = _mm512_maskz_mov_ps(km, kiln::x86::Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, s + j0), mx)));
    _mm512_mask_storeu_ps(s + j0, km, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  for (int64_t j = n; j < nmax; ++j) s[j] = 0.0f;
  return 1.0f / _mm512_reduce_add_ps(vsum);
}

// 16 elements (masked) of a key or value row of the cache, as floats: Load(j, d, m)
// reads elements [d, d + 16) of head `col0 / head_dim` of row j. The encoded forms
// (formats/kv_codec.h) need 16-element chunks inside one group: kv_group a multiple
// of 16 (INT8) or 32 (INT4), checked by Encoded().
// Position j's physical row: through the block table of a paged cache, else j; and
// with spans (kv_span), the exact rows of positions from `exact_at` on (the span of
// the rows a group attends for: kr or vr) and whether keys scale per channel.
struct Pages {
  const int32_t* blocks;
  int32_t shift;
  int64_t span;
  const float* exact = nullptr;  // head start of row kv_exact_from
  int64_t exact_from = 0, exact_at = INT64_MAX, exact_ld = 0;
  bool per_channel = false;
  Pages(const kiln_uk_attention_params_t* p, bool key, int64_t col0)
      : blocks(p->positions != nullptr ? p->kv_blocks : nullptr), shift(p->kv_block_shift),
        span(p->positions != nullptr ? p->kv_span : 0) {
    if (span > 0) {
      exact = (key ? p->kr : p->vr) + col0;
      exact_from = p->kv_exact_from;
      exact_ld = p->ldkv;
      per_channel = key;
    }
  }
  // Reading for queries at position `at`: the positions of its span exact.
  void AttendFrom(int64_t at) {
    if (span > 0) exact_at = at - at % span;
  }
  int64_t Row(int64_t j) const {
    if (blocks == nullptr) return j;
    return (static_cast<int64_t>(blocks[j >> shift]) << shift) + (j & ((int64_t{1} << shift) - 1));
  }
  bool Exact(int64_t j) const { return j >= exact_at; }
  __m512 LoadExact(int64_t j, int64_t d, __mmask16 m) const {
    return _mm512_maskz_loadu_ps(m, exact + (j - exact_from) * exact_ld + d);
  }
};
struct F32Rows : Pages {
  const float* base;  // head start
  int64_t ld;
  F32Rows(const kiln_uk_attention_params_t* p, bool key, int64_t col0)
      : Pages(p, key, col0), base((key ? p->k : p->v) + col0), ld(p->ldkv) {}
  __m512 Load(int64_t j, int64_t d, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, base + Row(j) * ld + d); }
};
struct F16Rows : Pages {
  const uint16_t* base;
  int64_t ld;
  F16Rows(const kiln_uk_attention_params_t* p, bool key, int64_t col0)
      : Pages(p, key, col0), base(static_cast<const uint16_t*>(key ? p->kc : p->vc) + col0), ld(p->ldkv) {}
  __m512 Load(int64_t j, int64_t d, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, base + Row(j) * ld + d));
  }
};
// The scales of 16 elements from e of quantised row j (physical r): its group's, or
// with keys per channel its span's.
struct QuantRows : Pages {
  const float* scales;
  int64_t lds, col0, group;
  QuantRows(const kiln_uk_attention_params_t* p, bool key, int64_t c0)
      : Pages(p, key, c0), scales(key ? p->ks : p->vs), lds(p->ldkv / p->kv_group), col0(c0), group(p->kv_group) {}
  __m512 Scale(int64_t j, int64_t r, int64_t e, __mmask16 m) const {
    if (per_channel) return _mm512_maskz_loadu_ps(m, scales + Row(j - (j & (span - 1))) * lds + e);
    return _mm512_set1_ps(scales[r * lds + e / group]);
  }
};
struct Int8Rows : QuantRows {
  const int8_t* base;
  int64_t ld;
  Int8Rows(const kiln_uk_attention_params_t* p, bool key, int64_t c0)
      : QuantRows(p, key, c0), base(static_cast<const int8_t*>(key ? p->kc : p->vc) + c0), ld(p->ldkv) {}
  __m512 Load(int64_t j, int64_t d, __mmask16 m) const {
    if (Exact(j)) return LoadExact(j, d, m);
    const int64_t r = Row(j);
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, base + r * ld + d)));
    return _mm512_mul_ps(x, Scale(j, r, col0 + d, m));
  }
};
struct Int4Rows : QuantRows {
  const uint8_t* base;  // row 0
  int64_t ld_bytes;
  Int4Rows(const kiln_uk_attention_params_t* p, bool key, int64_t c0)
      : QuantRows(p, key, c0), base(static_cast<const uint8_t*>(key ? p->kc : p->vc)), ld_bytes(p->ldkv / 2) {}
  __m512 Load(int64_t j, int64_t d, __mmask16 m) const {
    if (Exact(j)) return LoadExact(j, d, m);
    const int64_t r = Row(j);
    const int64_t e = col0 + d, g = e / group, o = e - g * group, half = group / 2;
    const uint8_t* bytes = base + r * ld_bytes + g * half + (o < half ? o : o - half);
    __m512i c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, bytes));
    c = o < half ? _mm512_and_si512(c, _mm512_set1_epi32(15)) : _mm512_srli_epi32(c, 4);
    const __m512 x = _mm512_cvtepi32_ps(_mm512_sub_epi32(c, _mm512_set1_epi32(8)));
    return _mm512_mul_ps(x, Scale(j, r, e, m));
  }
};

template <int G, class Rows>
void SumValues(const Rows& vals, int64_t hd, int64_t nmax, float* const* s, const float* inv, float* const* out) {
  for (int64_t d = 0; d < hd; d += 64) {
    __m512 o[G][4];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) o[g][i] = _mm512_setzero_ps();
    __mmask16 m[4];
    for (int i = 0; i < 4; ++i) m[i] = Mask(hd - d - 16 * i);
    for (int64_t j = 0; j < nmax; ++j) {
      __m512 vv[4];
      for (int i = 0; i < 4; ++i) vv[i] = m[i] != 0 ? vals.Load(j, d + 16 * i, m[i]) : _mm512_setzero_ps();
      for (int g = 0; g < G; ++g) {
        const __m512 w = _mm512_set1_ps(s[g][j]);
        for (int i = 0; i < 4; ++i) o[g][i] = _mm512_fmadd_ps(w, vv[i], o[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 iv = _mm512_set1_ps(inv[g]);
      for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(out[g] + d + 16 * i, m[i], _mm512_mul_ps(o[g][i], iv));
    }
  }
}

// Up to kGroup (row, head) pairs of one kv head at a time, so that each key and value
// loaded serves every pair of the group: scores 4 keys x G rows per Reduce16, the weighted sum of
// values into G rows of outputs. Row g attends to keys [0, n[g]); its scores live in
// scratch + g * n_keys. A row's result does not depend on the group it is computed in:
// its dot products, softmax and sums go through the same operations (zero weights of
// keys past its own limit add exact zeros).
constexpr int kGroup = 4;
static_assert(kGroup == 4 && kGroup <= KILN_UK_ATTENTION_SCRATCH_ROWS, "groups of 4 rows; their scores live in the scratch");

template <int G, class Rows>
void AttendGroup(const kiln_uk_attention_params_t* p, int64_t kvh, const int64_t* rows, const int64_t* hs,
                 float* scratch) {
  const int64_t hd = p->head_dim;
  Rows keys(p, true, kvh * hd);
  Rows vals(p, false, kvh * hd);
  int64_t n[G], nmax = 0;
  const float* q[G];
  float* out[G];
  float* s[G];
  for (int g = 0; g < G; ++g) {
    const int64_t t = rows[g], h = hs[g];
    n[g] = p->positions != nullptr ? static_cast<int64_t>(p->positions[t]) + 1 : p->causal ? t + 1 : p->n_keys;
    nmax = std::max(nmax, n[g]);
    q[g] = p->q + t * p->ldq + h * hd;
    out[g] = p->y + t * p->ldy + h * hd;
    s[g] = scratch + g * p->n_keys;
  }
  // With spans the rows of a group share theirs (AttendKvHead): its positions exact.
  if (p->positions != nullptr) {
    keys.AttendFrom(n[0] - 1);
    vals.AttendFrom(n[0] - 1);
  }
  // Scores, 4 keys at a time.
  const __m512 scale = _mm512_set1_ps(p->scale);
  for (int64_t j0 = 0; j0 < nmax; j0 += 4) {
    const int64_t nk = std::min<int64_t>(4, nmax - j0);
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
      const __mmask16 m = Mask(hd - d);
      __m512 kv[4];
      for (int kk = 0; kk < 4; ++kk)
        kv[kk] = kk < nk ? keys.Load(j0 + kk, d, m) : _mm512_setzero_ps();
      for (int g = 0; g < G; ++g) {
        const __m512 qv = _mm512_maskz_loadu_ps(m, q[g] + d);
        for (int kk = 0; kk < 4; ++kk) acc[g * 4 + kk] = _mm512_fmadd_ps(qv, kv[kk], acc[g * 4 + kk]);
      }
    }
    alignas(64) float z[16];
    _mm512_store_ps(z, _mm512_mul_ps(Reduce16(acc), scale));
    for (int g = 0; g < G; ++g)
      for (int64_t kk = 0; kk < nk; ++kk) s[g][j0 + kk] = z[g * 4 + kk];
  }
  // Softmax per row over its own keys (zero weights up to nmax), then the values.
  float inv[G];
  for (int g = 0; g < G; ++g) inv[g] = Softmax(s[g], n[g], nmax);
  SumValues<G>(vals, hd, nmax, s, inv, out);
}

// The tasks in [begin, end) of kv head kvh, in groups of up to kGroup (row, head)
// pairs that share its keys and values: rows of a head and, with grouped-query
// attention, the heads of one kv head (so that decode, one row, reads and decodes
// each key and value once for every head that shares it).
template <class Rows>
void AttendKvHead(const kiln_uk_attention_params_t* p, int64_t kvh, int64_t begin, int64_t end, float* scratch) {
  const int64_t heads = p->heads, per_kv = heads / p->kv_heads;
  int64_t rows[kGroup], hs[kGroup];
  int count = 0;
  auto flush = [&] {
    switch (count) {
      case 0: break;
      case 1: AttendGroup<1, Rows>(p, kvh, rows, hs, scratch); break;
      case 2: AttendGroup<2, Rows>(p, kvh, rows, hs, scratch); break;
      case 3: AttendGroup<3, Rows>(p, kvh, rows, hs, scratch); break;
      default: AttendGroup<4, Rows>(p, kvh, rows, hs, scratch); break;
    }
    count = 0;
  };
  // With spans, a group's rows are in one span (they read the same rows exactly).
  const int64_t span = p->positions != nullptr ? p->kv_span : 0;
  int64_t group_span = -1;
  for (int64_t t = begin / heads; t <= (end - 1) / heads; ++t)
    for (int64_t h = kvh * per_kv; h < (kvh + 1) * per_kv; ++h) {
      if (span > 0) {
        const int64_t at = p->positions[t];
        if (count > 0 && at - at % span != group_span) flush();
        group_span = at - at % span;
      }
      const int64_t task = t * heads + h;
      if (task < begin || task >= end) continue;
      rows[count] = t;
      hs[count++] = h;
      if (count == kGroup) flush();
    }
  flush();
}

// All keys in the inputs (vision encoders) and many of them: per head, the keys
// transposed once per call into scratch ([head_dim][keys], 32-aligned), then tiles of
// kTileRows query rows x 32 keys as outer products (no horizontal sums), the softmax
// per row, and the values summed into 4 rows at a time. Chosen by the problem alone
// (no KV cache, kTransposedMinKeys keys or more), never by the range, so a row's result
// does not depend on how the tasks are split.
constexpr int kTileRows = KILN_UK_ATTENTION_SCRATCH_ROWS;  // 8
constexpr int64_t kTransposedMinKeys = 64;

template <int MR>
void ScoreTile(const float* const* q, const float* kt, int64_t npad, int64_t hd, int64_t j0, __m512 scale,
               float* const* s) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * npad + j0), k1 = _mm512_loadu_ps(kt + d * npad + j0 + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r][d]);
      acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(s[r] + j0, _mm512_mul_ps(acc[r][0], scale));
    _mm512_storeu_ps(s[r] + j0 + 16, _mm512_mul_ps(acc[r][1], scale));
  }
}

// Rows [ra, rb] of head h.
void AttendTransposed(const kiln_uk_attention_params_t* p, int64_t h, int64_t ra, int64_t rb, float* scratch) {
  const int64_t hd = p->head_dim, kvh = h / (p->heads / p->kv_heads);
  const int64_t nall = p->causal ? rb + 1 : p->n_keys;
  const int64_t npad = (nall + 31) / 32 * 32;
  float* kt = scratch;
  float* srows = scratch + hd * npad;
  const float* keys = p->k + kvh * hd;
  // Transpose 16 keys at a time: one gather per head dimension (offsets fit int32:
  // checked by the caller).
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j0 = 0; j0 < npad; j0 += 16) {
    const __mmask16 km = Mask(nall - j0);
    const __m512i idx = _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(j0))),
                                           _mm512_set1_epi32(static_cast<int32_t>(p->ldkv)));
    for (int64_t d = 0; d < hd; ++d)
      _mm512_storeu_ps(kt + d * npad + j0, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), km, idx, keys + d, 4));
  }
  const __m512 scale = _mm512_set1_ps(p->scale);
  for (int64_t r0 = ra; r0 <= rb; r0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, rb + 1 - r0));
    const float* q[kTileRows];
    float* s[kTileRows];
    float* out[kTileRows];
    int64_t n[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t t = r0 + std::min(r, mr - 1);
      q[r] = p->q + t * p->ldq + h * hd;
      s[r] = srows + r * npad;
      out[r] = p->y + t * p->ldy + h * hd;
      n[r] = p->causal ? t + 1 : p->n_keys;
    }
    const int64_t nmax = n[mr - 1];  // rows ascend: the last has the most keys
    for (int64_t j0 = 0; j0 < nmax; j0 += 32) {
      switch (mr) {
        case 1: ScoreTile<1>(q, kt, npad, hd, j0, scale, s); break;
        case 2: ScoreTile<2>(q, kt, npad, hd, j0, scale, s); break;
        case 3: ScoreTile<3>(q, kt, npad, hd, j0, scale, s); break;
        case 4: ScoreTile<4>(q, kt, npad, hd, j0, scale, s); break;
        case 5: ScoreTile<5>(q, kt, npad, hd, j0, scale, s); break;
        case 6: ScoreTile<6>(q, kt, npad, hd, j0, scale, s); break;
        case 7: ScoreTile<7>(q, kt, npad, hd, j0, scale, s); break;
        default: ScoreTile<8>(q, kt, npad, hd, j0, scale, s); break;
      }
    }
    float inv[kTileRows];
    for (int r = 0; r < mr; ++r) inv[r] = Softmax(s[r], n[r], nmax);
    const F32Rows vals(p, false, kvh * hd);
    for (int g0 = 0; g0 < mr; g0 += 4) {
      switch (std::min(4, mr - g0)) {
        case 1: SumValues<1>(vals, hd, nmax, s + g0, inv + g0, out + g0); break;
        case 2: SumValues<2>(vals, hd, nmax, s + g0, inv + g0, out + g0); break;
        case 3: SumValues<3>(vals, hd, nmax, s + g0, inv + g0, out + g0); break;
        default: SumValues<4>(vals, hd, nmax, s + g0, inv + g0, out + g0); break;
      }
    }
  }
}

}  // namespace

extern "C" void kiln_uk_attention_f32_f32_f32_x86_avx512(const kiln_uk_attention_params_t* p, int64_t task_begin,
                                                         int64_t task_end, float* scratch) {
  // Tasks are row * heads + head: the rows of one head in the range are contiguous.
  if (task_begin >= task_end) return;
  const int64_t heads = p->heads, r0 = task_begin / heads, r1 = (task_end - 1) / heads;
  const bool transposed =
      p->positions == nullptr && p->n_keys >= kTransposedMinKeys && (p->n_keys + 16) * p->ldkv <= INT32_MAX;
  if (transposed) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t ra = r0 * heads + h >= task_begin ? r0 : r0 + 1;
      const int64_t rb = r1 * heads + h < task_end ? r1 : r1 - 1;
      if (ra <= rb) AttendTransposed(p, h, ra, rb, scratch);
    }
    return;
  }
  for (int64_t kvh = 0; kvh < p->kv_heads; ++kvh) {
    switch (p->positions != nullptr ? p->kv_encoding : kiln::format::kEncF32) {
      case kiln::format::kEncF16: AttendKvHead<F16Rows>(p, kvh, task_begin, task_end, scratch); break;
      case kiln::format::kEncINT8: AttendKvHead<Int8Rows>(p, kvh, task_begin, task_end, scratch); break;
      case kiln::format::kEncINT4: AttendKvHead<Int4Rows>(p, kvh, task_begin, task_end, scratch); break;
      default: AttendKvHead<F32Rows>(p, kvh, task_begin, task_end, scratch); break;
    }
  }
}

// Whether this kernel reads the encoded cache `p` describes: 16-element chunks of a
// head stay inside one group.
extern "C" int kiln_uk_attention_kv_supported_x86_avx512(const kiln_uk_attention_params_t* p) {
  switch (p->kv_encoding) {
    case kiln::format::kEncF32:
    case kiln::format::kEncF16: return 1;
    case kiln::format::kEncINT8: return p->kv_group % 16 == 0;
    case kiln::format::kEncINT4: return p->kv_group % 32 == 0;
    default: return 0;
  }
}
