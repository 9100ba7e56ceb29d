// The differential test of generated kernels (ctest -L kernels-diff): every kernel
// codegen/generators emits, for shapes that exercise each vector width, compiled for
// every target this CPU can run, loaded by the runtime's code loader and compared
// with the reference micro-kernel on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "code/elf_loader.h"
#include "codegen/generators/KernelGenerator.h"
#include "dialects/kiln/KilnDialect.h"
#include "dialects/kiln/KilnOps.h"
#include "formats/encoding.h"
#include "formats/kv_codec.h"
#include "formats/kiln_format.h"
#include "formats/numeric.h"
#include "kernels/ukernel.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "platform/platform.h"

namespace kiln {
namespace {

// The x86-64 targets (baseline SSE2, AVX2, AVX-512) or the AArch64 one this CPU runs.
std::vector<Target> RunnableTargets() {
  std::vector<Target> out;
  const uint64_t cpu = rt::DetectCpuFeatures();
  // AVX2 with 256-bit VPDPBUSD: AVX-VNNI (VEX), or AVX-512 VNNI + VL without BW (EVEX;
  // the same generated code, runnable on AVX-512 VNNI hosts).
  for (const char* features : {"", "+avx2,+fma,+f16c", "+avx2,+fma,+f16c,+avxvnni",
                               "+avx2,+fma,+f16c,+avx512f,+avx512vl,+avx512vnni",
                               "+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl",
                               "+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni"}) {
    auto t = parseTarget(hostTarget().triple, hostTarget().arch == TargetArch::X86_64 ? features : "");
    EXPECT_TRUE(static_cast<bool>(t));
    if (t && (t->features & ~cpu) == 0) out.push_back(*t);
    if (hostTarget().arch != TargetArch::X86_64) break;
  }
  return out;
}

// A one-op model: kiln.rope over [rows, heads * head_dim] bound to the generated kernel.
std::string RopeModel(int64_t heads, int64_t head_dim) {
  std::string cols = std::to_string(heads * head_dim);
  return "func.func @decoder_prefill(%x: tensor<?x" + cols + "xf32>, %p: tensor<?xi32>) -> tensor<?x" + cols +
         "xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n"
         "  %0 = kiln.rope %x, %p {num_heads = " + std::to_string(heads) + " : i64, head_dim = " +
         std::to_string(head_dim) + " : i64, theta = 1.0e4 : f64, kiln.kernel = \"rope_f32_f32_gen\"} : tensor<?x" +
         cols + "xf32>, tensor<?xi32> -> tensor<?x" + cols + "xf32>\n  return %0 : tensor<?x" + cols + "xf32>\n}\n";
}

struct Compiled {
  GeneratedCode code;
  std::string symbol;
};

bool Generate(mlir::MLIRContext& ctx, const std::string& source, const Target& target, Compiled* out) {
  mlir::OwningOpRef<mlir::ModuleOp> model = mlir::parseSourceString<mlir::ModuleOp>(source, &ctx);
  if (!model) return false;
  mlir::OwningOpRef<mlir::ModuleOp> kernels = buildKernelModule(*model, target);
  if (!kernels) return false;
  model->walk([&](mlir::Operation* op) {
    if (auto s = op->getAttrOfType<mlir::StringAttr>(kSymbolAttrName)) out->symbol = s.str();
  });
  return mlir::succeeded(compileKernels(*kernels, target, &out->code));
}

class GeneratedKernels : public ::testing::Test {
 protected:
  GeneratedKernels() { ctx_.loadDialect<KilnDialect, mlir::func::FuncDialect>(); }

  // The generated function of a one-linear `model` bound to `kernel`, compiled for
  // `target` and loaded into `image`; null with `why` set when the generator does not
  // support the op on that target, null after a test failure otherwise.
  kiln_uk_matmul_fn LinearKernel(const std::string& model, const char* kernel, const Target& target,
                                 rt::CodeImage* image, std::string* why) {
    why->clear();
    mlir::OwningOpRef<mlir::ModuleOp> probe = mlir::parseSourceString<mlir::ModuleOp>(model, &ctx_);
    if (!probe) {
      ADD_FAILURE() << "does not parse:\n" << model;
      return nullptr;
    }
    mlir::Operation* linear = nullptr;
    probe->walk([&](LinearOp op) { linear = op; });
    if (!generatorSupports(linear, kernel, target, why)) return nullptr;
    Compiled c;
    if (!Generate(ctx_, model, target, &c)) {
      ADD_FAILURE() << "generating the kernel failed";
      return nullptr;
    }
    kiln_error_t err;
    if (image->Load(c.code.object.data(), c.code.object.size(), &err) != KILN_OK) {
      ADD_FAILURE() << err.message;
      return nullptr;
    }
    auto* fn = reinterpret_cast<kiln_uk_matmul_fn>(image->Find(c.symbol.c_str()));
    if (fn == nullptr) ADD_FAILURE() << "no function " << c.symbol;
    return fn;
  }
  mlir::MLIRContext ctx_;
};

TEST_F(GeneratedKernels, RopeMatchesReference) {
  struct Shape {
    int64_t heads, head_dim;
  };
  // Half head sizes 1, 3 (scalar lanes), 8, 32, 64: every vector width and a tail.
  const Shape shapes[] = {{1, 2}, {2, 6}, {4, 16}, {3, 64}, {8, 128}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (const Target& target : RunnableTargets()) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + std::to_string(s.heads) + "x" +
                   std::to_string(s.head_dim));
      Compiled c;
      ASSERT_TRUE(Generate(ctx_, RopeModel(s.heads, s.head_dim), target, &c));
      rt::CodeImage image;
      kiln_error_t err;
      ASSERT_EQ(image.Load(c.code.object.data(), c.code.object.size(), &err), KILN_OK) << err.message;
      auto* fn = reinterpret_cast<void (*)(const kiln_uk_rope_params_t*, int64_t, int64_t)>(image.Find(c.symbol.c_str()));
      ASSERT_NE(fn, nullptr) << c.symbol;

      const int64_t rows = 37, ld = s.heads * s.head_dim + 5;  // a row stride beyond the heads
      std::vector<float> x(rows * ld), want(rows * ld, 0.0f), got(rows * ld, 0.0f), inv(s.head_dim / 2);
      std::vector<int32_t> pos(rows);
      for (float& v : x) v = value(rng);
      for (int64_t i = 0; i < s.head_dim / 2; ++i)
        inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / s.head_dim));
      // Positions from 0 to long contexts (large angles test the range reduction).
      for (int64_t t = 0; t < rows; ++t) pos[t] = t < 8 ? static_cast<int32_t>(t) : static_cast<int32_t>(rng() % 500000);
      kiln_uk_rope_params_t ref = {x.data(), want.data(), ld, pos.data(), inv.data(), s.heads, s.head_dim};
      kiln_uk_rope_f32_f32_ref_portable(&ref, 0, rows);
      kiln_uk_rope_params_t gen = ref;
      gen.y = got.data();
      fn(&gen, 0, 5);       // two ranges, as threads split them
      fn(&gen, 5, rows);
      double worst = 0;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = 0; i < s.heads * s.head_dim; ++i)
          worst = std::max(worst, static_cast<double>(std::fabs(got[t * ld + i] - want[t * ld + i])));
      EXPECT_LE(worst, 4e-6) << "max |generated - reference|";
      // Columns past the heads are not written.
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = s.heads * s.head_dim; i < ld; ++i) ASSERT_EQ(got[t * ld + i], 0.0f);
      // In place (the planner may give the output the input's memory).
      std::vector<float> inplace = x;
      gen.x = gen.y = inplace.data();
      fn(&gen, 0, rows);
      for (int64_t k = 0; k < rows * ld; ++k)
        if ((k % ld) < s.heads * s.head_dim) ASSERT_EQ(inplace[k], got[k]) << "in place, element " << k;
    }
  }
}

// A one-op model: kiln.linear of [?, k] by a [n, k] weight of `encoding` (and an f32
// bias), bound to the generated matmul.
std::string LinearModel(int64_t n, int64_t k, const std::string& encoding, bool bias,
                        const std::string& kernel = "linear_bias_f32_f32_wfloat_4x4_gen",
                        const std::string& biasEncoding = "f32", const std::string& layout = "") {
  std::string ns = std::to_string(n), ks = std::to_string(k);
  std::string m = "kiln.weight @w : tensor<" + ns + "x" + ks + "xf32> from #kiln.source<\"m.safetensors\", offset = 0, "
                  "size = " + std::to_string(4 * n * k) + ", dtype = \"F32\"> as #kiln.encoding<" + encoding + ">" +
                  (layout.empty() ? "" : " layout #kiln.layout<" + layout + ">") + "\n";
  if (bias)
    m += "kiln.weight @b : tensor<" + ns + "xf32> from #kiln.source<\"m.safetensors\", offset = 0, size = " +
         std::to_string(4 * n) + ", dtype = \"F32\"> as #kiln.encoding<" + biasEncoding + ">\n";
  m += "func.func @decoder_prefill(%x: tensor<?x" + ks + "xf32>) -> tensor<?x" + ns +
       "xf32> attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n"
       "  %w = kiln.weight_ref @w : tensor<" + ns + "x" + ks + "xf32>\n";
  if (bias) m += "  %b = kiln.weight_ref @b : tensor<" + ns + "xf32>\n";
  m += "  %0 = kiln.linear %x, %w" + std::string(bias ? ", %b" : "") +
       " {kiln.kernel = \"" + kernel + "\"} : tensor<?x" + ks + "xf32>, tensor<" + ns + "x" + ks +
       "xf32>" + (bias ? ", tensor<" + ns + "xf32>" : "") + " -> tensor<?x" + ns + "xf32>\n"
       "  return %0 : tensor<?x" + ns + "xf32>\n}\n";
  return m;
}

// Stores f32 values in an encoding's bytes (f32, f16 or bf16; round to nearest even).
std::vector<uint8_t> Encode(const std::vector<float>& v, uint8_t enc) {
  std::vector<uint8_t> out(v.size() * (enc == format::kEncF32 ? 4 : 2));
  EXPECT_TRUE(format::EncodeFloatElements(enc, v.data(), v.size(), out.data()));
  return out;
}

constexpr const char* kKernel = "linear_bias_f32_f32_wfloat_4x4_gen";

TEST_F(GeneratedKernels, MatmulMatchesReference) {
  struct Shape {
    int64_t m, n, k;
  };
  // Tiles of 4 x 4 with M and N tails, K below, at and above every vector width, and
  // a long K; with panel16, whole panels (in pairs and alone), panels the thread split
  // cuts, the rows left over.
  const Shape shapes[] = {{1, 1, 1}, {1, 37, 7}, {3, 16, 16}, {4, 8, 64}, {9, 13, 100}, {17, 20, 33}, {37, 9, 4096},
                          {13, 48, 40}, {25, 80, 24}};
  const std::pair<const char*, uint8_t> encodings[] = {
      {"f32", format::kEncF32}, {"f16", format::kEncF16}, {"bf16", format::kEncBF16}};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  int compared = 0;
  const std::vector<Target> targets = RunnableTargets();
  for (const Target& target : targets) {
    for (const auto& [label, enc] : encodings) {
      for (const Shape& s : shapes) {
        for (int variant = 0; variant < 4; ++variant) {
          const bool bias = variant & 1, panel = variant & 2;  // panel: stored panel16
          SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + label +
                       (panel ? " panel16" : "") + ", " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                       std::to_string(s.k) + (bias ? " + bias" : ""));
          const std::string model = LinearModel(s.n, s.k, label, bias, kKernel, label, panel ? "panel16" : "");
          rt::CodeImage image;
          std::string why;
          kiln_uk_matmul_fn fn = LinearKernel(model, kKernel, target, &image, &why);
          if (fn == nullptr && !why.empty()) {
            // Only f16 without a hardware conversion (x86 without F16C) is refused.
            EXPECT_EQ(enc, format::kEncF16) << why;
            continue;
          }
          ASSERT_NE(fn, nullptr);

          const int64_t ldx = s.k + 3, ldy = s.n + 2;
          std::vector<float> x(s.m * ldx), wf(s.n * s.k), bv(s.n), want(s.m * ldy, 0.0f), got(s.m * ldy, 0.0f);
          for (float& v : x) v = value(rng);
          for (float& v : wf) v = value(rng);
          for (float& v : bv) v = value(rng);
          // The bias in the weight's encoding too (checkpoints store bf16 biases).
          std::vector<uint8_t> wbytes = Encode(wf, enc), bbytes = Encode(bv, enc);
          kiln_uk_weight_t wt = {wbytes.data(), s.n, s.k, enc, 1, 0, 0, 0};
          kiln_uk_weight_t bt = {bbytes.data(), s.n, 1, enc, 1, 0, 0, 0};
          kiln_uk_matmul_params_t p = {};
          p.x = x.data();
          p.ldx = ldx;
          p.M = s.m;
          p.N = s.n;
          p.K = s.k;
          p.w = wt;
          p.bias = bias ? &bt : nullptr;
          p.y = want.data();
          p.ldy = ldy;
          std::vector<float> scratch(kiln_uk_matmul_scratch_ref(s.k) + 64);
          kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable(&p, 0, s.n, scratch.data());
          p.y = got.data();
          std::vector<uint8_t> panelBytes(wbytes.size());
          if (panel) {
            const uint64_t elem = enc == format::kEncF32 ? 4 : 2;
            format::RepackPanel16(true, elem, wbytes.data(), s.n, s.k, panelBytes.data());
            std::vector<uint8_t> back(wbytes.size());
            format::RepackPanel16(false, elem, panelBytes.data(), s.n, s.k, back.data());
            ASSERT_EQ(back, wbytes) << "panel16 does not round-trip";
            p.w.data = panelBytes.data();
            p.w.layout = format::kLayoutPanel16;
          }
          const int64_t split = s.n / 3;  // two ranges, as threads split them
          fn(&p, 0, split, nullptr);
          fn(&p, split, s.n, nullptr);
          double worst = 0, scale = 0;
          for (int64_t m = 0; m < s.m; ++m)
            for (int64_t n = 0; n < ldy; ++n) {
              if (n >= s.n) {
                ASSERT_EQ(got[m * ldy + n], 0.0f) << "wrote past N at row " << m;
                continue;
              }
              worst = std::max(worst, static_cast<double>(std::fabs(got[m * ldy + n] - want[m * ldy + n])));
              scale = std::max(scale, static_cast<double>(std::fabs(want[m * ldy + n])));
            }
          // The same products summed in another order (f32): a few ulps of the sum's terms.
          EXPECT_LE(worst, 1e-5 * (s.k + 1)) << "max |generated - reference|, max |reference| " << scale;
          // Gathered rows (x_rows, a mixture's tokens: here the rows reversed, the first
          // twice): the same bits as the product of a copy of those rows, generated and
          // reference alike.
          std::vector<int32_t> pick(s.m);
          for (int64_t m = 0; m < s.m; ++m) pick[m] = static_cast<int32_t>(m == 0 ? 0 : s.m - m);
          std::vector<float> copied(s.m * ldx, 0.0f);
          for (int64_t m = 0; m < s.m; ++m) std::copy_n(&x[pick[m] * ldx], ldx, &copied[m * ldx]);
          for (const bool generated : {true, false}) {
            std::vector<float> direct(s.m * ldy, 0.0f), fromCopy(s.m * ldy, 0.0f);
            kiln_uk_matmul_params_t q = p;
            if (!generated) {
              q.w.data = wbytes.data();
              q.w.layout = 0;
            }
            auto call = [&](kiln_uk_matmul_params_t& r) {
              if (generated) {
                fn(&r, 0, split, nullptr);
                fn(&r, split, s.n, nullptr);
              } else {
                kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable(&r, 0, s.n, scratch.data());
              }
            };
            q.x_rows = pick.data();
            q.y = direct.data();
            call(q);
            q.x_rows = nullptr;
            q.x = copied.data();
            q.y = fromCopy.data();
            call(q);
            EXPECT_EQ(0, std::memcmp(direct.data(), fromCopy.data(), direct.size() * 4))
                << (generated ? "generated" : "reference") << ": gathered rows differ from their copy";
          }
          ++compared;
        }
      }
    }
  }
  // Every target x encoding x shape x bias x layout case ran (but f16 where refused).
  EXPECT_GE(compared, static_cast<int>(targets.size()) * 2 * 4 * 9);
}

// Random int8 (codes and f32 row scales) or int4 (nibbles, f16 group scales, u8
// zero points when asymmetric) weight bytes of [n, k], as formats/encoding.h lays
// them out.
std::vector<uint8_t> RandomIntWeight(std::mt19937& rng, uint8_t enc, int64_t n, int64_t k, int64_t group,
                                     bool symmetric) {
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  format::EncodingSpec spec;
  spec.id = enc;
  spec.group = static_cast<uint32_t>(group);
  spec.symmetric = symmetric;
  std::vector<uint8_t> out(format::StorageBytes(spec, n, k));
  if (enc == format::kEncINT8) {
    for (int64_t i = 0; i < n * k; ++i) out[i] = static_cast<uint8_t>(static_cast<int8_t>(rng() % 255 - 127));
    for (int64_t r = 0; r < n; ++r) {
      float s = scale(rng);
      std::memcpy(out.data() + n * k + 4 * r, &s, 4);
    }
    return out;
  }
  for (int64_t i = 0; i < n * k; ++i) format::Int4View::SetCode(out.data(), i, static_cast<uint8_t>(rng() % 16));
  for (int64_t i = 0; i < n * (k / group); ++i) {
    uint16_t h = numeric::F32ToF16(scale(rng));
    std::memcpy(out.data() + format::Int4ScalesOffset(n, k) + 2 * i, &h, 2);
    if (!symmetric) out[format::Int4ZerosOffset(n, k, group) + i] = static_cast<uint8_t>(rng() % 16);
  }
  return out;
}

TEST_F(GeneratedKernels, Int8ActivationMatmulMatchesReference) {
  struct Case {
    const char* encoding;  // as the IR spells it
    uint8_t id;
    int64_t group;
    bool symmetric;
    int64_t m, n, k;
    uint8_t layout = format::kLayoutRowMajor;  // formats/encoding.h LayoutId
    // Every code 15 and every activation +-127 (rows alternating): the largest
    // integer sums, which must not overflow the kernels' narrow partial sums.
    bool extreme = false;
  };
  constexpr uint8_t kP16 = format::kLayoutInt4P16K8, kP8 = format::kLayoutInt8P16K4;
  const Case cases[] = {
      // int8: K below, at and above every step (8, 16, 32), tails of M and N.
      {"int8", format::kEncINT8, 0, true, 1, 1, 1}, {"int8", format::kEncINT8, 0, true, 1, 37, 7},
      {"int8", format::kEncINT8, 0, true, 3, 16, 16}, {"int8", format::kEncINT8, 0, true, 4, 8, 64},
      {"int8", format::kEncINT8, 0, true, 9, 13, 100}, {"int8", format::kEncINT8, 0, true, 17, 20, 333},
      // int4: groups of 32 and 64, symmetric and with zero points.
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 5, 64},
      {"int4, group = 32, asym", format::kEncINT4, 32, false, 3, 16, 96},
      {"int4, group = 64", format::kEncINT4, 64, true, 9, 13, 256},
      {"int4, group = 64, asym", format::kEncINT4, 64, false, 17, 7, 128},
      {"int4, group = 128", format::kEncINT4, 128, true, 2, 33, 256},
      // int4 packed in panels of 16 rows: a single panel of 1, 7 and 16 rows, a last
      // panel of 1 and 8 rows after whole ones (in pairs and alone), rows in whole
      // tiles, left over and fewer than a tile, more rows than a block of sums.
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 1, 32, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 2, 7, 64, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 6, 16, 96, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 7, 17, 128, kP16},
      {"int4, group = 64", format::kEncINT4, 64, true, 13, 40, 256, kP16},
      {"int4, group = 128", format::kEncINT4, 128, true, 25, 64, 256, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 530, 33, 64, kP16},
      // int8 packed in panels of 16 rows, as int4 above.
      {"int8", format::kEncINT8, 0, true, 1, 1, 4, kP8},
      {"int8", format::kEncINT8, 0, true, 3, 17, 16, kP8},
      {"int8", format::kEncINT8, 0, true, 7, 40, 100, kP8},
      {"int8", format::kEncINT8, 0, true, 13, 64, 64, kP8},
      // A long K.
      {"int8", format::kEncINT8, 0, true, 70, 5, 4096},
      {"int8", format::kEncINT8, 0, true, 70, 48, 4096, kP8},
      {"int4, group = 32", format::kEncINT4, 32, true, 70, 48, 4096, kP16},
      // The largest sums, one row (decode) and a tile of rows.
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 32, 256, kP16, true},
      {"int4, group = 32", format::kEncINT4, 32, true, 9, 32, 256, kP16, true},
      {"int4, group = 32", format::kEncINT4, 32, true, 9, 32, 256, format::kLayoutRowMajor, true},
      {"int4, group = 64", format::kEncINT4, 64, true, 9, 32, 256, kP16, true},
  };
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  int compared = 0;
  const std::vector<Target> targets = RunnableTargets();
  const char* kernel = "linear_bias_f32_qai8dx_wq_4x4_gen";
  for (const Target& target : targets) {
    for (const Case& cs : cases) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + cs.encoding + " " +
                     format::LayoutName(cs.layout) + ", " +
                     std::to_string(cs.m) + "x" + std::to_string(cs.n) + "x" + std::to_string(cs.k) +
                     (bias ? " + bias" : ""));
        const std::string model = LinearModel(cs.n, cs.k, std::string(cs.encoding) + ", act = int8_per_token", bias,
                                              kernel, "f32", cs.layout ? format::LayoutName(cs.layout) : "");
        rt::CodeImage image;
        std::string why;
        kiln_uk_matmul_fn fn = LinearKernel(model, kernel, target, &image, &why);
        if (fn == nullptr && !why.empty()) {
          // Only int4 without a hardware f16 conversion (x86 without F16C) is refused.
          EXPECT_EQ(cs.id, format::kEncINT4) << why;
          EXPECT_EQ(target.features & format::kCpuX86F16c, 0u) << why;
          continue;
        }
        ASSERT_NE(fn, nullptr);

        const int64_t ldx = cs.k + 3, ldy = cs.n + 2;
        std::vector<float> x(cs.m * ldx), bv(cs.n), xs(cs.m), want(cs.m * ldy, 0.0f), got(cs.m * ldy, 0.0f);
        std::vector<int8_t> xq(cs.m * cs.k);
        for (float& v : x) v = value(rng);
        if (cs.extreme)
          for (int64_t i = 0; i < cs.m * ldx; ++i) x[i] = (i / ldx) % 2 == 0 ? 1.0f : -1.0f;
        for (float& v : bv) v = value(rng);
        kiln_uk_quant_rows_params_t q = {x.data(), ldx, cs.k, xq.data(), xs.data()};
        kiln_uk_lhs_quant_qai8dx_f32_ref_portable(&q, 0, cs.m);
        std::vector<uint8_t> wbytes = RandomIntWeight(rng, cs.id, cs.n, cs.k, cs.group, cs.symmetric);
        if (cs.extreme)
          for (int64_t i = 0; i < cs.n * cs.k; ++i) format::Int4View::SetCode(wbytes.data(), i, 15);
        std::vector<uint8_t> bbytes = Encode(bv, format::kEncF32);
        kiln_uk_weight_t wt = {wbytes.data(), cs.n, cs.k, cs.id, static_cast<uint8_t>(cs.symmetric), 1, 0,
                               static_cast<uint32_t>(cs.group)};
        kiln_uk_weight_t bt = {bbytes.data(), cs.n, 1, format::kEncF32, 1, 0, 0, 0};
        kiln_uk_matmul_params_t p = {};
        p.x = x.data();
        p.ldx = ldx;
        p.xq = xq.data();
        p.xs = xs.data();
        p.M = cs.m;
        p.N = cs.n;
        p.K = cs.k;
        p.w = wt;
        p.bias = bias ? &bt : nullptr;
        p.y = want.data();
        p.ldy = ldy;
        kiln_uk_matmul_bias_f32_qai8dx_wq_1x1_ref_portable(&p, 0, cs.n, nullptr);
        p.y = got.data();
        std::vector<uint8_t> packedBytes(wbytes.size());
        if (cs.layout != format::kLayoutRowMajor) {
          const format::EncodingSpec spec = {cs.id, static_cast<uint32_t>(cs.group), true};
          ASSERT_TRUE(format::LayoutFits(cs.layout, spec, cs.n, cs.k));
          std::vector<uint8_t> back(wbytes.size());
          if (cs.layout == kP8) {
            format::RepackInt8P16K4(true, wbytes.data(), cs.n, cs.k, packedBytes.data());
            format::RepackInt8P16K4(false, packedBytes.data(), cs.n, cs.k, back.data());
          } else {
            format::RepackInt4P16K8(true, spec, wbytes.data(), cs.n, cs.k, packedBytes.data());
            format::RepackInt4P16K8(false, spec, packedBytes.data(), cs.n, cs.k, back.data());
          }
          ASSERT_EQ(back, wbytes) << format::LayoutName(cs.layout) << " does not round-trip";
          p.w.data = packedBytes.data();
          p.w.layout = cs.layout;
        }
        // The runtime's per-thread scratch for a generated matmul.
        std::vector<float> scratch(kiln_uk_matmul_scratch_ref(cs.k));
        const int64_t split = cs.n / 3;  // two ranges, as threads split them
        fn(&p, 0, split, scratch.data());
        fn(&p, split, cs.n, scratch.data());
        double worst = 0, scale = 0;
        for (int64_t m = 0; m < cs.m; ++m)
          for (int64_t n = 0; n < ldy; ++n) {
            if (n >= cs.n) {
              ASSERT_EQ(got[m * ldy + n], 0.0f) << "wrote past N at row " << m;
              continue;
            }
            worst = std::max(worst, static_cast<double>(std::fabs(got[m * ldy + n] - want[m * ldy + n])));
            scale = std::max(scale, static_cast<double>(std::fabs(want[m * ldy + n])));
          }
        if (cs.id == format::kEncINT8) {
          // Exact integer sums, then the reference's float operations in its order.
          EXPECT_EQ(worst, 0.0) << "max |generated - reference|, max |reference| " << scale;
        } else {
          // Exact sums per group; the scaled group sums added in another order.
          EXPECT_LE(worst, 1e-6 * scale * static_cast<double>(cs.k / cs.group + 1))
              << "max |generated - reference|, max |reference| " << scale;
        }
        ++compared;
      }
    }
  }
  // Every target x case x bias ran but int4 where refused: int8 always.
  EXPECT_GE(compared, static_cast<int>(targets.size()) * 2 * 6);
}

// Quantised weights with float activations (W8A16, W4A16, fp8): the generated
// matmul decodes the codes in registers, scales applied per vector; the reference
// dequantises a row and sums the same products in another order.
TEST_F(GeneratedKernels, FloatActivationQuantisedMatmulMatchesReference) {
  struct Case {
    const char* encoding;  // as the IR spells it
    uint8_t id;
    int64_t group;
    bool symmetric;
    int64_t m, n, k;
    uint8_t layout = format::kLayoutRowMajor;  // formats/encoding.h LayoutId
  };
  constexpr uint8_t kP16 = format::kLayoutInt4P16K8, kP8 = format::kLayoutInt8P16K4,
                    kPanel = format::kLayoutPanel16;
  const Case cases[] = {
      {"int8", format::kEncINT8, 0, true, 1, 1, 1},       {"int8", format::kEncINT8, 0, true, 3, 37, 7},
      {"int8", format::kEncINT8, 0, true, 9, 13, 100},    {"fp8_e4m3", format::kEncFP8_E4M3, 0, true, 1, 5, 33},
      {"fp8_e4m3", format::kEncFP8_E4M3, 0, true, 6, 9, 64}, {"fp8_e5m2", format::kEncFP8_E5M2, 0, true, 5, 7, 19},
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 5, 64},
      {"int4, group = 32, asym", format::kEncINT4, 32, false, 7, 6, 96},
      {"int4, group = 128", format::kEncINT4, 128, true, 5, 9, 256},
      // Packed in panels of 16 rows (W8A16, W4A16, fp8): one row (decode: tiles of
      // up to 4 panels), a single panel of 1, 7 and 16 rows, a last panel of 1 and 8
      // rows after whole ones (in pairs and alone), rows in whole tiles, left over
      // and fewer than a tile.
      {"int8", format::kEncINT8, 0, true, 1, 1, 4, kP8},
      {"int8", format::kEncINT8, 0, true, 1, 80, 64, kP8},
      {"int8", format::kEncINT8, 0, true, 3, 17, 16, kP8},
      {"int8", format::kEncINT8, 0, true, 7, 40, 100, kP8},
      {"int8", format::kEncINT8, 0, true, 30, 64, 64, kP8},
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 7, 64, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 1, 88, 96, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 6, 16, 96, kP16},
      {"int4, group = 32", format::kEncINT4, 32, true, 5, 33, 64, kP16},
      {"int4, group = 64", format::kEncINT4, 64, true, 13, 40, 256, kP16},
      {"int4, group = 128", format::kEncINT4, 128, true, 29, 64, 256, kP16},
      {"fp8_e4m3", format::kEncFP8_E4M3, 0, true, 1, 72, 33, kPanel},
      {"fp8_e4m3", format::kEncFP8_E4M3, 0, true, 15, 17, 64, kPanel},
      {"fp8_e5m2", format::kEncFP8_E5M2, 0, true, 4, 40, 19, kPanel},
  };
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const char* kernel = "linear_bias_f32_qai8dx_wq_4x4_gen";
  int compared = 0;
  const std::vector<Target> targets = RunnableTargets();
  for (const Target& target : targets) {
    for (const Case& cs : cases) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + cs.encoding + " " +
                     format::LayoutName(cs.layout) + ", " + std::to_string(cs.m) + "x" + std::to_string(cs.n) + "x" +
                     std::to_string(cs.k) + (bias ? " + bias" : ""));
        const std::string model =
            LinearModel(cs.n, cs.k, cs.encoding, bias, kernel, "f32", cs.layout ? format::LayoutName(cs.layout) : "");
        rt::CodeImage image;
        std::string why;
        kiln_uk_matmul_fn fn = LinearKernel(model, kernel, target, &image, &why);
        if (fn == nullptr && !why.empty()) {
          // Only int4 without a hardware f16 conversion (x86 without F16C) is refused.
          EXPECT_EQ(cs.id, format::kEncINT4) << why;
          EXPECT_EQ(target.features & format::kCpuX86F16c, 0u) << why;
          continue;
        }
        ASSERT_NE(fn, nullptr);

        const int64_t ldx = cs.k + 3, ldy = cs.n + 2;
        std::vector<float> x(cs.m * ldx), bv(cs.n), want(cs.m * ldy, 0.0f), got(cs.m * ldy, 0.0f);
        for (float& v : x) v = value(rng);
        for (float& v : bv) v = value(rng);
        std::vector<uint8_t> wbytes;
        if (cs.id == format::kEncFP8_E4M3 || cs.id == format::kEncFP8_E5M2) {
          // Codes of values in [-4, 4] (finite), f32 row scales.
          wbytes.resize(cs.n * cs.k + 4 * cs.n);
          for (int64_t i = 0; i < cs.n * cs.k; ++i)
            wbytes[i] = format::F32ToFp8(4.0f * value(rng), cs.id == format::kEncFP8_E4M3);
          for (int64_t r = 0; r < cs.n; ++r) {
            float sc = 0.01f + 0.05f * std::fabs(value(rng));
            std::memcpy(wbytes.data() + cs.n * cs.k + 4 * r, &sc, 4);
          }
        } else {
          wbytes = RandomIntWeight(rng, cs.id, cs.n, cs.k, cs.group, cs.symmetric);
        }
        std::vector<uint8_t> bbytes = Encode(bv, format::kEncF32);
        kiln_uk_weight_t wt = {wbytes.data(), cs.n, cs.k, cs.id, static_cast<uint8_t>(cs.symmetric), 0, 0,
                               static_cast<uint32_t>(cs.group)};
        kiln_uk_weight_t bt = {bbytes.data(), cs.n, 1, format::kEncF32, 1, 0, 0, 0};
        kiln_uk_matmul_params_t p = {};
        p.x = x.data();
        p.ldx = ldx;
        p.M = cs.m;
        p.N = cs.n;
        p.K = cs.k;
        p.w = wt;
        p.bias = bias ? &bt : nullptr;
        p.y = want.data();
        p.ldy = ldy;
        std::vector<float> scratch(kiln_uk_matmul_scratch_ref(cs.k) + 64);
        kiln_uk_matmul_bias_f32_f32_wany_1x16_ref_portable(&p, 0, cs.n, scratch.data());
        p.y = got.data();
        format::EncodingSpec spec = {cs.id, static_cast<uint32_t>(cs.group), cs.symmetric};
        std::vector<uint8_t> packedBytes(wbytes.size());
        if (cs.layout != format::kLayoutRowMajor) {
          ASSERT_TRUE(format::LayoutFits(cs.layout, spec, cs.n, cs.k));
          std::vector<uint8_t> back(wbytes.size());
          format::RepackLayout(true, cs.layout, spec, wbytes.data(), cs.n, cs.k, packedBytes.data());
          format::RepackLayout(false, cs.layout, spec, packedBytes.data(), cs.n, cs.k, back.data());
          ASSERT_EQ(back, wbytes) << format::LayoutName(cs.layout) << " does not round-trip";
          p.w.data = packedBytes.data();
          p.w.layout = cs.layout;
        }
        const int64_t split = cs.n / 3;  // two ranges, as threads split them
        fn(&p, 0, split, nullptr);
        fn(&p, split, cs.n, nullptr);
        if (cs.layout != format::kLayoutRowMajor) {
          // Any split of the channels, and each row alone, give the same bits.
          std::vector<float> again(cs.m * ldy, 0.0f);
          p.y = again.data();
          fn(&p, 0, cs.n, nullptr);
          for (int64_t m = 0; m < cs.m; ++m) {
            kiln_uk_matmul_params_t row = p;
            row.x = x.data() + m * ldx;
            row.M = 1;
            std::vector<float> alone(ldy, 0.0f);
            row.y = alone.data();
            fn(&row, 0, cs.n, nullptr);
            for (int64_t n = 0; n < cs.n; ++n) {
              ASSERT_EQ(again[m * ldy + n], got[m * ldy + n]) << "split changes (" << m << ", " << n << ")";
              ASSERT_EQ(alone[n], got[m * ldy + n]) << "row " << m << " alone changes channel " << n;
            }
          }
        }
        {
          // Gathered rows (x_rows: the rows reversed): the bits of the rows in order.
          std::vector<int32_t> pick(cs.m);
          for (int64_t m = 0; m < cs.m; ++m) pick[m] = static_cast<int32_t>(cs.m - 1 - m);
          std::vector<float> gathered(cs.m * ldy, 0.0f);
          kiln_uk_matmul_params_t q = p;
          q.x_rows = pick.data();
          q.y = gathered.data();
          fn(&q, 0, split, nullptr);
          fn(&q, split, cs.n, nullptr);
          for (int64_t m = 0; m < cs.m; ++m)
            for (int64_t n = 0; n < cs.n; ++n)
              ASSERT_EQ(gathered[m * ldy + n], got[pick[m] * ldy + n]) << "gathered row " << m << ", channel " << n;
        }
        // The largest dequantised weight bounds each product (|x| <= 1).
        std::vector<float> row(cs.k);
        double wmax = 0;
        for (int64_t r = 0; r < cs.n; ++r) {
          format::DecodeRow(spec, wbytes.data(), cs.n, cs.k, r, row.data());
          for (float v : row) wmax = std::max(wmax, static_cast<double>(std::fabs(v)));
        }
        double worst = 0;
        for (int64_t m = 0; m < cs.m; ++m)
          for (int64_t n = 0; n < ldy; ++n) {
            if (n >= cs.n) {
              ASSERT_EQ(got[m * ldy + n], 0.0f) << "wrote past N at row " << m;
              continue;
            }
            worst = std::max(worst, static_cast<double>(std::fabs(got[m * ldy + n] - want[m * ldy + n])));
          }
        // The same products (the scale applied to the code or to the sum) summed in
        // another order: a few ulps of the largest term per term.
        EXPECT_LE(worst, 1e-6 * static_cast<double>(cs.k + 1) * (wmax + 1)) << "largest |weight| " << wmax;
        ++compared;
      }
    }
  }
  // int8 and fp8 on every target (row major and packed), int4 where f16 converts.
  EXPECT_GE(compared, static_cast<int>(targets.size()) * 2 * 14);
}

// Loads the one generated function of `source` compiled for `target`.
template <typename Fn>
Fn* LoadGenerated(mlir::MLIRContext& ctx, const std::string& source, const Target& target, rt::CodeImage* image) {
  Compiled c;
  EXPECT_TRUE(Generate(ctx, source, target, &c));
  kiln_error_t err;
  if (c.code.object.empty() || image->Load(c.code.object.data(), c.code.object.size(), &err) != KILN_OK) {
    ADD_FAILURE() << "no object for " << source;
    return nullptr;
  }
  return reinterpret_cast<Fn*>(image->Find(c.symbol.c_str()));
}

// A one-op element-wise model over [?, cols]: `op` is "add", "mul" or an
// activation kind.
std::string EltwiseModel(const std::string& op, int64_t cols) {
  const std::string t = "tensor<?x" + std::to_string(cols) + "xf32>";
  std::string m = "func.func @decoder_prefill(%a: " + t + ", %b: " + t + ") -> " + t +
                  " attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n";
  if (op == "add" || op == "mul")
    m += "  %0 = kiln." + op + " %a, %b {kiln.kernel = \"" + op + "_f32_f32_f32_gen\"} : " + t + "\n";
  else
    m += "  %0 = kiln.activation %a {kind = #kiln.activation<" + op + ">, kiln.kernel = \"act_f32_f32_gen\"} : " + t +
         "\n";
  return m + "  return %0 : " + t + "\n}\n";
}

TEST_F(GeneratedKernels, EltwiseMatchesReference) {
  const std::pair<const char*, int32_t> ops[] = {{"add", -1},       {"mul", -2},
                                                 {"silu", KILN_UK_SILU}, {"gelu", KILN_UK_GELU},
                                                 {"gelu_tanh", KILN_UK_GELU_TANH}, {"quick_gelu", KILN_UK_QUICK_GELU},
                                                 {"relu", KILN_UK_RELU}};
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> value(-12.0f, 12.0f);
  const int64_t n = 1003;  // every vector width's tail
  std::vector<float> a(n), b(n);
  for (float& v : a) v = value(rng);
  for (float& v : b) v = value(rng);
  // The activations' interesting ranges: around 0, and far out on both sides.
  a[0] = 0.0f, a[1] = -0.0f, a[2] = 1e-8f, a[3] = -1e-8f, a[4] = 90.0f, a[5] = -90.0f, a[6] = 200.0f, a[7] = -200.0f;
  for (const Target& target : RunnableTargets()) {
    for (const auto& [op, kind] : ops) {
      SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + op);
      rt::CodeImage image;
      auto* fn = LoadGenerated<void(const kiln_uk_eltwise_params_t*, int64_t, int64_t)>(ctx_, EltwiseModel(op, 7),
                                                                                           target, &image);
      ASSERT_NE(fn, nullptr);
      std::vector<float> want(n + 1, 0.0f), got(n + 1, 0.0f);
      kiln_uk_eltwise_params_t p = {a.data(), b.data(), want.data(), kind < 0 ? 0 : kind};
      if (kind == -1) kiln_uk_add_f32_f32_f32_ref_portable(&p, 0, n);
      else if (kind == -2) kiln_uk_mul_f32_f32_f32_ref_portable(&p, 0, n);
      else kiln_uk_act_f32_f32_ref_portable(&p, 0, n);
      p.y = got.data();
      fn(&p, 0, 13);  // ranges as threads split them, tails at both ends
      fn(&p, 13, n);
      for (int64_t i = 0; i < n; ++i) {
        if (kind < 0) {
          ASSERT_EQ(got[i], want[i]) << "element " << i;
        } else {
          // Polynomial exp/erf/tanh: a few ulps of the result, or 1e-6 absolute
          // where the reference itself cancels (around 0 and the negative tail).
          ASSERT_LE(std::fabs(got[i] - want[i]), 1e-6 + 4e-7 * std::fabs(want[i]))
              << "element " << i << ", x = " << a[i];
        }
      }
      ASSERT_EQ(got[n], 0.0f) << "wrote past the end";
      // In place (y aliases a).
      std::vector<float> inplace = a;
      p.a = p.y = inplace.data();
      fn(&p, 0, n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(inplace[i], got[i]) << "in place, element " << i;
    }
  }
}

// A one-op normalisation model over [?, cols] with weights (and bias) of `enc`.
std::string NormModel(bool layer, int64_t cols, const std::string& enc) {
  const std::string c = std::to_string(cols), t = "tensor<?x" + c + "xf32>", wt = "tensor<" + c + "xf32>";
  std::string m;
  for (const char* w : {"w", "b"})
    m += std::string("kiln.weight @") + w + " : " + wt + " from #kiln.source<\"m.safetensors\", offset = 0, size = " +
         std::to_string(4 * cols) + ", dtype = \"F32\"> as #kiln.encoding<" + enc + ">\n";
  m += "func.func @decoder_prefill(%x: " + t + ") -> " + t + " attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n"
       "  %w = kiln.weight_ref @w : " + wt + "\n  %b = kiln.weight_ref @b : " + wt + "\n";
  if (layer)
    m += "  %0 = kiln.layer_norm %x, %w, %b {epsilon = 1.0e-05 : f32, kiln.kernel = \"layernorm_f32_f32_wfloat_gen\"} : " +
         t + ", " + wt + ", " + wt + " -> " + t + "\n";
  else
    m += "  %0 = kiln.rms_norm %x, %w {epsilon = 1.0e-06 : f32, kiln.kernel = \"rmsnorm_f32_f32_wfloat_gen\"} : " + t +
         ", " + wt + " -> " + t + "\n";
  return m + "  return %0 : " + t + "\n}\n";
}

TEST_F(GeneratedKernels, NormsMatchReference) {
  std::mt19937 rng(19);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  const std::pair<const char*, uint8_t> encodings[] = {
      {"f32", format::kEncF32}, {"f16", format::kEncF16}, {"bf16", format::kEncBF16}};
  int compared = 0;
  for (const Target& target : RunnableTargets()) {
    for (bool layer : {false, true}) {
      for (const auto& [label, enc] : encodings) {
        for (int64_t cols : {1, 7, 16, 64, 100, 577}) {
          SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " +
                       (layer ? "layer norm " : "rms norm ") + label + ", cols " + std::to_string(cols));
          const std::string model = NormModel(layer, cols, label);
          mlir::OwningOpRef<mlir::ModuleOp> probe = mlir::parseSourceString<mlir::ModuleOp>(model, &ctx_);
          ASSERT_TRUE(probe);
          mlir::Operation* norm = nullptr;
          probe->walk([&](mlir::Operation* op) {
            if (llvm::isa<RmsNormOp, LayerNormOp>(op)) norm = op;
          });
          std::string why;
          if (!generatorSupports(norm, layer ? "layernorm_f32_f32_wfloat_gen" : "rmsnorm_f32_f32_wfloat_gen", target,
                                 &why)) {
            EXPECT_EQ(enc, format::kEncF16) << why;  // f16 without F16C
            continue;
          }
          rt::CodeImage image;
          auto* fn = LoadGenerated<void(const kiln_uk_norm_params_t*, int64_t, int64_t, float*)>(ctx_, model, target,
                                                                                                 &image);
          ASSERT_NE(fn, nullptr);
          const int64_t rows = 9;
          std::vector<float> x(rows * cols), wv(cols), bv(cols), want(rows * cols + 1, 0.0f),
              got(rows * cols + 1, 0.0f), scratch(2 * cols);
          // Rows with an offset, so that the layer norm's mean matters.
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < cols; ++i) x[r * cols + i] = value(rng) + static_cast<float>(r) * 10.0f;
          for (float& v : wv) v = value(rng);
          for (float& v : bv) v = value(rng);
          std::vector<uint8_t> wbytes = Encode(wv, enc), bbytes = Encode(bv, enc);
          kiln_uk_norm_params_t p = {};
          p.x = x.data();
          p.y = want.data();
          p.cols = cols;
          p.epsilon = layer ? 1e-5f : 1e-6f;
          p.weight = {wbytes.data(), cols, 1, enc, 1, 0, 0, 0};
          if (layer) p.bias = {bbytes.data(), cols, 1, enc, 1, 0, 0, 0};
          (layer ? kiln_uk_layernorm_f32_f32_wfloat_ref_portable : kiln_uk_rmsnorm_f32_f32_wfloat_ref_portable)(
              &p, 0, rows, scratch.data());
          p.y = got.data();
          fn(&p, 0, 4, nullptr);
          fn(&p, 4, rows, nullptr);
          for (int64_t i = 0; i < rows * cols; ++i)
            ASSERT_LE(std::fabs(got[i] - want[i]), 2e-6 * (1.0 + std::fabs(want[i]))) << "element " << i;
          ASSERT_EQ(got[rows * cols], 0.0f) << "wrote past the end";
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(compared, 2 * 2 * 6);
}

// A one-op attention model (within its inputs) bound to the generated kernel.
std::string AttentionModel(int64_t heads, int64_t kv, int64_t hd) {
  const std::string tq = "tensor<?x" + std::to_string(heads * hd) + "xf32>",
                    tk = "tensor<?x" + std::to_string(kv * hd) + "xf32>";
  return "func.func @vision_encoder(%q: " + tq + ", %k: " + tk + ", %v: " + tk + ") -> " + tq +
         " attributes {kiln.stage = #kiln.stage<vision_encoder>} {\n"
         "  %0 = kiln.attention %q, %k, %v {num_heads = " + std::to_string(heads) + " : i64, num_kv_heads = " +
         std::to_string(kv) + " : i64, head_dim = " + std::to_string(hd) +
         " : i64, scale = 1.250000e-01 : f64, kiln.kernel = \"attention_f32_f32_f32_gen\"} : " + tq + ", " + tk +
         ", " + tk + " -> " + tq + "\n  return %0 : " + tq + "\n}\n";
}

TEST_F(GeneratedKernels, AttentionMatchesReference) {
  struct Shape {
    int64_t heads, kv, hd;
  };
  // Head sizes of every lane count (2 .. 16) and the 8-vector passes over the head;
  // grouped-query and multi-head.
  const Shape shapes[] = {{1, 1, 8}, {4, 2, 16}, {3, 3, 64}, {8, 2, 128}, {2, 1, 72}, {2, 2, 6}};
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (const Target& target : RunnableTargets()) {
    for (const Shape& s : shapes) {
      rt::CodeImage image;
      auto* fn = LoadGenerated<void(const kiln_uk_attention_params_t*, int64_t, int64_t, float*)>(
          ctx_, AttentionModel(s.heads, s.kv, s.hd), target, &image);
      ASSERT_NE(fn, nullptr);
      // Within the inputs (all keys or causal), over a KV cache at positions, and
      // within the inputs with enough rows for the tiled path (all keys or causal:
      // 77 rows, short tiles, keys past the vector multiple; mode 5: scores of
      // hundreds, where exp overflows unless each row's max is exact).
      for (int mode = 0; mode < 6; ++mode) {
        SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + std::to_string(s.heads) + "x" +
                     std::to_string(s.kv) + "x" + std::to_string(s.hd) + ", mode " + std::to_string(mode));
        const bool cached = mode == 2, causal = mode == 1 || mode == 4;
        const int64_t rows = mode >= 3 ? 77 : 9, keys = cached ? 37 : rows, ldq = s.heads * s.hd + 3,
                      ldkv = s.kv * s.hd + 5, ldy = s.heads * s.hd + 1;
        std::vector<float> q(rows * ldq), k(keys * ldkv), v(keys * ldkv), want(rows * ldy, 0.0f),
            got(rows * ldy, 0.0f);
        for (float& x : q) x = value(rng) * (mode == 5 ? 60.0f : 1.0f);
        for (float& x : k) x = value(rng);
        for (float& x : v) x = value(rng);
        std::vector<int32_t> pos(rows);
        for (int64_t t = 0; t < rows; ++t) pos[t] = static_cast<int32_t>(t == 0 ? keys - 1 : rng() % keys);
        kiln_uk_attention_params_t p = {};
        p.q = q.data();
        p.ldq = ldq;
        p.k = k.data();
        p.v = v.data();
        p.ldkv = ldkv;
        p.y = want.data();
        p.ldy = ldy;
        p.heads = s.heads;
        p.kv_heads = s.kv;
        p.head_dim = s.hd;
        p.n_keys = keys;
        p.scale = 0.125f;
        p.causal = causal;
        p.positions = cached ? pos.data() : nullptr;
        std::vector<float> scratch(KILN_UK_ATTENTION_SCRATCH(keys, s.hd, cached));
        kiln_uk_attention_f32_f32_f32_ref_portable(&p, 0, rows * s.heads, scratch.data());
        p.y = got.data();
        const int64_t split = rows * s.heads / 3;
        fn(&p, 0, split, scratch.data());
        fn(&p, split, rows * s.heads, scratch.data());
        // A row's result does not depend on how the tasks are split (the heads of one
        // KV head run together when the range holds them all, else one by one).
        std::vector<float> whole(rows * ldy, 0.0f);
        p.y = whole.data();
        fn(&p, 0, rows * s.heads, scratch.data());
        ASSERT_EQ(std::memcmp(whole.data(), got.data(), whole.size() * 4), 0) << "split and whole ranges differ";
        for (int64_t t = 0; t < rows; ++t)
          for (int64_t i = 0; i < ldy; ++i) {
            if (i >= s.heads * s.hd) {
              ASSERT_EQ(got[t * ldy + i], 0.0f) << "wrote past the heads";
              continue;
            }
            // The tiled path sums its 77 keys' probabilities and values in another
            // order than the reference: a bound that grows with the keys summed.
            // Mode 5 sums scores of hundreds: their rounding is larger.
            const double tol = (mode == 5 ? 1e-3 : mode >= 3 ? 1e-5 : 2e-6) * (1.0 + std::fabs(want[t * ldy + i]));
            ASSERT_LE(std::fabs(got[t * ldy + i] - want[t * ldy + i]), tol) << "row " << t << ", column " << i;
          }
      }
    }
  }
}

// A one-op attention over the KV cache of a module whose cache is `kv`
// (#kiln.kv_cache<...>).
std::string CachedAttentionModel(int64_t heads, int64_t kv, int64_t hd, const std::string& cache) {
  const std::string tq = "tensor<?x" + std::to_string(heads * hd) + "xf32>",
                    tk = "tensor<?x" + std::to_string(kv * hd) + "xf32>";
  return "module attributes {kiln.kv_cache = " + cache + "} {\n"
         "func.func @decoder_prefill(%q: " + tq + ", %k: " + tk + ", %v: " + tk + ", %pos: tensor<?xi32>) -> " + tq +
         " attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n"
         "  %0 = kiln.attention %q, %k, %v positions(%pos) {num_heads = " + std::to_string(heads) +
         " : i64, num_kv_heads = " + std::to_string(kv) + " : i64, head_dim = " + std::to_string(hd) +
         " : i64, scale = 1.250000e-01 : f64, causal, cache_layer = 0 : i64, kiln.kernel = \"attention_f32_f32_f32_gen\"} : " +
         tq + ", " + tk + ", " + tk + ", tensor<?xi32> -> " + tq + "\n  return %0 : " + tq + "\n}\n}\n";
}

// Generated attention reading an f16, int8 or int4 cache (the module's encoding)
// against the reference reading the same bytes; int8 and int4 caches of a power-of-two
// group with spans (keys per channel over complete spans, each row's own span exact).
TEST_F(GeneratedKernels, AttentionReadsEncodedKvCache) {
  struct Shape {
    int64_t heads, kv, hd;
  };
  const Shape shapes[] = {{4, 2, 64}, {8, 2, 128}, {2, 1, 72}, {2, 2, 16}};
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  int compared = 0;
  for (const Target& target : RunnableTargets())
    for (const Shape& s : shapes)
      for (auto [enc, custom] : {std::pair{format::kEncF16, 0u}, std::pair{format::kEncINT8, 0u},
                                 std::pair{format::kEncINT4, 0u}, std::pair{format::kEncINT8, 8u},
                                 std::pair{format::kEncINT4, 8u}}) {
        // The group kiln-compile picks, or one of 8 channels (any divisor of head_dim is
        // valid IR): narrower than the vector, so the lanes must follow it.
        const uint32_t group = custom ? custom : format::KvDefaultGroup(enc, static_cast<uint32_t>(s.hd));
        const std::string cache = std::string("#kiln.kv_cache<") + format::EncodingName(enc) +
                                  (group ? ", group = " + std::to_string(group) : std::string()) + ">";
        SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + std::to_string(s.heads) + "x" +
                     std::to_string(s.kv) + "x" + std::to_string(s.hd) + ", " + cache);
        rt::CodeImage image;
        auto* fn = LoadGenerated<void(const kiln_uk_attention_params_t*, int64_t, int64_t, float*)>(
            ctx_, CachedAttentionModel(s.heads, s.kv, s.hd, cache), target, &image);
        ASSERT_NE(fn, nullptr);
        const int64_t rows = 5, keys = 41, ldq = s.heads * s.hd, width = s.kv * s.hd, ldy = s.heads * s.hd;
        const uint64_t rowBytes = format::KvRowBytes(enc, width), rowScales = format::KvRowScales(enc, width, group);
        std::vector<float> q(rows * ldq), kf(keys * width), vf(keys * width), want(rows * ldy), got(rows * ldy);
        std::vector<uint8_t> kc(keys * rowBytes), vc(keys * rowBytes);
        std::vector<float> ks(keys * rowScales + 1), vs(keys * rowScales + 1);
        for (float& x : q) x = value(rng);
        for (float& x : kf) x = value(rng);
        for (float& x : vf) x = value(rng);
        const bool spans = enc != format::kEncF16 && (group & (group - 1)) == 0;
        for (int64_t j = 0; j < keys; ++j) {
          format::EncodeKvRow(enc, group, kf.data() + j * width, width, kc.data() + j * rowBytes, ks.data() + j * rowScales);
          format::EncodeKvRow(enc, group, vf.data() + j * width, width, vc.data() + j * rowBytes, vs.data() + j * rowScales);
        }
        for (int64_t s0 = 0; spans && s0 + group <= keys; s0 += group)
          format::EncodeKeySpan(enc, group, kf.data() + s0 * width, width, group, width, kc.data() + s0 * rowBytes,
                                ks.data() + s0 * rowScales);
        std::vector<int32_t> pos(rows);
        for (int64_t t = 0; t < rows; ++t) pos[t] = static_cast<int32_t>(t == 0 ? keys - 1 : rng() % keys);
        kiln_uk_attention_params_t p = {};
        p.q = q.data();
        p.ldq = ldq;
        p.ldkv = width;
        p.y = want.data();
        p.ldy = ldy;
        p.heads = s.heads;
        p.kv_heads = s.kv;
        p.head_dim = s.hd;
        p.n_keys = keys;
        p.scale = 0.125f;
        p.positions = pos.data();
        p.kv_encoding = enc;
        p.kv_group = static_cast<int32_t>(group);
        p.kc = kc.data();
        p.vc = vc.data();
        p.ks = ks.data();
        p.vs = vs.data();
        if (spans) {
          p.kv_span = static_cast<int32_t>(group);
          p.kr = kf.data();
          p.vr = vf.data();
        }
        std::vector<float> scratch(KILN_UK_ATTENTION_SCRATCH(keys, s.hd, 1));
        kiln_uk_attention_f32_f32_f32_ref_portable(&p, 0, rows * s.heads, scratch.data());
        p.y = got.data();
        fn(&p, 0, rows * s.heads, scratch.data());
        for (int64_t i = 0; i < rows * ldy; ++i)
          ASSERT_LE(std::fabs(got[i] - want[i]), 2e-6 * (1.0 + std::fabs(want[i]))) << "element " << i;
        // Split at odd tasks (groups of heads cut): the same bytes.
        std::vector<float> split(rows * ldy);
        p.y = split.data();
        const int64_t tasks = rows * s.heads, a = tasks / 3 | 1, c = std::max(a, 2 * tasks / 3 + 1);
        fn(&p, 0, a, scratch.data());
        fn(&p, a, c, scratch.data());
        fn(&p, c, tasks, scratch.data());
        ASSERT_EQ(std::memcmp(split.data(), got.data(), got.size() * 4), 0) << "split and whole ranges differ";
        ++compared;
      }
  EXPECT_GE(compared, 20);
}

// A one-op embedding model: rows of a [rows, cols] table of `encoding`.
std::string EmbeddingModel(int64_t rows, int64_t cols, const std::string& encoding, const char* layout = nullptr) {
  const std::string t = "tensor<" + std::to_string(rows) + "x" + std::to_string(cols) + "xf32>",
                    out = "tensor<?x" + std::to_string(cols) + "xf32>";
  return "kiln.weight @t : " + t + " from #kiln.source<\"m.safetensors\", offset = 0, size = " +
         std::to_string(4 * rows * cols) + ", dtype = \"F32\"> as #kiln.encoding<" + encoding + ">" +
         (layout ? std::string(" layout #kiln.layout<") + layout + ">" : std::string()) + "\n"
         "func.func @decoder_prefill(%ids: tensor<?xi32>) -> " + out +
         " attributes {kiln.stage = #kiln.stage<decoder_prefill>} {\n  %t = kiln.weight_ref @t : " + t +
         "\n  %0 = kiln.embedding %t, %ids {placeholder_id = 999 : i64, kiln.kernel = \"embedding_f32_i32_wany_gen\"} : " +
         t + ", tensor<?xi32> -> " + out + "\n  return %0 : " + out + "\n}\n";
}

TEST_F(GeneratedKernels, GatherMatchesReference) {
  struct Case {
    const char* encoding;
    uint8_t id;
    int64_t group;
    bool symmetric;
    bool packed = false;  // int4_p16k8 (a table tied to a W4A8 LM head)
  };
  const Case cases[] = {{"f32", format::kEncF32, 0, true},        {"f16", format::kEncF16, 0, true},
                        {"bf16", format::kEncBF16, 0, true},      {"fp8_e4m3", format::kEncFP8_E4M3, 0, true},
                        {"fp8_e5m2", format::kEncFP8_E5M2, 0, true}, {"int8", format::kEncINT8, 0, true},
                        {"int4, group = 32", format::kEncINT4, 32, true},
                        {"int4, group = 32, asym", format::kEncINT4, 32, false},
                        {"int4, group = 32", format::kEncINT4, 32, true, true},
                        {"int4, group = 64", format::kEncINT4, 64, true, true}};
  std::mt19937 rng(29);
  const int64_t rows = 50;  // panels of 16: the last one has 2 rows
  int compared = 0;
  for (const Target& target : RunnableTargets()) {
    for (const Case& cs : cases) {
      // Column counts with a vector tail (not for int4: its groups are whole vectors).
      for (int64_t cols : {64, 96, 37}) {
        if (cs.id == format::kEncINT4 && cols % 32 != 0) continue;
        if (cs.group > 0 && cols % cs.group != 0) continue;
        SCOPED_TRACE(target.triple + " (" + featureList(target.features) + "), " + cs.encoding +
                     (cs.packed ? " int4_p16k8" : "") + ", cols " + std::to_string(cols));
        const std::string model = EmbeddingModel(rows, cols, cs.encoding, cs.packed ? "int4_p16k8" : nullptr);
        mlir::OwningOpRef<mlir::ModuleOp> probe = mlir::parseSourceString<mlir::ModuleOp>(model, &ctx_);
        ASSERT_TRUE(probe);
        mlir::Operation* emb = nullptr;
        probe->walk([&](EmbeddingOp op) { emb = op; });
        std::string why;
        if (!generatorSupports(emb, "embedding_f32_i32_wany_gen", target, &why)) {
          EXPECT_EQ(target.features & format::kCpuX86F16c, 0u) << why;  // f16 / int4 scales without F16C
          continue;
        }
        rt::CodeImage image;
        auto* fn = LoadGenerated<void(const kiln_uk_gather_params_t*, int64_t, int64_t, float*)>(ctx_, model, target,
                                                                                                 &image);
        ASSERT_NE(fn, nullptr);
        // Table bytes: random codes (every fp8 code, NaN and inf included), then
        // the encoding's scales.
        std::vector<uint8_t> table;
        if (cs.id == format::kEncINT8 || cs.id == format::kEncINT4) {
          table = RandomIntWeight(rng, cs.id, rows, cols, cs.group, cs.symmetric);
        } else {
          format::EncodingSpec spec;
          spec.id = cs.id;
          table.resize(format::StorageBytes(spec, rows, cols));
          if (cs.id == format::kEncF32 || cs.id == format::kEncF16 || cs.id == format::kEncBF16) {
            std::vector<float> v(rows * cols);
            std::uniform_real_distribution<float> value(-3.0f, 3.0f);
            for (float& x : v) x = value(rng);
            table = Encode(v, cs.id);
          } else {
            for (int64_t i = 0; i < rows * cols; ++i) table[i] = static_cast<uint8_t>(rng());
            for (int64_t r = 0; r < rows; ++r) {
              float sc = 0.01f * static_cast<float>(1 + r);
              std::memcpy(table.data() + rows * cols + 4 * r, &sc, 4);
            }
          }
        }
        std::vector<int32_t> ids = {0, 49, 999, 7, 7, 23, 999, 1, 2, 3, 48};
        const int64_t n = static_cast<int64_t>(ids.size()), ldy = cols + 2;
        std::vector<float> x(n * cols);
        for (int64_t i = 0; i < n * cols; ++i) x[i] = static_cast<float>(i % 13) - 6.0f;
        for (bool add : {false, true}) {
          // Adding to x is the position embedding's, whose tables are float.
          if (add && cs.id != format::kEncF32 && cs.id != format::kEncF16 && cs.id != format::kEncBF16) continue;
          std::vector<float> want(n * ldy, 0.0f), got(n * ldy, 0.0f), scratch(cols);
          kiln_uk_gather_params_t p = {ids.data(), 999, add ? x.data() : nullptr, want.data(), ldy, cols,
                                       {table.data(), rows, cols, cs.id, static_cast<uint8_t>(cs.symmetric), 0, 0,
                                        static_cast<uint32_t>(cs.group)}};
          kiln_uk_gather_f32_wany_ref_portable(&p, 0, n, scratch.data());
          p.y = got.data();
          std::vector<uint8_t> packed(table.size());
          if (cs.packed) {
            const format::EncodingSpec spec = {cs.id, static_cast<uint32_t>(cs.group), true};
            format::RepackInt4P16K8(true, spec, table.data(), rows, cols, packed.data());
            p.table.data = packed.data();
            p.table.layout = format::kLayoutInt4P16K8;
          }
          fn(&p, 0, 4, nullptr);
          fn(&p, 4, n, nullptr);
          for (int64_t r = 0; r < n; ++r)
            for (int64_t i = 0; i < ldy; ++i) {
              const float g = got[r * ldy + i], w = want[r * ldy + i];
              // The same exact decoding: equal bits (NaN codes stay NaN).
              ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w)))
                  << "row " << r << " (id " << ids[r] << "), column " << i << ": " << g << " vs " << w;
            }
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(compared, 6 * 3 + 3 * 2);
}

TEST_F(GeneratedKernels, ObjectIsSelfContained) {
  // The object needs nothing from outside: the loader refuses undefined symbols
  // and writable data, and compileKernels checks both before it returns.
  Compiled c;
  ASSERT_TRUE(Generate(ctx_, RopeModel(4, 16), hostTarget(), &c));
  EXPECT_EQ(c.code.symbols, std::vector<std::string>{c.symbol});
  EXPECT_EQ(c.code.triple, hostTarget().triple);
}

TEST_F(GeneratedKernels, CrossTargetsCompile) {
  // Objects for the other architecture compile (they are checked by their own
  // tests under emulation); the loader refuses a foreign machine.
  for (const char* triple : {"aarch64-linux-android", "x86_64-linux-gnu"}) {
    SCOPED_TRACE(triple);
    auto t = parseTarget(triple, "");
    ASSERT_TRUE(static_cast<bool>(t));
    Compiled c;
    ASSERT_TRUE(Generate(ctx_, RopeModel(4, 64), *t, &c));
    EXPECT_FALSE(c.code.object.empty());
    rt::CodeImage image;
    kiln_error_t err;
    kiln_status_t st = image.Load(c.code.object.data(), c.code.object.size(), &err);
    if (t->arch == hostTarget().arch) {
      EXPECT_EQ(st, KILN_OK) << err.message;
    } else {
      EXPECT_EQ(st, KILN_ERROR_ARTIFACT_CODE);
    }
  }
}

}  // namespace
}  // namespace kiln
