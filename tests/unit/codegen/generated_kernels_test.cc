// The differential test of generated kernels (ctest -L kernels-diff): every kernel
// codegen/generators emits, for shapes that exercise each vector width, compiled for
// every target this CPU can run, loaded by the runtime's code loader and compared
// with the reference micro-kernel on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "code/elf_loader.h"
#include "codegen/generators/KernelGenerator.h"
#include "dialects/kiln/KilnDialect.h"
#include "formats/kiln_format.h"
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
  for (const char* features : {"", "+avx2,+fma,+f16c", "+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl"}) {
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
