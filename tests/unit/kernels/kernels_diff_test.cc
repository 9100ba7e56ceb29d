// The differential kernel test (ggml's test-backend-ops idea): every kernel of the
// runtime's table, for every weight encoding it accepts and a set of shapes with odd
// sizes, against an oracle, with a normalised mean squared error bound per encoding.
//
// The oracle is the textbook computation in double precision on the dequantised
// weights (and, for int8 activations, the dequantised activations): what a kernel
// computes, independent of how it tiles, orders or vectorises. Every kernel is also
// run with its tile range split at random points (as the thread pool splits it for
// 1 to 4 threads) and must give bit-identical results to the unsplit run.
//
// Generated kernels register in the same table and are held to the same bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "formats/encoding.h"
#include "formats/kiln_format.h"
#include "formats/kv_codec.h"
#include "kernels/kernel.h"
#include "platform/platform.h"

namespace {

using kiln::format::EncodingSpec;

// Squared error over the squared reference (plus `floor`, a scale below which the
// reference's own magnitude is not a fair yardstick).
double Nmse(const std::vector<float>& got, const std::vector<double>& want, double floor = 0) {
  double err = 0, ref = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = static_cast<double>(got[i]) - want[i];
    err += d * d;
    ref += want[i] * want[i];
  }
  return ref > 0 ? err / ref : err;
}

// NMSE bound per encoding against the double-precision oracle on dequantised values:
// what remains is f32 accumulation error.
double Bound(uint8_t encoding) { return encoding == kiln::format::kEncF32 ? 1e-10 : 1e-9; }

// Random [rows, cols] values, stored in `spec` (quantised with a simple
// round-to-nearest here: the test needs valid bytes, not a good quantiser).
std::vector<uint8_t> RandomWeight(const EncodingSpec& spec, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = dist(rng);
  std::vector<uint8_t> out(kiln::format::StorageBytes(spec, rows, cols));
  if (!kiln::format::IsQuantized(spec.id)) {
    kiln::format::EncodeFloatElements(spec.id, v.data(), v.size(), out.data());
    return out;
  }
  const uint64_t n = static_cast<uint64_t>(rows * cols);
  std::uniform_int_distribution<int> byte(0, 255);
  if (spec.id == kiln::format::kEncINT4) {
    for (uint64_t i = 0; i < n / 2; ++i) out[i] = static_cast<uint8_t>(byte(rng));
    const uint64_t groups = rows * (cols / spec.group);
    for (uint64_t g = 0; g < groups; ++g) {
      uint16_t h = kiln::numeric::F32ToF16(0.01f + 0.1f * std::fabs(dist(rng)));
      std::memcpy(out.data() + kiln::format::Int4ScalesOffset(rows, cols) + 2 * g, &h, 2);
      if (!spec.symmetric) out[kiln::format::Int4ZerosOffset(rows, cols, spec.group) + g] = byte(rng) % 16;
    }
    return out;
  }
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t c = static_cast<uint8_t>(byte(rng));
    if (spec.id != kiln::format::kEncINT8) c &= 0xF7;  // fp8: stay away from NaN/Inf codes
    out[i] = c;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.01f + 0.1f * std::fabs(dist(rng));
    std::memcpy(out.data() + n + 4 * r, &s, 4);
  }
  return out;
}

std::vector<float> Decode(const EncodingSpec& spec, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) kiln::format::DecodeRow(spec, bytes.data(), rows, cols, r, w.data() + r * cols);
  return w;
}

// Splits [0, n) at random points into up to `pieces` ranges.
std::vector<std::pair<int64_t, int64_t>> Split(int64_t n, int pieces, std::mt19937& rng) {
  std::set<int64_t> cuts = {0, n};
  std::uniform_int_distribution<int64_t> at(0, n);
  for (int i = 1; i < pieces; ++i) cuts.insert(at(rng));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) out.push_back({*it, *std::next(it)});
  return out;
}

// The distinct micro-kernel sets of the kernel table, with the weight encodings the
// matmul-family kernels of each accept.
struct SetUnderTest {
  const kiln::rt::UkernelSet* uk;
  std::string name;
  uint32_t matmul_encodings = 0;
};

std::vector<SetUnderTest> Sets() {
  std::vector<SetUnderTest> out;
  size_t n;
  const kiln::rt::KernelEntry* k = kiln::rt::AllKernels(&n);
  const uint64_t cpu = kiln::rt::DetectCpuFeatures();
  for (size_t i = 0; i < n; ++i) {
    // Kernels of another architecture (not built) or needing features this CPU lacks.
    if (k[i].uk == nullptr || (k[i].cpu_features & ~cpu) != 0) continue;
    SetUnderTest* s = nullptr;
    for (SetUnderTest& o : out)
      if (o.uk == k[i].uk) s = &o;
    if (s == nullptr) {
      out.push_back({k[i].uk, k[i].name, 0});
      s = &out.back();
    }
    if (k[i].op_kind == kiln::fb::OpKind::Linear) s->matmul_encodings |= k[i].encodings;
  }
  return out;
}

struct MatmulShape {
  int64_t m, n, k;
};

TEST(KernelsDiff, MatmulEveryEncodingAndShape) {
  std::mt19937 rng(1234);
  // Few rows (decode) and many (prefill, vision encoders: kernels may switch to a
  // packed-panel path there), odd sizes, long K.
  const std::vector<MatmulShape> float_shapes = {{1, 1, 1},   {1, 3, 17},    {3, 17, 63},    {17, 63, 3},
                                                 {1, 17, 4097}, {5, 33, 64}, {20, 70, 300}, {300, 33, 200}};
  const std::vector<MatmulShape> int4_shapes = {{1, 1, 128}, {1, 3, 256}, {3, 17, 128}, {17, 63, 384},
                                                {1, 5, 4096}, {40, 17, 256}, {70, 9, 1024}};
  int cases = 0;
  for (const SetUnderTest& set : Sets()) {
    for (uint8_t enc = 0; enc < kiln::format::kNumEncodings; ++enc) {
      if ((set.matmul_encodings & kiln::format::EncodingBit(enc)) == 0) continue;
      const bool int4 = enc == kiln::format::kEncINT4;
      for (uint32_t group : int4 ? std::vector<uint32_t>{32, 64, 128} : std::vector<uint32_t>{0})
        for (bool symmetric : int4 ? std::vector<bool>{true, false} : std::vector<bool>{true})
          for (bool act8 : (int4 || enc == kiln::format::kEncINT8) ? std::vector<bool>{false, true}
                                                                    : std::vector<bool>{false})
            for (bool bias : {false, true})
              for (const MatmulShape& sh : int4 ? int4_shapes : float_shapes) {
                if (int4 && sh.k % group != 0) continue;
                EncodingSpec spec{enc, group, symmetric};
                SCOPED_TRACE(set.name + " " + kiln::format::EncodingName(enc) + " g" + std::to_string(group) +
                             (symmetric ? "" : " asym") + (act8 ? " a8" : "") + (bias ? " bias" : "") + " M=" +
                             std::to_string(sh.m) + " N=" + std::to_string(sh.n) + " K=" + std::to_string(sh.k));
                std::vector<uint8_t> wbytes = RandomWeight(spec, sh.n, sh.k, rng);
                std::vector<float> w = Decode(spec, wbytes, sh.n, sh.k);
                std::normal_distribution<float> dist(0.0f, 1.0f);
                std::vector<float> x(sh.m * sh.k), b(sh.n);
                for (float& v : x) v = dist(rng);
                for (float& v : b) v = dist(rng);

                kiln_uk_matmul_params_t p = {};
                p.x = x.data();
                p.ldx = sh.k;
                p.M = sh.m;
                p.N = sh.n;
                p.K = sh.k;
                p.w = {wbytes.data(), sh.n, sh.k, enc, static_cast<uint8_t>(symmetric), static_cast<uint8_t>(act8), 0,
                       group};
                kiln_uk_weight_t bw = {reinterpret_cast<const uint8_t*>(b.data()), sh.n, 1, kiln::format::kEncF32,
                                       1, 0, 0, 0};
                if (bias) p.bias = &bw;
                std::vector<int8_t> xq(sh.m * sh.k);
                std::vector<float> xs(sh.m);
                std::vector<float> xin = x;  // what the oracle multiplies
                if (act8) {
                  kiln_uk_quant_rows_params_t q = {x.data(), sh.k, sh.k, xq.data(), xs.data()};
                  for (auto [b0, b1] : Split(sh.m, 3, rng)) set.uk->quant_rows(&q, b0, b1);
                  for (int64_t i = 0; i < sh.m * sh.k; ++i) xin[i] = xq[i] * xs[i / sh.k];
                  p.xq = xq.data();
                  p.xs = xs.data();
                }
                std::vector<double> want(sh.m * sh.n);
                // The scale of rounding error: sum over outputs of (sum |x w|)^2 / K, so that
                // an output whose terms cancel does not demand more than f32 can give.
                double term_scale = 0;
                for (int64_t r = 0; r < sh.m; ++r)
                  for (int64_t j = 0; j < sh.n; ++j) {
                    double acc = bias ? b[j] : 0.0, mag = bias ? std::fabs(b[j]) : 0.0;
                    for (int64_t i = 0; i < sh.k; ++i) {
                      const double t = static_cast<double>(xin[r * sh.k + i]) * static_cast<double>(w[j * sh.k + i]);
                      acc += t;
                      mag += std::fabs(t);
                    }
                    want[r * sh.n + j] = acc;
                    term_scale += mag * mag / static_cast<double>(sh.k);
                  }
                kiln_uk_matmul_fn fn = act8 ? set.uk->matmul_a8 : set.uk->matmul_f32;
                ASSERT_NE(fn, nullptr);
                std::vector<float> scratch(set.uk->matmul_scratch(sh.k));
                std::vector<float> whole(sh.m * sh.n), split(sh.m * sh.n);
                p.y = whole.data();
                p.ldy = sh.n;
                fn(&p, 0, sh.n, scratch.data());
                EXPECT_LT(Nmse(whole, want, term_scale), Bound(enc));
                p.y = split.data();
                for (int threads = 2; threads <= 4; ++threads) {
                  std::fill(split.begin(), split.end(), 0.0f);
                  for (auto [n0, n1] : Split(sh.n, threads, rng)) fn(&p, n0, n1, scratch.data());
                  ASSERT_EQ(std::memcmp(split.data(), whole.data(), whole.size() * 4), 0) << threads << " tiles";
                }
                ++cases;
              }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(KernelsDiff, NormsActivationsRopeAttentionGather) {
  std::mt19937 rng(99);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const SetUnderTest& set : Sets()) {
    SCOPED_TRACE(set.name);
    for (int64_t cols : {1, 3, 17, 63, 4097}) {
      const int64_t rows = 5;
      std::vector<float> x(rows * cols), w(cols), b(cols), y(rows * cols), scratch(2 * cols);
      for (float& v : x) v = dist(rng);
      for (float& v : w) v = dist(rng);
      for (float& v : b) v = dist(rng);
      kiln_uk_weight_t ww = {reinterpret_cast<const uint8_t*>(w.data()), cols, 1, kiln::format::kEncF32, 1, 0, 0, 0};
      kiln_uk_weight_t bw = {reinterpret_cast<const uint8_t*>(b.data()), cols, 1, kiln::format::kEncF32, 1, 0, 0, 0};
      kiln_uk_norm_params_t p = {x.data(), y.data(), cols, 1e-5f, ww, bw};
      // RMS norm.
      for (auto [r0, r1] : Split(rows, 3, rng)) set.uk->rms_norm(&p, r0, r1, scratch.data());
      std::vector<double> want(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < cols; ++i) ss += double(x[r * cols + i]) * x[r * cols + i];
        double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
        for (int64_t i = 0; i < cols; ++i) want[r * cols + i] = x[r * cols + i] * inv * w[i];
      }
      EXPECT_LT(Nmse(y, want), 1e-10) << "rms_norm cols=" << cols;
      // Layer norm.
      for (auto [r0, r1] : Split(rows, 3, rng)) set.uk->layer_norm(&p, r0, r1, scratch.data());
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < cols; ++i) mean += x[r * cols + i];
        mean /= cols;
        for (int64_t i = 0; i < cols; ++i) var += (x[r * cols + i] - mean) * (x[r * cols + i] - mean);
        double inv = 1.0 / std::sqrt(var / cols + 1e-5);
        for (int64_t i = 0; i < cols; ++i) want[r * cols + i] = (x[r * cols + i] - mean) * inv * w[i] + b[i];
      }
      if (cols > 1) EXPECT_LT(Nmse(y, want), 1e-10) << "layer_norm cols=" << cols;
      // Element-wise: add, mul, activations (SiLU shown; all kinds through gated).
      std::vector<float> z(rows * cols);
      for (float& v : z) v = dist(rng);
      kiln_uk_eltwise_params_t e = {x.data(), z.data(), y.data(), KILN_UK_SILU};
      for (auto [b0, b1] : Split(rows * cols, 4, rng)) set.uk->add(&e, b0, b1);
      for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(y[i], x[i] + z[i]);
      for (auto [b0, b1] : Split(rows * cols, 4, rng)) set.uk->mul(&e, b0, b1);
      for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(y[i], x[i] * z[i]);
      // Inputs over a wider range than N(0, 1): the activations' tails and saturation.
      for (int64_t i = 0; i < rows * cols; i += 3) x[i] *= 6.0f;
      std::vector<double> plain(rows * cols);
      for (int32_t kind = KILN_UK_SILU; kind <= KILN_UK_RELU; ++kind) {
        e.activation = kind;
        for (auto [b0, b1] : Split(rows * cols, 4, rng)) set.uk->gated_act(&e, b0, b1);
        for (int64_t i = 0; i < rows * cols; ++i) {
          double v = x[i], a;
          switch (kind) {
            case KILN_UK_SILU: a = v / (1 + std::exp(-v)); break;
            case KILN_UK_GELU: a = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); break;
            case KILN_UK_GELU_TANH: a = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); break;
            case KILN_UK_QUICK_GELU: a = v / (1 + std::exp(-1.702 * v)); break;
            default: a = v > 0 ? v : 0; break;
          }
          want[i] = a * z[i];
          plain[i] = a;
        }
        EXPECT_LT(Nmse(y, want), 1e-12) << "gated activation " << kind;
        for (auto [b0, b1] : Split(rows * cols, 4, rng)) set.uk->act(&e, b0, b1);
        EXPECT_LT(Nmse(y, plain), 1e-12) << "activation " << kind;
      }
    }
    // Attention: causal within the inputs, over positions (KV cache), and full (vision
    // encoders); GQA; head sizes with and without a vector tail. The range split as
    // for 2 to 4 threads gives the unsplit result bit for bit.
    for (int64_t t : {1, 3, 17, 40, 70})
    for (int64_t hd : {8, 64, 72, 96}) {
      const int64_t heads = 4, kv_heads = 2;
      std::vector<float> q(t * heads * hd), k(t * kv_heads * hd), v(t * kv_heads * hd), y(t * heads * hd),
          whole(y.size()), scratch(KILN_UK_ATTENTION_SCRATCH(t, hd, 0));
      for (float& a : q) a = dist(rng);
      for (float& a : k) a = dist(rng);
      for (float& a : v) a = dist(rng);
      std::vector<int32_t> pos(t);
      for (int64_t i = 0; i < t; ++i) pos[i] = static_cast<int32_t>(i);
      for (int mode : {0, 1, 2}) {  // causal, positions, full
        const bool positions = mode == 1, causal = mode == 0;
        kiln_uk_attention_params_t p = {q.data(), heads * hd, k.data(), v.data(), kv_heads * hd, whole.data(),
                                        heads * hd, heads, kv_heads, hd, t, 0.35f, causal ? 1 : 0,
                                        positions ? pos.data() : nullptr, 0, 0, nullptr, nullptr, nullptr, nullptr,
                                        nullptr, 0, 0, 0, nullptr, nullptr};
        set.uk->attention(&p, 0, t * heads, scratch.data());
        p.y = y.data();
        for (int threads = 2; threads <= 4; ++threads) {
          std::fill(y.begin(), y.end(), 0.0f);
          for (auto [b0, b1] : Split(t * heads, threads, rng)) set.uk->attention(&p, b0, b1, scratch.data());
          ASSERT_EQ(std::memcmp(y.data(), whole.data(), y.size() * 4), 0) << "attention split, t=" << t << " hd=" << hd;
        }
        std::vector<double> want(y.size());
        for (int64_t r = 0; r < t; ++r)
          for (int64_t h = 0; h < heads; ++h) {
            int64_t g = h / (heads / kv_heads);
            const int64_t n = mode == 2 ? t : r + 1;
            std::vector<double> s(n);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < n; ++j) {
              double d = 0;
              for (int64_t i = 0; i < hd; ++i) d += double(q[r * heads * hd + h * hd + i]) * k[j * kv_heads * hd + g * hd + i];
              s[j] = d * 0.35f;
              mx = std::max(mx, s[j]);
            }
            for (double& a : s) sum += (a = std::exp(a - mx));
            for (int64_t i = 0; i < hd; ++i) {
              double acc = 0;
              for (int64_t j = 0; j < n; ++j) acc += s[j] / sum * v[j * kv_heads * hd + g * hd + i];
              want[r * heads * hd + h * hd + i] = acc;
            }
          }
        EXPECT_LT(Nmse(y, want), 1e-10) << "attention t=" << t << " hd=" << hd << " mode=" << mode;
      }
      // Over an encoded KV cache (f16, int8, int4; formats/kv_codec.h): the kernel that
      // reads one, against the oracle on the decoded keys and values, split as above.
      // Int8 and int4 also with spans (kv_span = group: keys per channel over complete
      // spans, each row's own span exact from kr / vr).
      if (set.uk->attention_kv == nullptr) continue;
      for (auto [enc, with_spans] : {std::pair{kiln::format::kEncF16, false}, {kiln::format::kEncINT8, false},
                                     {kiln::format::kEncINT4, false}, {kiln::format::kEncINT8, true},
                                     {kiln::format::kEncINT4, true}}) {
        const bool spans = with_spans;  // captured below
        const uint32_t group = kiln::format::KvDefaultGroup(enc, static_cast<uint32_t>(hd));
        if (spans && (group & (group - 1)) != 0) continue;
        const uint64_t width = static_cast<uint64_t>(kv_heads * hd);
        const uint64_t row_bytes = kiln::format::KvRowBytes(enc, width), row_scales = kiln::format::KvRowScales(enc, width, group);
        std::vector<uint8_t> kc(t * row_bytes), vc(t * row_bytes);
        std::vector<float> ks(t * row_scales + 1), vs(t * row_scales + 1), kd(k.size()), vd(v.size()),
            kv_scratch(KILN_UK_ATTENTION_SCRATCH(t, hd, 1));
        for (int64_t j = 0; j < t; ++j) {
          kiln::format::EncodeKvRow(enc, group, k.data() + j * width, width, kc.data() + j * row_bytes, ks.data() + j * row_scales);
          kiln::format::EncodeKvRow(enc, group, v.data() + j * width, width, vc.data() + j * row_bytes, vs.data() + j * row_scales);
          kiln::format::DecodeKvSpan(enc, group, kc.data() + j * row_bytes, ks.data() + j * row_scales, 0, width, kd.data() + j * width);
          kiln::format::DecodeKvSpan(enc, group, vc.data() + j * row_bytes, vs.data() + j * row_scales, 0, width, vd.data() + j * width);
        }
        const int64_t span = spans ? group : 0;
        for (int64_t s0 = 0; spans && s0 + span <= t; s0 += span) {
          kiln::format::EncodeKeySpan(enc, group, k.data() + s0 * width, width, span, width, kc.data() + s0 * row_bytes,
                                      ks.data() + s0 * row_scales);
          for (int64_t j = s0; j < s0 + span; ++j)
            kiln::format::DecodeKeySpanRow(enc, group, kc.data() + j * row_bytes, ks.data() + s0 * row_scales, 0, width,
                                           kd.data() + j * width);
        }
        kiln_uk_attention_params_t p = {};
        p.q = q.data();
        p.ldq = heads * hd;
        p.ldkv = kv_heads * hd;
        p.y = whole.data();
        p.ldy = heads * hd;
        p.heads = heads;
        p.kv_heads = kv_heads;
        p.head_dim = hd;
        p.n_keys = t;
        p.scale = 0.35f;
        p.positions = pos.data();
        p.kv_encoding = enc;
        p.kv_group = static_cast<int32_t>(group);
        p.kc = kc.data();
        p.vc = vc.data();
        p.ks = ks.data();
        p.vs = vs.data();
        p.kv_span = static_cast<int32_t>(span);
        if (spans) {  // the exact rows: all of them, from position 0
          p.kr = k.data();
          p.vr = v.data();
        }
        if (set.uk->attention_kv_supported != nullptr && set.uk->attention_kv_supported(&p) == 0) continue;
        set.uk->attention_kv(&p, 0, t * heads, kv_scratch.data());
        p.y = y.data();
        for (auto [b0, b1] : Split(t * heads, 3, rng)) set.uk->attention_kv(&p, b0, b1, kv_scratch.data());
        ASSERT_EQ(std::memcmp(y.data(), whole.data(), y.size() * 4), 0)
            << "encoded attention split, t=" << t << " hd=" << hd << " encoding " << int(enc) << " spans " << spans;
        std::vector<double> want(y.size());
        for (int64_t r = 0; r < t; ++r)
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / (heads / kv_heads), n = r + 1;
            // Key and value rows j as the kernel reads them for row r.
            auto exact = [&](int64_t j) { return spans && j >= r - r % span; };
            auto key = [&](int64_t j) { return exact(j) ? k.data() + j * width : kd.data() + j * width; };
            auto val = [&](int64_t j) { return exact(j) ? v.data() + j * width : vd.data() + j * width; };
            std::vector<double> sc(n);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < n; ++j) {
              double d = 0;
              for (int64_t i = 0; i < hd; ++i) d += double(q[r * heads * hd + h * hd + i]) * key(j)[g * hd + i];
              sc[j] = d * 0.35f;
              mx = std::max(mx, sc[j]);
            }
            for (double& a : sc) sum += (a = std::exp(a - mx));
            for (int64_t i = 0; i < hd; ++i) {
              double acc = 0;
              for (int64_t j = 0; j < n; ++j) acc += sc[j] / sum * val(j)[g * hd + i];
              want[r * heads * hd + h * hd + i] = acc;
            }
          }
        EXPECT_LT(Nmse(y, want), 1e-10) << "encoded attention t=" << t << " hd=" << hd << " encoding " << int(enc)
                                         << " spans " << spans;
      }
    }
  }
}

}  // namespace
