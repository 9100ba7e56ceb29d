// AVX-512 micro-kernels of the matmul family (x86-64 with AVX-512 F/BW/VL/VNNI, FMA,
// F16C): y[m, n] = x[m, :] . W[n, :] (+ bias).
//
// Float activations: below 256 rows (decode, short prompts), tiles of 4 activation
// rows x 4 weight rows with the dot products along K in 16 lanes; f32, f16, bf16 and
// fp8 E4M3/E5M2 weights are widened to f32 in registers (fp8 through the f16
// converter, its row scale applied to the dot product), int8/int4 weights decoded a
// tile of rows at a time into scratch (the W8A16/W4A16 path, not the fast one). From
// 256 rows (prefill, vision encoders): outer products against a panel of 32 weight
// rows decoded into scratch.
// Int8 activations (W8A8, W4A8; `quant_rows` below): integer dot products with
// VPDPBUSD. int8 weights: the activations are offset to u8 (x + 128) and 128 * sum(W)
// is subtracted (VPDPBUSD with ones), so the result is the reference's exact integer.
// int4 weights, few rows: the codes are u8 already; the activations of each
// 128-column chunk are stored even columns first, odd second, so the low and high
// nibbles of a 64-byte load multiply them directly; zero points are subtracted per
// 4-byte lane with the lane's activation sum, group scales applied per lane in f32.
// int4 with group 32 and 16+ rows: a lane per group (MatmulInt4Blocked below).
//
// Every output is computed by the same sequence of operations whatever tile or range
// it falls in, so splitting the range across threads gives bit-identical results.
#include <immintrin.h>

#include <algorithm>

#include "kernels/reference/uk/common.h"
#include "kernels/x86/avx512/common.h"

using namespace kiln;

namespace {

constexpr int kMT = 4;   // activation rows per tile
constexpr int kNT = 4;   // weight rows per tile
static_assert(kMT * kNT == 16, "a tile of dot products is reduced by one Reduce16");
constexpr int64_t kNB = 64;  // weight rows per block kept in cache while every activation tile passes
constexpr int64_t kPrefetchTiles = 4;  // decode: tiles of int4 codes and scales prefetched ahead

// out[r * kNT + j] = the sum of acc[r][j]'s lanes, all through Reduce16.
template <int MT, int NT>
inline void ReduceTile(const __m512 (&acc)[MT][NT], float* out) {
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = _mm512_setzero_ps();
  for (int r = 0; r < MT; ++r)
    for (int j = 0; j < NT; ++j) v[r * kNT + j] = acc[r][j];
  _mm512_storeu_ps(out, kiln::x86::Reduce16(v));
}

// Decode streams each weight once: the tiles kPrefetchTiles ahead are prefetched
// (the hardware prefetcher stops at page boundaries). Prefetches do not fault, past
// the end of the weight included.
inline void PrefetchBytes(const uint8_t* p, int64_t n) {
  for (int64_t off = 0; off < n; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

// ---- float activations ----

// 16 weights of a row from element i (masked), widened to f32.
template <int Enc>
inline __m512 LoadW(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (Enc == format::kEncF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (Enc == format::kEncF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i));
  } else if constexpr (Enc == format::kEncBF16) {
    __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  } else if constexpr (Enc == format::kEncFP8_E5M2) {
    // E5M2 is the high byte of an f16.
    __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row + i)), 8);
    return _mm512_cvtph_ps(h);
  } else {
    static_assert(Enc == format::kEncFP8_E4M3);
    // Sign to bit 15, exponent and mantissa to the f16 positions (the exponent then
    // has bias 15 + 8 too few): an f16 that is the value times 2^-8, subnormals
    // included; scaling by 2^8 is exact.
    __m256i b = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, row + i));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7F)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  }
}

template <int Enc>
constexpr int64_t ElementBytes() {
  return Enc == format::kEncF32 ? 4 : (Enc == format::kEncF16 || Enc == format::kEncBF16) ? 2 : 1;
}

// out[r * NT + j] = x[r, :] . w_j for r < MT, j < NT.
template <int Enc, int MT, int NT>
void TileF32(const float* x, int64_t ldx, const uint8_t* const* w, int64_t k, float* out) {
  __m512 acc[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = LoadW<Enc>(w[j], i, 0xFFFF);
    for (int r = 0; r < MT; ++r) {
      __m512 xv = _mm512_loadu_ps(x + r * ldx + i);
      for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  if (i < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = LoadW<Enc>(w[j], i, m);
    for (int r = 0; r < MT; ++r) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + i);
      for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  ReduceTile<MT, NT>(acc, out);
}

template <int Enc, int MT>
void TileF32N(int nt, const float* x, int64_t ldx, const uint8_t* const* w, int64_t k, float* out) {
  switch (nt) {
    case 1: return TileF32<Enc, MT, 1>(x, ldx, w, k, out);
    case 2: return TileF32<Enc, MT, 2>(x, ldx, w, k, out);
    case 3: return TileF32<Enc, MT, 3>(x, ldx, w, k, out);
    default: return TileF32<Enc, MT, 4>(x, ldx, w, k, out);
  }
}

template <int Enc>
void TileF32MN(int mt, int nt, const float* x, int64_t ldx, const uint8_t* const* w, int64_t k, float* out) {
  switch (mt) {
    case 1: return TileF32N<Enc, 1>(nt, x, ldx, w, k, out);
    case 2: return TileF32N<Enc, 2>(nt, x, ldx, w, k, out);
    case 3: return TileF32N<Enc, 3>(nt, x, ldx, w, k, out);
    default: return TileF32N<Enc, 4>(nt, x, ldx, w, k, out);
  }
}

// Writes a tile of results with the bias.
inline void Store(const kiln_uk_matmul_params_t* p, int64_t m0, int mt, int64_t n0, int nt, const float* tile,
                  const float* bias) {
  for (int r = 0; r < mt; ++r) {
    float* y = p->y + (m0 + r) * p->ldy + n0;
    for (int j = 0; j < nt; ++j) y[j] = bias != nullptr ? tile[r * kNT + j] + bias[j] : tile[r * kNT + j];
  }
}

// Weights read in place (float encodings): blocks of kNB rows, every activation tile
// against a block, kNT rows at a time.
template <int Enc>
void MatmulFloatWeights(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end) {
  const int64_t k = p->K, row_bytes = k * ElementBytes<Enc>();
  float tile[kMT * kNT], bias[kNT];
  for (int64_t nb = n_begin; nb < n_end; nb += kNB) {
    const int64_t ne = std::min(n_end, nb + kNB);
    for (int64_t m0 = 0; m0 < p->M; m0 += kMT) {
      const int mt = static_cast<int>(std::min<int64_t>(kMT, p->M - m0));
      for (int64_t n0 = nb; n0 < ne; n0 += kNT) {
        const int nt = static_cast<int>(std::min<int64_t>(kNT, ne - n0));
        if (p->M <= kMT) PrefetchBytes(p->w.data + (n0 + kPrefetchTiles * kNT) * row_bytes, kNT * row_bytes);
        const uint8_t* w[kNT];
        for (int j = 0; j < kNT; ++j) w[j] = p->w.data + (n0 + std::min(j, nt - 1)) * row_bytes;
        TileF32MN<Enc>(mt, nt, p->x + m0 * p->ldx, p->ldx, w, k, tile);
        if constexpr (ElementBytes<Enc>() == 1) {  // fp8: f32 scale per row after the codes
          for (int j = 0; j < nt; ++j) {
            float s;
            std::memcpy(&s, p->w.data + p->w.rows * k + 4 * (n0 + j), 4);
            for (int r = 0; r < mt; ++r) tile[r * kNT + j] *= s;
          }
        }
        if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nt, bias);
        Store(p, m0, mt, n0, nt, tile, p->bias != nullptr ? bias : nullptr);
      }
    }
  }
}

// int8/int4 weights with float activations: kNT rows decoded into scratch, then every
// activation tile against them.
void MatmulDecodedWeights(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end, float* scratch) {
  const int64_t k = p->K;
  float tile[kMT * kNT], bias[kNT];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kNT) {
    const int nt = static_cast<int>(std::min<int64_t>(kNT, n_end - n0));
    const uint8_t* w[kNT];
    for (int j = 0; j < kNT; ++j) {
      float* row = scratch + std::min(j, nt - 1) * k;
      if (j < nt) uk::WeightRow(p->w, n0 + j, scratch + j * k);
      w[j] = reinterpret_cast<const uint8_t*>(row);
    }
    if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nt, bias);
    for (int64_t m0 = 0; m0 < p->M; m0 += kMT) {
      const int mt = static_cast<int>(std::min<int64_t>(kMT, p->M - m0));
      TileF32MN<format::kEncF32>(mt, nt, p->x + m0 * p->ldx, p->ldx, w, k, tile);
      Store(p, m0, mt, n0, nt, tile, p->bias != nullptr ? bias : nullptr);
    }
  }
}

// Many activation rows (prefill, vision encoders): outer products against a packed
// panel of kNR weight rows, [K][kNR] floats decoded from any encoding into scratch
// (decoding costs 1/M of the products). A tile of up to kMR activation rows x kNR
// columns accumulates in 2 * kMR registers, each output lane summing along K in order,
// so no horizontal sums and no dependence on the tile an output falls in.
constexpr int kMR = 8;
constexpr int kNR = 32;
constexpr int64_t kPackedMinRows = 256;  // below, packing costs more than it saves (measured)

// Local accumulators (an output array could alias the float inputs and keep them in
// memory), copied out at the end.
template <int MR>
void PanelTile(const float* x, int64_t ldx, const float* panel, int64_t k, __m512 (&out)[kMR][2]) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m512 w0 = _mm512_loadu_ps(panel + i * kNR), w1 = _mm512_loadu_ps(panel + i * kNR + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * ldx + i]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    out[r][0] = acc[r][0];
    out[r][1] = acc[r][1];
  }
}

void MatmulPacked(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end, float* scratch) {
  const int64_t k = p->K;
  float* panel = scratch;            // [k][kNR]
  float* row = scratch + kNR * k;    // one decoded weight row
  alignas(64) float bias[kNR];
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kNR) {
    const int nr = static_cast<int>(std::min<int64_t>(kNR, n_end - n0));
    for (int j = 0; j < kNR; ++j) {
      if (j >= nr) {
        for (int64_t i = 0; i < k; ++i) panel[i * kNR + j] = 0.0f;
        continue;
      }
      const float* w = uk::WeightRow(p->w, n0 + j, row);
      for (int64_t i = 0; i < k; ++i) panel[i * kNR + j] = w[i];
    }
    for (int j = 0; j < kNR; ++j) bias[j] = 0.0f;
    if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nr, bias);
    const __mmask16 m0 = nr >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : static_cast<__mmask16>((1u << (nr - 16)) - 1);
    const __m512 b0 = _mm512_load_ps(bias), b1 = _mm512_load_ps(bias + 16);
    for (int64_t r0 = 0; r0 < p->M; r0 += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, p->M - r0));
      __m512 acc[kMR][2];
      const float* x = p->x + r0 * p->ldx;
      switch (mr) {
        case 1: PanelTile<1>(x, p->ldx, panel, k, acc); break;
        case 2: PanelTile<2>(x, p->ldx, panel, k, acc); break;
        case 3: PanelTile<3>(x, p->ldx, panel, k, acc); break;
        case 4: PanelTile<4>(x, p->ldx, panel, k, acc); break;
        case 5: PanelTile<5>(x, p->ldx, panel, k, acc); break;
        case 6: PanelTile<6>(x, p->ldx, panel, k, acc); break;
        case 7: PanelTile<7>(x, p->ldx, panel, k, acc); break;
        default: PanelTile<8>(x, p->ldx, panel, k, acc); break;
      }
      for (int r = 0; r < mr; ++r) {
        float* y = p->y + (r0 + r) * p->ldy + n0;
        _mm512_mask_storeu_ps(y, m0, p->bias != nullptr ? _mm512_add_ps(acc[r][0], b0) : acc[r][0]);
        _mm512_mask_storeu_ps(y + 16, m1, p->bias != nullptr ? _mm512_add_ps(acc[r][1], b1) : acc[r][1]);
      }
    }
  }
}

// ---- int8 activations ----

inline int64_t Chunks128(int64_t k) { return (k + 127) / 128; }

// Activation rows prepared for the int4 tile: per 128-column chunk, 64 bytes of the
// even columns then 64 of the odd ones (zero past K), then per chunk 16 int32 lane
// sums (lane l: the 8 activations its 4 low and 4 high nibbles multiply); for a
// symmetric weight the sums times -8, the zero point's share the dot products start
// from.
struct PreparedInt4 {
  const int8_t* x;       // [rows][chunks][128]
  const int32_t* sums;   // [rows][chunks][16]
  int64_t chunks;
};

void PrepareInt4(const kiln_uk_matmul_params_t* p, int64_t m0, int mt, bool symmetric, uint8_t* area,
                 PreparedInt4* out) {
  const int64_t k = p->K, chunks = Chunks128(k);
  int8_t* xp = reinterpret_cast<int8_t*>(area);
  int32_t* sums = reinterpret_cast<int32_t*>(area + mt * chunks * 128);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int r = 0; r < mt; ++r) {
    const int8_t* xq = p->xq + (m0 + r) * p->K;
    for (int64_t c = 0; c < chunks; ++c) {
      int8_t* dst = xp + (r * chunks + c) * 128;
      const int64_t base = c * 128, n = std::min<int64_t>(128, k - base);
      // Even bytes are the low halves of 16-bit words, odd ones the high halves;
      // packing two vectors of them interleaves 128-bit lanes, which the qword
      // permutation puts back in order.
      const __m512i a = _mm512_maskz_loadu_epi8(n >= 64 ? ~0ull : ((1ull << n) - 1), xq + base);
      const __m512i b = n > 64 ? _mm512_maskz_loadu_epi8(n >= 128 ? ~0ull : ((1ull << (n - 64)) - 1), xq + base + 64)
                               : _mm512_setzero_si512();
      const __m512i low = _mm512_set1_epi16(0x00FF);
      const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
      const __m512i e = _mm512_permutexvar_epi64(
          order, _mm512_packus_epi16(_mm512_and_si512(a, low), _mm512_and_si512(b, low)));
      const __m512i o = _mm512_permutexvar_epi64(order, _mm512_packus_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8)));
      _mm512_storeu_si512(dst, e);
      _mm512_storeu_si512(dst + 64, o);
      __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, e), ones, o);
      if (symmetric) s = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 3));
      _mm512_storeu_si512(sums + (r * chunks + c) * 16, s);
    }
  }
  out->x = xp;
  out->sums = sums;
  out->chunks = chunks;
}

// int4 tile. Group size g in {32, 64} or a multiple of 128, K a multiple of 64.
template <int MT, int NT>
void TileInt4(const PreparedInt4& xp, const format::Int4View* v, const int64_t* rows, int64_t k,
              const __m512i& lane_group, float* out) {
  __m512 acc[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const int64_t gpr = static_cast<int64_t>(v->groups_per_row), group = static_cast<int64_t>(v->group);
  for (int64_t c = 0; c < xp.chunks; ++c) {
    const int64_t base = c * 128;
    const int64_t bytes = std::min<int64_t>(64, (k - base) / 2);
    const __mmask64 bm = bytes == 64 ? ~0ull : ((1ull << bytes) - 1);
    const int64_t g0 = base / group;
    const int64_t ng = std::min<int64_t>(4, gpr - g0);
    const __mmask8 gm = static_cast<__mmask8>((1u << ng) - 1);
    __m512i lo[NT], hi[NT], zl[NT];
    __m512 sl[NT];
    for (int j = 0; j < NT; ++j) {
      const uint8_t* codes = v->codes + (rows[j] * k + base) / 2;
      __m512i b = _mm512_maskz_loadu_epi8(bm, codes);
      lo[j] = _mm512_and_si512(b, nib);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(b, 4), nib);
      const int64_t gi = rows[j] * gpr + g0;
      __m128i h = _mm_maskz_loadu_epi16(gm, v->scales + 2 * gi);
      sl[j] = _mm512_permutexvar_ps(lane_group, _mm512_castps256_ps512(_mm256_cvtph_ps(h)));
      if (v->zeros != nullptr) {
        __m128i z = _mm_cvtepu8_epi32(_mm_maskz_loadu_epi8(gm, v->zeros + gi));
        zl[j] = _mm512_permutexvar_epi32(lane_group, _mm512_castsi128_si512(z));
      }
    }
    for (int r = 0; r < MT; ++r) {
      const int8_t* xr = xp.x + (r * xp.chunks + c) * 128;
      const __m512i xe = _mm512_loadu_si512(xr), xo = _mm512_loadu_si512(xr + 64);
      const __m512i xs = _mm512_loadu_si512(xp.sums + (r * xp.chunks + c) * 16);
      for (int j = 0; j < NT; ++j) {
        // Symmetric: the sums start at -8 * (the lane's activation sum); asymmetric:
        // the lane's zero point times it is subtracted.
        __m512i d;
        if (v->zeros == nullptr) {
          d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xs, lo[j], xe), hi[j], xo);
        } else {
          d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], xe), hi[j], xo);
          d = _mm512_sub_epi32(d, _mm512_mullo_epi32(zl[j], xs));
        }
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sl[j], acc[r][j]);
      }
    }
  }
  ReduceTile<MT, NT>(acc, out);
}

// int8 tile: x offset to u8 (+128) in `xu` ([MT][k64]), 128 * row sums subtracted.
template <int MT, int NT>
void TileInt8(const uint8_t* xu, int64_t k64, const int8_t* const* w, int64_t k, int32_t* out) {
  __m512i acc[MT][NT], wsum[NT];
  for (int j = 0; j < NT; ++j) {
    wsum[j] = _mm512_setzero_si512();
    for (int r = 0; r < MT; ++r) acc[r][j] = _mm512_setzero_si512();
  }
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < k; i += 64) {
    const __mmask64 m = k - i >= 64 ? ~0ull : ((1ull << (k - i)) - 1);
    __m512i wv[NT];
    for (int j = 0; j < NT; ++j) {
      wv[j] = _mm512_maskz_loadu_epi8(m, w[j] + i);
      wsum[j] = _mm512_dpbusd_epi32(wsum[j], ones, wv[j]);
    }
    for (int r = 0; r < MT; ++r) {
      const __m512i xv = _mm512_loadu_si512(xu + r * k64 + i);
      for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xv, wv[j]);
    }
  }
  for (int j = 0; j < NT; ++j) {
    const int32_t s = _mm512_reduce_add_epi32(wsum[j]);
    for (int r = 0; r < MT; ++r) out[r * kNT + j] = _mm512_reduce_add_epi32(acc[r][j]) - 128 * s;
  }
}

template <typename F>
void DispatchMN(int mt, int nt, F&& f) {
  auto n = [&](auto m) {
    switch (nt) {
      case 1: return f(m, std::integral_constant<int, 1>());
      case 2: return f(m, std::integral_constant<int, 2>());
      case 3: return f(m, std::integral_constant<int, 3>());
      default: return f(m, std::integral_constant<int, 4>());
    }
  };
  switch (mt) {
    case 1: return n(std::integral_constant<int, 1>());
    case 2: return n(std::integral_constant<int, 2>());
    case 3: return n(std::integral_constant<int, 3>());
    default: return n(std::integral_constant<int, 4>());
  }
}

bool Int4Vectorised(const kiln_uk_weight_t& w) {
  return w.cols % 64 == 0 && (w.group == 32 || w.group == 64 || (w.group % 128 == 0 && w.group > 0));
}

void MatmulInt4(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end, float* scratch) {
  const int64_t k = p->K;
  const format::Int4View v = format::Int4View::Of(uk::SpecOf(p->w), p->w.data, static_cast<uint64_t>(p->w.rows),
                                                  static_cast<uint64_t>(k));
  // Lane l of a chunk covers columns 8l .. 8l + 7: its group within the chunk.
  alignas(64) int32_t idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = p->w.group >= 128 ? 0 : (8 * l) / static_cast<int>(p->w.group);
  const __m512i lane_group = _mm512_load_si512(idx);
  float tile[kMT * kNT], bias[kNT];
  PreparedInt4 xp;
  // Every activation row in one tile (decode): one block, the rows prepared once.
  const int64_t block = p->M <= kMT ? n_end - n_begin : kNB;
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t ne = std::min(n_end, nb + block);
    for (int64_t m0 = 0; m0 < p->M; m0 += kMT) {
      const int mt = static_cast<int>(std::min<int64_t>(kMT, p->M - m0));
      PrepareInt4(p, m0, mt, p->w.symmetric != 0, reinterpret_cast<uint8_t*>(scratch), &xp);
      for (int64_t n0 = nb; n0 < ne; n0 += kNT) {
        const int nt = static_cast<int>(std::min<int64_t>(kNT, ne - n0));
        if (p->M <= kMT) {
          const int64_t ahead = n0 + kPrefetchTiles * kNT;
          PrefetchBytes(v.codes + (ahead * k) / 2, kNT * k / 2);
          PrefetchBytes(v.scales + 2 * ahead * static_cast<int64_t>(v.groups_per_row),
                        2 * kNT * static_cast<int64_t>(v.groups_per_row));
        }
        int64_t rows[kNT];
        for (int j = 0; j < kNT; ++j) rows[j] = n0 + std::min(j, nt - 1);  // j >= nt: unused
        DispatchMN(mt, nt, [&](auto M, auto N) { TileInt4<M(), N()>(xp, &v, rows, k, lane_group, tile); });
        if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nt, bias);
        for (int r = 0; r < mt; ++r) {
          float* y = p->y + (m0 + r) * p->ldy + n0;
          const float sx = p->xs[m0 + r];
          for (int j = 0; j < nt; ++j) {
            float val = tile[r * kNT + j] * sx;
            y[j] = p->bias != nullptr ? val + bias[j] : val;
          }
        }
      }
    }
  }
}

// int4 with group size 32 and many activation rows (prefill): one zmm lane per group.
// Per block of 16 groups, weight rows are repacked into scratch as 4 steps of a
// 64-byte low-nibble and a 64-byte high-nibble vector (lane l: 4 codes of group l,
// so nibbles are unpacked once per call, not once per activation tile), activation
// rows likewise (the even and the odd columns each code byte multiplies) with each
// group's sum. A lane's integer dot product is then its whole group's, exact, started
// from -8 x the group's activation sum (symmetric) or with zero point x sum
// subtracted; one conversion and one multiply-add by the 16 group scales per block.
// The repacking costs 1/kMB4 of the products; below kInt4BlockedMinRows rows the
// chunked kernel above (no repacking) runs.
constexpr int kMT4 = 4;               // activation rows per tile
constexpr int kNT4 = 2;               // weight rows per tile
constexpr int64_t kMB4 = 64;          // activation rows prepared per block
constexpr int64_t kInt4BlockedMinRows = 16;
constexpr int64_t kXBlockBytes = 4 * 128 + 64;  // per row and block: 4 x (even, odd) + 16 int32 sums
constexpr int64_t kWBlockBytes = 4 * 128;       // per row and block: 4 x (low, high)

inline int64_t Blocks16(int64_t groups) { return (groups + 15) / 16; }

void PrepareInt4Blocked(const kiln_uk_matmul_params_t* p, int64_t m0, int64_t mb, bool symmetric, uint8_t* area) {
  const int64_t k = p->K, groups = k / 32, blocks = Blocks16(groups);
  for (int64_t r = 0; r < mb; ++r) {
    const int8_t* xq = p->xq + (m0 + r) * k;
    for (int64_t bi = 0; bi < blocks; ++bi) {
      int8_t* dst = reinterpret_cast<int8_t*>(area + (r * blocks + bi) * kXBlockBytes);
      int32_t* sums = reinterpret_cast<int32_t*>(dst + 4 * 128);
      for (int l = 0; l < 16; ++l) {
        const int64_t g = 16 * bi + l;
        int32_t sum = 0;
        for (int t = 0; t < 4; ++t)
          for (int e = 0; e < 4; ++e) {
            const int8_t xe = g < groups ? xq[g * 32 + 8 * t + 2 * e] : 0;
            const int8_t xo = g < groups ? xq[g * 32 + 8 * t + 2 * e + 1] : 0;
            dst[t * 128 + l * 4 + e] = xe;
            dst[t * 128 + 64 + l * 4 + e] = xo;
            sum += xe + xo;
          }
        sums[l] = symmetric ? -8 * sum : sum;
      }
    }
  }
}

// Low and high nibbles of weight row `n` in the per-lane-group order.
void PackInt4Row(const format::Int4View& v, int64_t n, int64_t k, uint8_t* dst) {
  const int64_t groups = k / 32, blocks = Blocks16(groups);
  const uint8_t* codes = v.codes + n * k / 2;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    // 16 groups x 16 bytes, as dwords [group][4]: transposed to [step][group].
    const int64_t bytes = std::min<int64_t>(256, (groups - 16 * bi) * 16);
    alignas(64) uint32_t src[64] = {};
    std::memcpy(src, codes + bi * 256, static_cast<size_t>(bytes));
    for (int t = 0; t < 4; ++t) {
      const __m512i idx = _mm512_setr_epi32(t, 4 + t, 8 + t, 12 + t, 16 + t, 20 + t, 24 + t, 28 + t, 32 + t, 36 + t,
                                            40 + t, 44 + t, 48 + t, 52 + t, 56 + t, 60 + t);
      const __m512i lo = _mm512_load_si512(src), hi = _mm512_load_si512(src + 16);
      const __m512i lo2 = _mm512_load_si512(src + 32), hi2 = _mm512_load_si512(src + 48);
      // Dwords t, 4 + t, ...: the first 8 from src[0..31], the last 8 from src[32..63].
      const __m512i a = _mm512_permutex2var_epi32(lo, idx, hi);
      const __m512i idx2 = _mm512_sub_epi32(idx, _mm512_set1_epi32(32));
      const __m512i b = _mm512_permutex2var_epi32(lo2, idx2, hi2);
      const __m512i d = _mm512_mask_blend_epi32(0xFF00, a, b);
      uint8_t* out = dst + bi * kWBlockBytes + t * 128;
      _mm512_storeu_si512(out, _mm512_and_si512(d, nib));
      _mm512_storeu_si512(out + 64, _mm512_and_si512(_mm512_srli_epi16(d, 4), nib));
    }
  }
}

template <int MT, int NT>
void TileInt4Blocked(const uint8_t* xb, int64_t blocks, const uint8_t* const* wb, const format::Int4View& v,
                     const int64_t* rows, float* out) {
  __m512 accf[MT][NT];
  for (int r = 0; r < MT; ++r)
    for (int j = 0; j < NT; ++j) accf[r][j] = _mm512_setzero_ps();
  const int64_t gpr = static_cast<int64_t>(v.groups_per_row);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const int64_t ng = std::min<int64_t>(16, gpr - 16 * bi);
    const __mmask16 gm = ng >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << ng) - 1);
    __m512 sv[NT];
    __m512i zv[NT];
    for (int j = 0; j < NT; ++j) {
      const int64_t gi = rows[j] * gpr + 16 * bi;
      sv[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(gm, v.scales + 2 * gi));
      if (v.zeros != nullptr) zv[j] = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(gm, v.zeros + gi));
    }
    __m512i acc[MT][NT];
    for (int r = 0; r < MT; ++r) {
      const __m512i sums = _mm512_loadu_si512(xb + (r * blocks + bi) * kXBlockBytes + 4 * 128);
      for (int j = 0; j < NT; ++j) acc[r][j] = v.zeros == nullptr ? sums : _mm512_setzero_si512();
    }
    for (int t = 0; t < 4; ++t) {
      __m512i wl[NT], wh[NT];
      for (int j = 0; j < NT; ++j) {
        wl[j] = _mm512_loadu_si512(wb[j] + bi * kWBlockBytes + t * 128);
        wh[j] = _mm512_loadu_si512(wb[j] + bi * kWBlockBytes + t * 128 + 64);
      }
      for (int r = 0; r < MT; ++r) {
        const uint8_t* x = xb + (r * blocks + bi) * kXBlockBytes + t * 128;
        const __m512i xe = _mm512_loadu_si512(x), xo = _mm512_loadu_si512(x + 64);
        for (int j = 0; j < NT; ++j) acc[r][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r][j], wl[j], xe), wh[j], xo);
      }
    }
    for (int r = 0; r < MT; ++r) {
      __m512i sums;
      if (v.zeros != nullptr) sums = _mm512_loadu_si512(xb + (r * blocks + bi) * kXBlockBytes + 4 * 128);
      for (int j = 0; j < NT; ++j) {
        __m512i d = acc[r][j];
        if (v.zeros != nullptr) d = _mm512_sub_epi32(d, _mm512_mullo_epi32(zv[j], sums));
        accf[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sv[j], accf[r][j]);
      }
    }
  }
  ReduceTile<MT, NT>(accf, out);
}

void MatmulInt4Blocked(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end, float* scratch) {
  const int64_t k = p->K, blocks = Blocks16(k / 32);
  const format::Int4View v = format::Int4View::Of(uk::SpecOf(p->w), p->w.data, static_cast<uint64_t>(p->w.rows),
                                                  static_cast<uint64_t>(k));
  uint8_t* xb = reinterpret_cast<uint8_t*>(scratch);
  uint8_t* wbuf = xb + kMB4 * blocks * kXBlockBytes;
  float tile[kMT * kNT], bias[kNT4];
  for (int64_t mb0 = 0; mb0 < p->M; mb0 += kMB4) {
    const int64_t mb = std::min<int64_t>(kMB4, p->M - mb0);
    PrepareInt4Blocked(p, mb0, mb, p->w.symmetric != 0, xb);
    for (int64_t n0 = n_begin; n0 < n_end; n0 += kNT4) {
      const int nt = static_cast<int>(std::min<int64_t>(kNT4, n_end - n0));
      const uint8_t* wb[kNT4];
      int64_t rows[kNT4];
      for (int j = 0; j < kNT4; ++j) {
        rows[j] = n0 + std::min(j, nt - 1);
        wb[j] = wbuf + std::min(j, nt - 1) * blocks * kWBlockBytes;
        if (j < nt) PackInt4Row(v, n0 + j, k, wbuf + j * blocks * kWBlockBytes);
      }
      if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nt, bias);
      for (int64_t m0 = 0; m0 < mb; m0 += kMT4) {
        const int mt = static_cast<int>(std::min<int64_t>(kMT4, mb - m0));
        const uint8_t* x = xb + m0 * blocks * kXBlockBytes;
        DispatchMN(mt, nt, [&](auto M, auto N) {
          if constexpr (N() <= kNT4) TileInt4Blocked<M(), N()>(x, blocks, wb, v, rows, tile);
        });
        for (int r = 0; r < mt; ++r) {
          float* y = p->y + (mb0 + m0 + r) * p->ldy + n0;
          const float sx = p->xs[mb0 + m0 + r];
          for (int j = 0; j < nt; ++j) {
            const float val = tile[r * kNT + j] * sx;
            y[j] = p->bias != nullptr ? val + bias[j] : val;
          }
        }
      }
    }
  }
}

void MatmulInt8(const kiln_uk_matmul_params_t* p, int64_t n_begin, int64_t n_end, float* scratch) {
  const int64_t k = p->K, k64 = (k + 63) / 64 * 64, n_rows = p->w.rows;
  const int8_t* codes = reinterpret_cast<const int8_t*>(p->w.data);
  const uint8_t* scale_bytes = p->w.data + n_rows * k;
  uint8_t* xu = reinterpret_cast<uint8_t*>(scratch);
  int32_t tile[kMT * kNT];
  float bias[kNT];
  const int64_t block = p->M <= kMT ? n_end - n_begin : kNB;
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t ne = std::min(n_end, nb + block);
    for (int64_t m0 = 0; m0 < p->M; m0 += kMT) {
      const int mt = static_cast<int>(std::min<int64_t>(kMT, p->M - m0));
      for (int r = 0; r < mt; ++r) {
        const int8_t* xq = p->xq + (m0 + r) * k;
        for (int64_t i = 0; i < k64; ++i)
          xu[r * k64 + i] = i < k ? static_cast<uint8_t>(static_cast<int32_t>(xq[i]) + 128) : 0;
      }
      for (int64_t n0 = nb; n0 < ne; n0 += kNT) {
        const int nt = static_cast<int>(std::min<int64_t>(kNT, ne - n0));
        if (p->M <= kMT) PrefetchBytes(p->w.data + (n0 + kPrefetchTiles * kNT) * k, kNT * k);
        const int8_t* w[kNT];
        for (int j = 0; j < kNT; ++j) w[j] = codes + (n0 + std::min(j, nt - 1)) * k;
        DispatchMN(mt, nt, [&](auto M, auto N) { TileInt8<M(), N()>(xu, k64, w, k, tile); });
        if (p->bias != nullptr) uk::DecodeElements(*p->bias, n0, nt, bias);
        for (int r = 0; r < mt; ++r) {
          float* y = p->y + (m0 + r) * p->ldy + n0;
          const float sx = p->xs[m0 + r];
          for (int j = 0; j < nt; ++j) {
            float sw;
            std::memcpy(&sw, scale_bytes + 4 * (n0 + j), 4);
            float val = static_cast<float>(tile[r * kNT + j]) * sx * sw;
            y[j] = p->bias != nullptr ? val + bias[j] : val;
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" {

size_t kiln_uk_matmul_scratch_x86_avx512(int64_t K) {
  // Float path: kNT decoded rows. int8 path: kMT rows of K (rounded to 64) bytes.
  // int4 path: kMT rows of 128 bytes and 16 int32 per 128-column chunk.
  const int64_t chunks = (K + 127) / 128;
  const int64_t int4_floats = (kMT * chunks * (128 + 64)) / 4;
  // Packed path: a [K][kNR] panel and one decoded row. Blocked int4 (group 32):
  // kMB4 prepared activation rows and kNT4 repacked weight rows.
  const int64_t blocks = Blocks16(K / 32);
  const int64_t int4_blocked_floats = (blocks * (kMB4 * kXBlockBytes + kNT4 * kWBlockBytes)) / 4;
  return static_cast<size_t>(std::max<int64_t>(std::max<int64_t>((kNR + 1) * K, int4_floats), int4_blocked_floats) +
                             16);
}

void kiln_uk_matmul_bias_f32_f32_wany_4x4_x86_avx512(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                     int64_t n_end, float* scratch) {
  if (p->M >= kPackedMinRows) return MatmulPacked(p, n_begin, n_end, scratch);
  switch (p->w.encoding) {
    case format::kEncF32: return MatmulFloatWeights<format::kEncF32>(p, n_begin, n_end);
    case format::kEncF16: return MatmulFloatWeights<format::kEncF16>(p, n_begin, n_end);
    case format::kEncBF16: return MatmulFloatWeights<format::kEncBF16>(p, n_begin, n_end);
    case format::kEncFP8_E4M3: return MatmulFloatWeights<format::kEncFP8_E4M3>(p, n_begin, n_end);
    case format::kEncFP8_E5M2: return MatmulFloatWeights<format::kEncFP8_E5M2>(p, n_begin, n_end);
    default: return MatmulDecodedWeights(p, n_begin, n_end, scratch);
  }
}

void kiln_uk_matmul_bias_f32_qai8dx_wq_4x4_x86_avx512vnni(const kiln_uk_matmul_params_t* p, int64_t n_begin,
                                                          int64_t n_end, float* scratch) {
  if (p->w.encoding == format::kEncINT8) return MatmulInt8(p, n_begin, n_end, scratch);
  // Blocks of 16 groups: worth it when at most an eighth of the lanes idle in the last one.
  const int64_t groups = p->w.group == 32 ? p->K / 32 : 0;
  if (groups > 0 && p->M >= kInt4BlockedMinRows && (Blocks16(groups) * 16 - groups) * 8 <= Blocks16(groups) * 16)
    return MatmulInt4Blocked(p, n_begin, n_end, scratch);
  if (Int4Vectorised(p->w)) return MatmulInt4(p, n_begin, n_end, scratch);
  // Group sizes the tile does not cover (not a multiple of 32 lanes' worth of
  // columns) take the reference path.
  kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(p, n_begin, n_end, scratch);
}

void kiln_uk_lhs_quant_qai8dx_f32_x86_avx512(const kiln_uk_quant_rows_params_t* p, int64_t row_begin,
                                             int64_t row_end) {
  // The reference's arithmetic (absmax / 127, then rint(x / s) clamped), 16 lanes at a
  // time: the same codes and scales bit for bit.
  const int64_t k = p->K;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = p->x + r * p->ldx;
    __m512 mx = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 m = k - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
      mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, xr + i)));
    }
    const float absmax = _mm512_reduce_max_ps(mx);
    const float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
    p->s[r] = s;
    const __m512 sv = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    int8_t* q = p->q + r * k;
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 m = k - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
      __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, xr + i), sv);
      v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
      _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
  }
}

}  // extern "C"
