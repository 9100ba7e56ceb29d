//===- KernelGenerator.cpp - kernels generated for one model -----*- C++ -*-===//
#include "codegen/generators/KernelGenerator.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "codegen/selection/KernelRegistry.h"
#include "dialects/kiln/KilnOps.h"
#include "formats/kiln_format.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "passes/Encoding.h"
#include "passes/OpTable.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "formats/ukernel_abi.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/BinaryFormat/ELF.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Object/ELFObjectFile.h"
#include "llvm/Object/ObjectFile.h"
#include "llvm/Analysis/TargetLibraryInfo.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"

namespace kiln {

using mlir::Value;

void setModuleTarget(mlir::ModuleOp module, const Target& target) {
  module->setAttr(kTargetAttrName,
                  TargetAttr::get(module.getContext(), target.triple, featureList(target.features), target.generate));
}

llvm::Expected<Target> moduleTarget(mlir::ModuleOp module) {
  auto attr = module->getAttrOfType<TargetAttr>(kTargetAttrName);
  if (!attr)
    return parseTarget("", "");
  std::string list;
  for (llvm::StringRef f : llvm::split(attr.getFeatures(), ','))
    if (!f.empty())
      list += "+" + f.str() + ",";
  auto target = parseTarget(attr.getTriple(), list);
  if (target)
    target->generate = attr.getGenerate();
  return target;
}

namespace {

void initLLVMTargets() {
  static bool done = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
    llvm::InitializeAllAsmParsers();  // module-level assembly (smeSupportRoutines)
    return true;
  }();
  (void)done;
}

// LLVM's names of the target's features.
std::string llvmFeatures(const Target& target) {
  std::vector<std::string> out;
  for (uint64_t b = 1; b != 0; b <<= 1) {
    if (!(target.features & b))
      continue;
    llvm::StringRef name = format::CpuFeatureName(b);
    if (name == "fp16")
      name = "fullfp16";
    out.push_back("+" + name.str());
  }
  return llvm::join(out, ",");
}

// f32 lanes of the widest vector register the target has.
int64_t vectorLanes(const Target& target) {
  if (target.arch == TargetArch::X86_64) {
    if (target.features & format::kCpuX86Avx512F)
      return 16;
    if (target.features & format::kCpuX86Avx2)
      return 8;
  }
  return 4;
}

// Vector registers of the target: 32 on AArch64 (v0-v31) and with AVX-512 (zmm0-31),
// 16 on x86-64 without it. Tiles are sized so their accumulators stay in registers.
int64_t vectorRegisters(const Target& target) {
  if (target.arch == TargetArch::X86_64 && !(target.features & format::kCpuX86Avx512F))
    return 16;
  return 32;
}

// The ISA suffix of generated kernel names.
std::string isaSuffix(const Target& target) {
  if (target.arch == TargetArch::X86_64)
    return (target.features & format::kCpuX86Avx512F) ? "x86_avx512"
           : (target.features & format::kCpuX86Avx2)  ? "x86_avx2"
                                                       : "x86_64";
  return (target.features & format::kCpuArmSve) ? "arm_sve" : "arm_neon";
}

// Builds code inside one generated function: typed helpers over the LLVM
// dialect's pointers, arith and vector ops.
struct FnBuilder {
  mlir::OpBuilder& b;
  mlir::Location loc;
  mlir::Type f32, f64, i32, i64, ptr;

  FnBuilder(mlir::OpBuilder& builder, mlir::Location l)
      : b(builder), loc(l), f32(builder.getF32Type()), f64(builder.getF64Type()), i32(builder.getI32Type()),
        i64(builder.getI64Type()), ptr(mlir::LLVM::LLVMPointerType::get(builder.getContext())) {}

  Value cI64(int64_t v) { return b.create<mlir::arith::ConstantIntOp>(loc, v, 64); }
  Value splat(mlir::VectorType t, double v) {
    return b.create<mlir::arith::ConstantOp>(
        loc, mlir::DenseElementsAttr::get(t, llvm::ArrayRef<mlir::Attribute>{b.getFloatAttr(t.getElementType(), v)}));
  }
  Value splatInt(mlir::VectorType t, int64_t v) {
    return b.create<mlir::arith::ConstantOp>(
        loc, mlir::DenseElementsAttr::get(t, llvm::ArrayRef<mlir::Attribute>{b.getIntegerAttr(t.getElementType(), v)}));
  }
  // &base[index] for elements of `elem`.
  Value gep(Value base, mlir::Type elem, Value index) {
    return b.create<mlir::LLVM::GEPOp>(loc, ptr, elem, base, mlir::ValueRange{index});
  }
  // A field of a parameter struct at `offset` bytes.
  Value field(Value params, size_t offset, mlir::Type type) {
    Value at = b.create<mlir::LLVM::GEPOp>(loc, ptr, b.getI8Type(), params,
                                           llvm::ArrayRef<mlir::LLVM::GEPArg>{static_cast<int32_t>(offset)});
    return b.create<mlir::LLVM::LoadOp>(loc, type, at, /*alignment=*/8);
  }
  Value load(mlir::Type type, Value base, mlir::Type elem, Value index) {
    return b.create<mlir::LLVM::LoadOp>(loc, type, gep(base, elem, index), /*alignment=*/4);
  }
  void store(Value v, Value base, mlir::Type elem, Value index) {
    b.create<mlir::LLVM::StoreOp>(loc, v, gep(base, elem, index), /*alignment=*/4);
  }
  Value add(Value a, Value c) { return b.create<mlir::arith::AddFOp>(loc, a, c); }
  Value sub(Value a, Value c) { return b.create<mlir::arith::SubFOp>(loc, a, c); }
  Value mul(Value a, Value c) { return b.create<mlir::arith::MulFOp>(loc, a, c); }
  Value addi(Value a, Value c) { return b.create<mlir::arith::AddIOp>(loc, a, c); }
  Value muli(Value a, Value c) { return b.create<mlir::arith::MulIOp>(loc, a, c); }
  // for (i = lo; i < hi; i += step) body(i), over i64.
  template <typename F>
  void loop(Value lo, Value hi, Value step, F body) {
    auto f = b.create<mlir::scf::ForOp>(loc, lo, hi, step);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(f.getBody());
    body(f.getInductionVar());
  }

  // sin and cos of f32 lanes, correctly rounded in practice: the angle is reduced
  // by pi/2 in f64 (exact for |x| < 2^20 * pi/2 with the two-part constant), the
  // fdlibm kernel polynomials are evaluated in f64 and rounded once to f32. No
  // library calls: the code segment must be self-contained.
  std::pair<Value, Value> sinCos(Value angle, int64_t lanes) {
    auto vf64 = mlir::VectorType::get({lanes}, f64);
    auto vf32 = mlir::VectorType::get({lanes}, f32);
    auto vi32 = mlir::VectorType::get({lanes}, i32);
    Value a = b.create<mlir::arith::ExtFOp>(loc, vf64, angle);
    // k = round(a * 2/pi) by the 1.5 * 2^52 trick (no rounding instruction needed).
    Value magic = splat(vf64, 6755399441055744.0);
    Value k = sub(add(mul(a, splat(vf64, 6.36619772367581382433e-01)), magic), magic);
    Value r = sub(sub(a, mul(k, splat(vf64, 1.57079632673412561417e+00))), mul(k, splat(vf64, 6.07710050650619224932e-11)));
    Value z = mul(r, r);
    auto poly = [&](std::initializer_list<double> c) {
      Value acc;
      for (auto it = std::rbegin(c); it != std::rend(c); ++it)
        acc = acc ? add(splat(vf64, *it), mul(z, acc)) : splat(vf64, *it);
      return acc;
    };
    Value s = add(r, mul(mul(r, z),
                         poly({-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
                               2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10})));
    Value c = add(sub(splat(vf64, 1.0), mul(splat(vf64, 0.5), z)),
                  mul(mul(z, z), poly({4.16666666666666019037e-02, -1.38888888888741095749e-03,
                                       2.48015872894767294178e-05, -2.75573143513906633035e-07,
                                       2.08757232129817482790e-09, -1.13596475577881948265e-11})));
    // Quadrant q = k mod 4: odd swaps sin and cos; sin < 0 for q in {2, 3}, cos < 0
    // for q in {1, 2}.
    Value q = b.create<mlir::arith::FPToSIOp>(loc, vi32, k);
    auto bit = [&](Value v, int64_t m) {
      Value andv = b.create<mlir::arith::AndIOp>(loc, v, splatInt(vi32, m));
      return b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne, andv, splatInt(vi32, 0));
    };
    Value swap = bit(q, 1);
    Value sinNeg = bit(q, 2);
    Value cosNeg = bit(b.create<mlir::arith::AddIOp>(loc, q, splatInt(vi32, 1)), 2);
    Value sv = b.create<mlir::arith::SelectOp>(loc, swap, c, s);
    Value cv = b.create<mlir::arith::SelectOp>(loc, swap, s, c);
    sv = b.create<mlir::arith::SelectOp>(loc, sinNeg, b.create<mlir::arith::NegFOp>(loc, sv), sv);
    cv = b.create<mlir::arith::SelectOp>(loc, cosNeg, b.create<mlir::arith::NegFOp>(loc, cv), cv);
    return {b.create<mlir::arith::TruncFOp>(loc, vf32, sv), b.create<mlir::arith::TruncFOp>(loc, vf32, cv)};
  }

  Value splatLike(Value v, double c) { return splat(llvm::cast<mlir::VectorType>(v.getType()), c); }
  Value div(Value a, Value c) { return b.create<mlir::arith::DivFOp>(loc, a, c); }
  Value maxf(Value a, Value c) { return b.create<mlir::arith::MaximumFOp>(loc, a, c); }
  Value minf(Value a, Value c) { return b.create<mlir::arith::MinimumFOp>(loc, a, c); }

  // e^x of f32 lanes (Cephes expf: x = n ln2 + r, |r| <= ln2/2, a degree-6
  // polynomial, 2^n through the exponent bits), within 1 ulp on [-87, 88.7];
  // inputs are clamped there (below: ~1e-38 instead of a denormal or 0).
  Value exp(Value x) {
    auto vf = llvm::cast<mlir::VectorType>(x.getType());
    auto vi = mlir::VectorType::get(vf.getShape(), i32);
    x = minf(maxf(x, splatLike(x, -87.0)), splatLike(x, 88.7));
    // n = round(x log2 e) by the 1.5 * 2^23 trick (no rounding instruction needed).
    Value magic = splatLike(x, 12582912.0);
    Value n = sub(add(mul(x, splatLike(x, 1.44269504088896341)), magic), magic);
    Value r = sub(sub(x, mul(n, splatLike(x, 0.693359375))), mul(n, splatLike(x, -2.12194440e-4)));
    Value p = splatLike(x, 1.9875691500e-4);
    for (double c : {1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1})
      p = add(mul(p, r), splatLike(x, c));
    Value y = add(add(mul(p, mul(r, r)), r), splatLike(x, 1.0));
    Value e = b.create<mlir::arith::FPToSIOp>(loc, vi, n);
    Value bits = b.create<mlir::arith::ShLIOp>(loc, b.create<mlir::arith::AddIOp>(loc, e, splatInt(vi, 127)),
                                               splatInt(vi, 23));
    return mul(y, b.create<mlir::arith::BitcastOp>(loc, vf, bits));
  }

  // erf of f32 lanes: 1 - t e^(-z^2 + P(t)), t = 1 / (1 + z/2), z = |x| (Numerical
  // Recipes' erfc, relative error < 1.2e-7), the sign restored; absolute error
  // < 4e-7.
  Value erf(Value x) {
    Value z = b.create<mlir::math::AbsFOp>(loc, x);
    Value t = div(splatLike(x, 1.0), add(splatLike(x, 1.0), mul(splatLike(x, 0.5), z)));
    const double c[] = {-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                        0.27886807,  -1.13520398, 1.48851587, -0.82215223, 0.17087277};
    Value p = splatLike(x, c[9]);
    for (int i = 8; i >= 0; --i)
      p = add(mul(p, t), splatLike(x, c[i]));
    Value r = sub(splatLike(x, 1.0), mul(t, exp(sub(p, mul(z, z)))));
    return b.create<mlir::math::CopySignOp>(loc, r, x);
  }

  // tanh of f32 lanes: sign(x) (1 - 2 / (e^(2|x|) + 1)); absolute error ~1e-7.
  Value tanh(Value x) {
    Value z = b.create<mlir::math::AbsFOp>(loc, x);
    Value e = exp(mul(splatLike(x, 2.0), z));
    Value r = sub(splatLike(x, 1.0), div(splatLike(x, 2.0), add(e, splatLike(x, 1.0))));
    return b.create<mlir::math::CopySignOp>(loc, r, x);
  }

  // The activation `kind` (kiln_uk_activation_t) of f32 lanes, as the reference
  // writes it (runtime/kernels/reference/uk/common.h: Activate).
  Value activate(int32_t kind, Value x) {
    switch (kind) {
    case KILN_UK_SILU:
      return div(x, add(splatLike(x, 1.0), exp(b.create<mlir::arith::NegFOp>(loc, x))));
    case KILN_UK_GELU:
      return mul(mul(splatLike(x, 0.5), x), add(splatLike(x, 1.0), erf(mul(x, splatLike(x, 0.70710678118654752)))));
    case KILN_UK_GELU_TANH: {
      Value cube = mul(mul(mul(splatLike(x, 0.044715), x), x), x);
      Value u = mul(splatLike(x, 0.79788456080286536), add(x, cube));
      return mul(mul(splatLike(x, 0.5), x), add(splatLike(x, 1.0), tanh(u)));
    }
    case KILN_UK_QUICK_GELU:
      return div(x, add(splatLike(x, 1.0), exp(mul(splatLike(x, -1.702), x))));
    default: // KILN_UK_RELU
      return b.create<mlir::arith::SelectOp>(
          loc, b.create<mlir::arith::CmpFOp>(loc, mlir::arith::CmpFPredicate::OGT, x, splatLike(x, 0.0)), x,
          splatLike(x, 0.0));
    }
  }
};

// A new kernel function (params, begin, end[, scratch]) -> () in `kernels`, public
// unless `isPublic` is false.
mlir::func::FuncOp newKernel(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location loc,
                             bool scratch = false, bool isPublic = true) {
  mlir::OpBuilder b(kernels.getBodyRegion());
  b.setInsertionPointToEnd(kernels.getBody());
  auto ptr = mlir::LLVM::LLVMPointerType::get(b.getContext());
  llvm::SmallVector<mlir::Type> args = {ptr, b.getI64Type(), b.getI64Type()};
  if (scratch)
    args.push_back(ptr);
  auto fn = b.create<mlir::func::FuncOp>(loc, name, b.getFunctionType(args, {}));
  fn.addEntryBlock();
  if (!isPublic)  // a variant that a dispatcher of the module calls
    fn.setPrivate();
  return fn;
}

// A vector of type `t` at `at` (masked: lanes past the mask read 0).
Value loadVector(FnBuilder& f, mlir::VectorType t, Value at, Value mask, unsigned alignment) {
  if (!mask)
    return f.b.create<mlir::LLVM::LoadOp>(f.loc, t, at, alignment);
  Value pass = f.b.create<mlir::arith::ConstantOp>(f.loc, f.b.getZeroAttr(t));
  return f.b.create<mlir::LLVM::MaskedLoadOp>(f.loc, t, at, mask, mlir::ValueRange{pass}, alignment);
}

// Multi-vector operands and results (SME2 x4 intrinsics, NEON LD1 x4): a struct of 4
// vectors of type t, and its parts.
mlir::Type structOf4(mlir::MLIRContext* ctx, mlir::Type t) { return mlir::LLVM::LLVMStructType::getLiteral(ctx, {t, t, t, t}); }
llvm::SmallVector<Value> partsOf4(FnBuilder& f, Value v) {
  llvm::SmallVector<Value> out;
  for (int64_t i = 0; i < 4; ++i)
    out.push_back(f.b.create<mlir::LLVM::ExtractValueOp>(f.loc, v, i));
  return out;
}

// `lanes` f32 values at base[i..] (masked: lanes past the mask read 0), and the
// store back.
Value loadLanes(FnBuilder& f, mlir::VectorType t, Value base, Value i, Value mask) {
  return loadVector(f, t, f.gep(base, f.f32, i), mask, 4);
}
void storeLanes(FnBuilder& f, Value v, Value base, Value i, Value mask) {
  Value at = f.gep(base, f.f32, i);
  if (!mask)
    f.b.create<mlir::LLVM::StoreOp>(f.loc, v, at, 4);
  else
    f.b.create<mlir::LLVM::MaskedStoreOp>(f.loc, v, at, mask, 4);
}

// RoPE (kiln_uk_rope_params_t, rows [begin, end)) for the params' `heads` heads (the
// op's `heads`, or fewer: a q|k|v epilogue rotates each thread's range) of `headDim`:
//   for t: pos = positions[t]
//     for i0 in 0..half step V: (s, c) = sincos(pos * inv_freq[i0 .. i0+V))
//       for h: x1 = x[t, h*d + i0..], x2 = x[t, h*d + half + i0..]
//              y[.. i0] = x1*c - x2*s, y[.. half + i0] = x2*c + x1*s
// Angles are computed once per row and lane block and shared by the heads, as in
// the reference; the output may alias the input (every element is read before it
// is written).
void buildRope(mlir::ModuleOp kernels, llvm::StringRef name, int64_t heads, int64_t headDim, int64_t maxLanes,
               mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  const int64_t half = headDim / 2;
  int64_t lanes = 1;
  while (lanes * 2 <= maxLanes && half % (lanes * 2) == 0)
    lanes *= 2;
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  Value params = fn.getArgument(0);
  Value x = f.field(params, offsetof(kiln_uk_rope_params_t, x), f.ptr);
  Value y = f.field(params, offsetof(kiln_uk_rope_params_t, y), f.ptr);
  Value ld = f.field(params, offsetof(kiln_uk_rope_params_t, ld), f.i64);
  Value positions = f.field(params, offsetof(kiln_uk_rope_params_t, positions), f.ptr);
  Value invFreq = f.field(params, offsetof(kiln_uk_rope_params_t, inv_freq), f.ptr);
  Value width = f.muli(f.field(params, offsetof(kiln_uk_rope_params_t, heads), f.i64), f.cI64(headDim));
  f.loop(fn.getArgument(1), fn.getArgument(2), f.cI64(1), [&](Value t) {
    Value row = f.muli(t, ld);
    Value xRow = f.gep(x, f.f32, row);
    Value yRow = f.gep(y, f.f32, row);
    Value pos = b.create<mlir::arith::SIToFPOp>(loc, f.f32, f.load(f.i32, positions, f.i32, t));
    Value posV = b.create<mlir::vector::BroadcastOp>(loc, vf32, pos);
    f.loop(f.cI64(0), f.cI64(half), f.cI64(lanes), [&](Value i0) {
      Value angle = f.mul(posV, f.load(vf32, invFreq, f.f32, i0));
      std::pair<Value, Value> sc = f.sinCos(angle, lanes);
      Value s = sc.first, c = sc.second;
      f.loop(f.cI64(0), width, f.cI64(headDim), [&](Value hd) {
        Value lo = f.addi(hd, i0);
        Value hi = f.addi(lo, f.cI64(half));
        Value x1 = f.load(vf32, xRow, f.f32, lo);
        Value x2 = f.load(vf32, xRow, f.f32, hi);
        f.store(f.sub(f.mul(x1, c), f.mul(x2, s)), yRow, f.f32, lo);
        f.store(f.add(f.mul(x2, c), f.mul(x1, s)), yRow, f.f32, hi);
      });
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}


// Whether the target converts f16 to f32 in registers (x86 needs F16C; every
// AArch64 CPU has FCVTL). Without it LLVM would call a library routine.
bool hasF16Conversion(const Target& target) {
  return target.arch == TargetArch::AArch64 || (target.features & format::kCpuX86F16c);
}

// The float encodings a generated matmul decodes in registers on `target`.
uint32_t generatedMatmulEncodings(const Target& target) {
  uint32_t e = format::EncodingBit(format::kEncF32) | format::EncodingBit(format::kEncBF16);
  if (hasF16Conversion(target))
    e |= format::EncodingBit(format::kEncF16);
  return e;
}

const char* encodingTag(uint8_t enc) {
  return format::EncodingName(enc) ? format::EncodingName(enc) : "unknown";
}

// The bias of output channel n of a matmul as f32 (0 when `hasBias` is false),
// decoded by its encoding at run time: f32, bf16, and f16 when `f16` (the target
// converts it in registers).
Value matmulBias(FnBuilder& f, Value hasBias, Value biasW, Value n, bool f16) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto yieldIf = [&](Value cond, auto thenFn, auto elseFn) -> Value {
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{f.f32}, cond, true, true);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{thenFn()});
    b.setInsertionPointToStart(ifOp.elseBlock());
    b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{elseFn()});
    return ifOp.getResult(0);
  };
  auto zero = [&]() -> Value { return b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(0)); };
  return yieldIf(
      hasBias,
      [&]() -> Value {
        Value data = f.field(biasW, offsetof(kiln_uk_weight_t, data), f.ptr);
        Value enc = f.field(biasW, offsetof(kiln_uk_weight_t, encoding), b.getI8Type());
        auto is = [&](uint8_t e) {
          return b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, enc,
                                               b.create<mlir::arith::ConstantIntOp>(loc, e, 8));
        };
        auto half = [&]() -> Value { return f.load(b.getI16Type(), data, b.getI16Type(), n); };
        auto bf16 = [&]() -> Value {
          Value wide = b.create<mlir::arith::ExtUIOp>(loc, f.i32, half());
          return b.create<mlir::arith::BitcastOp>(
              loc, f.f32, b.create<mlir::arith::ShLIOp>(loc, wide, b.create<mlir::arith::ConstantIntOp>(loc, 16, 32)));
        };
        auto notF32 = [&]() -> Value {
          if (!f16)
            return bf16();
          return yieldIf(
              is(format::kEncF16),
              [&]() -> Value {
                Value h = b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), half());
                return b.create<mlir::arith::ExtFOp>(loc, f.f32, h);
              },
              bf16);
        };
        return yieldIf(is(format::kEncF32), [&]() -> Value { return f.load(f.f32, data, f.f32, n); }, notF32);
      },
      zero);
}

// The kiln_uk_matmul_params_t fields the matmul builders read, loaded at a kernel's
// entry (its arguments: the params, the output-channel range [begin, end), scratch),
// and the bias of output channel n as f32 (0 without one; f16 biases decoded when
// `f16Bias`, the target converting f16).
struct MatmulArgs {
  Value x, ldx, xq, xs, M, K, w, N, y, ldy, nBegin, nEnd;
  Value biasW, hasBias;
  Value xRows, hasRows;  // gathered activation rows (x_rows), and whether there are
  bool f16Bias;
  MatmulArgs(FnBuilder& f, mlir::func::FuncOp fn, bool f16Bias) : f16Bias(f16Bias) {
    Value params = fn.getArgument(0);
    const size_t wAt = offsetof(kiln_uk_matmul_params_t, w);
    x = f.field(params, offsetof(kiln_uk_matmul_params_t, x), f.ptr);
    ldx = f.field(params, offsetof(kiln_uk_matmul_params_t, ldx), f.i64);
    xq = f.field(params, offsetof(kiln_uk_matmul_params_t, xq), f.ptr);
    xs = f.field(params, offsetof(kiln_uk_matmul_params_t, xs), f.ptr);
    M = f.field(params, offsetof(kiln_uk_matmul_params_t, M), f.i64);
    K = f.field(params, offsetof(kiln_uk_matmul_params_t, K), f.i64);
    w = f.field(params, wAt + offsetof(kiln_uk_weight_t, data), f.ptr);
    N = f.field(params, wAt + offsetof(kiln_uk_weight_t, rows), f.i64);
    biasW = f.field(params, offsetof(kiln_uk_matmul_params_t, bias), f.ptr);
    y = f.field(params, offsetof(kiln_uk_matmul_params_t, y), f.ptr);
    ldy = f.field(params, offsetof(kiln_uk_matmul_params_t, ldy), f.i64);
    nBegin = fn.getArgument(1);
    nEnd = fn.getArgument(2);
    hasBias = f.b.create<mlir::LLVM::ICmpOp>(f.loc, mlir::LLVM::ICmpPredicate::ne, biasW,
                                             f.b.create<mlir::LLVM::ZeroOp>(f.loc, f.ptr));
    // x_rows shares its place with xs: gathered rows only with float activations.
    xRows = f.field(params, offsetof(kiln_uk_matmul_params_t, x_rows), f.ptr);
    Value null = f.b.create<mlir::LLVM::ZeroOp>(f.loc, f.ptr);
    hasRows = f.b.create<mlir::arith::AndIOp>(
        f.loc, f.b.create<mlir::LLVM::ICmpOp>(f.loc, mlir::LLVM::ICmpPredicate::ne, xRows, null),
        f.b.create<mlir::LLVM::ICmpOp>(f.loc, mlir::LLVM::ICmpPredicate::eq, xq, null));
  }
  Value bias(FnBuilder& f, Value n) const { return matmulBias(f, hasBias, biasW, n, f16Bias); }
  // Where float activation row `row` starts in x, in elements: x_rows[row] x ldx when
  // the caller passes the rows it gathers (a mixture's tokens), else row x ldx. Called
  // outside the loops over K.
  Value xRowOffset(FnBuilder& f, Value row) const {
    auto ifOp = f.b.create<mlir::scf::IfOp>(f.loc, mlir::TypeRange{f.i64}, hasRows, true, true);
    {
      mlir::OpBuilder::InsertionGuard g(f.b);
      f.b.setInsertionPointToStart(ifOp.thenBlock());
      Value index = f.load(f.i32, xRows, f.i32, row);
      f.b.create<mlir::scf::YieldOp>(f.loc, mlir::ValueRange{f.b.create<mlir::arith::ExtSIOp>(f.loc, f.i64, index)});
      f.b.setInsertionPointToStart(ifOp.elseBlock());
      f.b.create<mlir::scf::YieldOp>(f.loc, mlir::ValueRange{row});
    }
    return f.muli(ifOp.getResult(0), ldx);
  }
};

// acc + a * c, allowed to fuse and reassociate.
Value fmaContract(FnBuilder& f, Value a, Value c, Value acc) {
  auto fm = mlir::arith::FastMathFlags::contract | mlir::arith::FastMathFlags::reassoc;
  return f.b.create<mlir::arith::AddFOp>(f.loc, f.b.create<mlir::arith::MulFOp>(f.loc, a, c, fm), acc, fm);
}

// lo + (v - lo) / m * m: the end of the whole steps of m from lo towards v.
Value roundDownFrom(FnBuilder& f, Value v, Value lo, Value m) {
  Value span = f.b.create<mlir::arith::SubIOp>(f.loc, v, lo);
  return f.addi(lo, f.muli(f.b.create<mlir::arith::DivSIOp>(f.loc, span, m), m));
}

// The reduction over K of a tile: accumulators `init` carried through
// step(k, acc, mask) for k in [0, kMain) by `stride` (mask null), then once more at
// kMain under a mask of the first kTail of `maskLanes` lanes when kTail > 0.
template <typename Step>
llvm::SmallVector<Value> reduceOverK(FnBuilder& f, Value kMain, Value kTail, Value stride, int64_t maskLanes,
                                     mlir::ValueRange init, Step step) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto loop = b.create<mlir::scf::ForOp>(loc, f.cI64(0), kMain, stride, init);
  {
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(loop.getBody());
    b.create<mlir::scf::YieldOp>(loc, step(loop.getInductionVar(), loop.getRegionIterArgs(), Value()));
  }
  Value any = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sgt, kTail, f.cI64(0));
  llvm::SmallVector<mlir::Type> types;
  for (Value v : init)
    types.push_back(v.getType());
  auto tail = b.create<mlir::scf::IfOp>(loc, types, any, true, true);
  {
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(tail.thenBlock());
    auto vi1 = mlir::VectorType::get({maskLanes}, b.getI1Type());
    Value mask = b.create<mlir::vector::CreateMaskOp>(
        loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), kTail)});
    b.create<mlir::scf::YieldOp>(loc, step(kMain, loop.getResults(), mask));
    b.setInsertionPointToStart(tail.elseBlock());
    b.create<mlir::scf::YieldOp>(loc, loop.getResults());
  }
  return llvm::SmallVector<Value>(tail.getResults());
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for float weights of one encoding
// (kiln_uk_matmul_params_t, output channels [begin, end)): 4 x 4 tiles of dot
// products (rows m of x by rows n of W), `lanes`-wide partial sums reduced at the
// end, K's tail by one masked load; M and N tails by 1 x 4 and 1 x 1 tiles. Weights
// are widened in registers (f16: hardware conversion; bf16: a 16-bit shift). The
// multiply-adds may fuse (contract); sums are reassociated within a tile.
std::function<Value(Value, Value, Value)> weightLanes(FnBuilder& f, uint8_t encoding, int64_t lanes, Value params,
                                                      size_t tAt, uint8_t layout = format::kLayoutRowMajor);

void buildMatmulFloat(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, int64_t lanes, bool f16Bias,
                      bool isPublic, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  const mlir::Type welem = encoding == format::kEncF32 ? f.f32 : format::IsQuantized(encoding) ? b.getI8Type()
                                                                                              : b.getI16Type();
  auto vw = mlir::VectorType::get({lanes}, welem);
  auto fm = mlir::arith::FastMathFlags::contract | mlir::arith::FastMathFlags::reassoc;

  Value params = fn.getArgument(0);
  const MatmulArgs args(f, fn, f16Bias);
  Value x = args.x, M = args.M, K = args.K, w = args.w, y = args.y, ldy = args.ldy;
  Value nBegin = args.nBegin, nEnd = args.nEnd;
  Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4), vl = f.cI64(lanes);
  Value kMain = b.create<mlir::arith::SubIOp>(loc, K, b.create<mlir::arith::RemSIOp>(loc, K, vl));
  Value kTail = b.create<mlir::arith::SubIOp>(loc, K, kMain);

  // `lanes` weights of row base[k..] widened to f32 (masked: lanes beyond `count` are 0).
  auto widen = [&](Value raw) -> Value {
    if (encoding == format::kEncF32)
      return raw;
    if (encoding == format::kEncF16) {
      Value half = b.create<mlir::arith::BitcastOp>(loc, mlir::VectorType::get({lanes}, b.getF16Type()), raw);
      return b.create<mlir::arith::ExtFOp>(loc, vf32, half);
    }
    auto vi32 = mlir::VectorType::get({lanes}, f.i32);
    Value wide = b.create<mlir::arith::ExtUIOp>(loc, vi32, raw);
    return b.create<mlir::arith::BitcastOp>(loc, vf32,
                                            b.create<mlir::arith::ShLIOp>(loc, wide, f.splatInt(vi32, 16)));
  };
  // int8, fp8 and int4 weights (W8A16, W4A16): decoded to f32 lanes, scales applied.
  const bool quantised = format::IsQuantized(encoding);
  std::function<Value(Value, Value, Value)> decodeW;
  if (quantised)
    decodeW = weightLanes(f, encoding, lanes, params, offsetof(kiln_uk_matmul_params_t, w));
  auto loadW = [&](Value row, Value k, Value mask) -> Value {
    if (quantised)
      return decodeW(row, k, mask);
    return widen(loadVector(f, vw, f.gep(w, welem, f.addi(f.muli(row, K), k)), mask, 2));
  };
  // Activations from element offset `rowAt` (MatmulArgs::xRowOffset) of x.
  auto loadX = [&](Value rowAt, Value k, Value mask) { return loadLanes(f, vf32, x, f.addi(rowAt, k), mask); };
  auto fma = [&](Value a, Value c, Value acc) { return fmaContract(f, a, c, acc); };
  auto bias = [&](Value n) { return args.bias(f, n); };

  // One mr x nr tile at (m0, n0): dot products over K, then y = sum + bias.
  auto tile = [&](Value m0, int64_t mr, Value n0, int64_t nr) {
    const int64_t count = mr * nr;
    llvm::SmallVector<Value> init(count, f.splat(vf32, 0.0));
    llvm::SmallVector<Value> rowAt;
    for (int64_t i = 0; i < mr; ++i)
      rowAt.push_back(args.xRowOffset(f, f.addi(m0, f.cI64(i))));
    auto step = [&](Value k, mlir::ValueRange acc, Value mask) {
      llvm::SmallVector<Value> xs, ws, out;
      for (int64_t i = 0; i < mr; ++i)
        xs.push_back(loadX(rowAt[i], k, mask));
      for (int64_t r = 0; r < nr; ++r)
        ws.push_back(loadW(f.addi(n0, f.cI64(r)), k, mask));
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t r = 0; r < nr; ++r)
          out.push_back(fma(xs[i], ws[r], acc[i * nr + r]));
      return out;
    };
    llvm::SmallVector<Value> sums = reduceOverK(f, kMain, kTail, vl, lanes, init, step);
    for (int64_t i = 0; i < mr; ++i)
      for (int64_t r = 0; r < nr; ++r) {
        Value n = f.addi(n0, f.cI64(r));
        Value sum = b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD,
                                                        sums[i * nr + r], Value(), fm);
        f.store(f.add(sum, bias(n)), y, f.f32, f.addi(f.muli(f.addi(m0, f.cI64(i)), ldy), n));
      }
  };

  Value nMain = roundDownFrom(f, nEnd, nBegin, four);
  Value mMain = roundDownFrom(f, M, zero, four);
  f.loop(nBegin, nMain, four, [&](Value n0) {
    f.loop(zero, mMain, four, [&](Value m0) { tile(m0, 4, n0, 4); });
    f.loop(mMain, M, one, [&](Value m0) { tile(m0, 1, n0, 4); });
  });
  f.loop(nMain, nEnd, one, [&](Value n0) { f.loop(zero, M, one, [&](Value m0) { tile(m0, 1, n0, 1); }); });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// for (i = lo; i < hi; i += lanes) body(i, mask): whole vectors, then the tail
// under a mask (null for whole vectors).
template <typename Body>
void vectorLoop(FnBuilder& f, Value lo, Value hi, int64_t lanes, Body body) {
  mlir::OpBuilder& b = f.b;
  Value vl = f.cI64(lanes);
  Value span = b.create<mlir::arith::SubIOp>(f.loc, hi, lo);
  Value main = f.addi(lo, f.muli(b.create<mlir::arith::DivSIOp>(f.loc, span, vl), vl));
  f.loop(lo, main, vl, [&](Value i) { body(i, Value()); });
  Value rest = b.create<mlir::arith::SubIOp>(f.loc, hi, main);
  Value any = b.create<mlir::arith::CmpIOp>(f.loc, mlir::arith::CmpIPredicate::sgt, rest, f.cI64(0));
  auto ifOp = b.create<mlir::scf::IfOp>(f.loc, mlir::TypeRange{}, any, false);
  mlir::OpBuilder::InsertionGuard g(b);
  b.setInsertionPointToStart(ifOp.thenBlock());
  auto vi1 = mlir::VectorType::get({lanes}, b.getI1Type());
  Value mask = b.create<mlir::vector::CreateMaskOp>(
      f.loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(f.loc, b.getIndexType(), rest)});
  body(main, mask);
}

// Element-wise kernels (kiln_uk_eltwise_params_t, elements [begin, end)):
// y = a + b, a * b, or act(a) for one activation kind.
enum class Eltwise { Add, Mul, Act };
void buildEltwise(mlir::ModuleOp kernels, llvm::StringRef name, Eltwise kind, int32_t activation, int64_t lanes,
                  mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  Value params = fn.getArgument(0);
  Value a = f.field(params, offsetof(kiln_uk_eltwise_params_t, a), f.ptr);
  Value c = f.field(params, offsetof(kiln_uk_eltwise_params_t, b), f.ptr);
  Value y = f.field(params, offsetof(kiln_uk_eltwise_params_t, y), f.ptr);
  vectorLoop(f, fn.getArgument(1), fn.getArgument(2), lanes, [&](Value i, Value mask) {
    Value va = loadLanes(f, vf32, a, i, mask);
    Value out;
    if (kind == Eltwise::Act)
      out = f.activate(activation, va);
    else if (kind == Eltwise::Add)
      out = f.add(va, loadLanes(f, vf32, c, i, mask));
    else
      out = f.mul(va, loadLanes(f, vf32, c, i, mask));
    storeLanes(f, out, y, i, mask);
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// `lanes` elements of a float-encoded vector weight at data[i..] as f32.
Value loadFloatWeight(FnBuilder& f, uint8_t encoding, int64_t lanes, Value data, Value i, Value mask) {
  mlir::OpBuilder& b = f.b;
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  if (encoding == format::kEncF32)
    return loadLanes(f, vf32, data, i, mask);
  auto vi16 = mlir::VectorType::get({lanes}, b.getI16Type());
  Value raw = loadVector(f, vi16, f.gep(data, b.getI16Type(), i), mask, 2);
  if (encoding == format::kEncF16) {
    Value half = b.create<mlir::arith::BitcastOp>(f.loc, mlir::VectorType::get({lanes}, b.getF16Type()), raw);
    return b.create<mlir::arith::ExtFOp>(f.loc, vf32, half);
  }
  auto vi32 = mlir::VectorType::get({lanes}, f.i32);
  Value wide = b.create<mlir::arith::ExtUIOp>(f.loc, vi32, raw);
  return b.create<mlir::arith::BitcastOp>(f.loc, vf32, b.create<mlir::arith::ShLIOp>(f.loc, wide, f.splatInt(vi32, 16)));
}

// Normalisations (kiln_uk_norm_params_t, rows [begin, end)) with weights (and the
// layer norm's bias) of the given float encodings:
//   RMSNorm:   y = w * (x * (1 / sqrt(mean(x^2) + eps))), sums in f32 lanes;
//   LayerNorm: y = (x - mean) * inv * w + b, mean and variance summed in f64 lanes
//              as the reference does, inv = 1 / sqrt(var + eps) in f64.
void buildNorm(mlir::ModuleOp kernels, llvm::StringRef name, bool layerNorm, uint8_t weightEnc, uint8_t biasEnc,
               int64_t lanes, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vf64 = mlir::VectorType::get({lanes}, f.f64);
  Value params = fn.getArgument(0);
  Value x = f.field(params, offsetof(kiln_uk_norm_params_t, x), f.ptr);
  Value y = f.field(params, offsetof(kiln_uk_norm_params_t, y), f.ptr);
  Value cols = f.field(params, offsetof(kiln_uk_norm_params_t, cols), f.i64);
  Value eps = f.field(params, offsetof(kiln_uk_norm_params_t, epsilon), f.f32);
  Value w = f.field(params, offsetof(kiln_uk_norm_params_t, weight) + offsetof(kiln_uk_weight_t, data), f.ptr);
  Value bias = layerNorm
                   ? f.field(params, offsetof(kiln_uk_norm_params_t, bias) + offsetof(kiln_uk_weight_t, data), f.ptr)
                   : Value();
  Value zero = f.cI64(0);
  Value colsF = b.create<mlir::arith::SIToFPOp>(loc, layerNorm ? f.f64 : f.f32, cols);
  // The sum over the row of g(x lanes) in `t` lanes: whole vectors, then the tail
  // under a mask (its lanes past the row contribute 0).
  Value vl = f.cI64(lanes);
  Value main = f.muli(b.create<mlir::arith::DivSIOp>(loc, cols, vl), vl);
  Value rest = b.create<mlir::arith::SubIOp>(loc, cols, main);
  auto vi1 = mlir::VectorType::get({lanes}, b.getI1Type());
  Value tailMask = b.create<mlir::vector::CreateMaskOp>(
      loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), rest)});
  Value anyTail = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sgt, rest, zero);
  auto rowSum = [&](Value row, mlir::VectorType t, auto g) -> Value {
    auto loop = b.create<mlir::scf::ForOp>(loc, zero, main, vl, mlir::ValueRange{f.splat(t, 0.0)});
    {
      mlir::OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(loop.getBody());
      Value v = loadLanes(f, vf32, x, f.addi(row, loop.getInductionVar()), Value());
      b.create<mlir::scf::YieldOp>(loc, f.add(loop.getRegionIterArgs()[0], g(v)));
    }
    auto tail = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{t}, anyTail, true, true);
    {
      mlir::OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(tail.thenBlock());
      Value v = loadLanes(f, vf32, x, f.addi(row, main), tailMask);
      Value term = b.create<mlir::arith::SelectOp>(loc, tailMask, g(v), f.splat(t, 0.0));
      b.create<mlir::scf::YieldOp>(loc, f.add(loop.getResult(0), term));
      b.setInsertionPointToStart(tail.elseBlock());
      b.create<mlir::scf::YieldOp>(loc, loop.getResult(0));
    }
    return b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, tail.getResult(0));
  };
  f.loop(fn.getArgument(1), fn.getArgument(2), f.cI64(1), [&](Value r) {
    Value row = f.muli(r, cols);
    if (!layerNorm) {
      Value ss = rowSum(row, vf32, [&](Value v) { return f.mul(v, v); });
      Value inv = f.div(b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(1.0f)),
                        b.create<mlir::math::SqrtOp>(loc, f.add(f.div(ss, colsF), eps)));
      Value vinv = b.create<mlir::vector::SplatOp>(loc, vf32, inv);
      vectorLoop(f, zero, cols, lanes, [&](Value i, Value mask) {
        Value v = loadLanes(f, vf32, x, f.addi(row, i), mask);
        Value wv = loadFloatWeight(f, weightEnc, lanes, w, i, mask);
        storeLanes(f, f.mul(wv, f.mul(v, vinv)), y, f.addi(row, i), mask);
      });
      return;
    }
    Value sum = rowSum(row, vf64, [&](Value v) { return b.create<mlir::arith::ExtFOp>(loc, vf64, v); });
    Value mean = b.create<mlir::arith::TruncFOp>(loc, f.f32, f.div(sum, colsF));
    Value vmean = b.create<mlir::vector::SplatOp>(loc, vf32, mean);
    Value var = rowSum(row, vf64, [&](Value v) {
      Value d = b.create<mlir::arith::ExtFOp>(loc, vf64, f.sub(v, vmean));
      return f.mul(d, d);
    });
    Value eps64 = b.create<mlir::arith::ExtFOp>(loc, f.f64, eps);
    Value inv64 = f.div(b.create<mlir::arith::ConstantOp>(loc, b.getF64FloatAttr(1.0)),
                        b.create<mlir::math::SqrtOp>(loc, f.add(f.div(var, colsF), eps64)));
    Value vinv = b.create<mlir::vector::SplatOp>(loc, vf32, b.create<mlir::arith::TruncFOp>(loc, f.f32, inv64));
    vectorLoop(f, zero, cols, lanes, [&](Value i, Value mask) {
      Value v = loadLanes(f, vf32, x, f.addi(row, i), mask);
      Value wv = loadFloatWeight(f, weightEnc, lanes, w, i, mask);
      Value bv = loadFloatWeight(f, biasEnc, lanes, bias, i, mask);
      storeLanes(f, f.add(f.mul(f.mul(f.sub(v, vmean), vinv), wv), bv), y, f.addi(row, i), mask);
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// Attention (kiln_uk_attention_params_t, tasks [begin, end), task = row * heads +
// head) for `heads` query heads, `kvHeads` KV heads of `headDim`. Two paths, chosen
// by the problem alone (never by the range, so a row's result does not depend on how
// the tasks are split):
//  - all keys in the inputs (no KV cache; vision encoders) and at least
//    kTiledMinKeys of them: per head of the range, its keys transposed once into the
//    scratch ([head_dim][keys], zero-padded) and its values packed there (per pass of
//    the weighted sum, contiguous), then tiles of up to `tileRows` query
//    rows x 2 vectors of keys as outer products (no horizontal sums), the softmax of
//    each row's scores, and the values weighted by the probabilities summed into 4
//    rows x a few vectors of the head at a time (each value vector loaded serves 4
//    rows);
//  - over a KV cache (or few keys): per task, the row's scores q.k * scale into the
//    thread's scratch, their max, exp(score - max) summed (vectorised over keys),
//    then the values weighted by score / sum summed key by key into up to 8 vectors
//    of the head at a time. The cache is read in its encoding (`kvEncoding`, groups
//    of `kvGroup`; formats/kv_codec.h), decoded lane by lane as it is loaded: f16
//    widened (`nativeF16`: by the target's conversion instructions, else by integer
//    operations), int8 and int4 codes times their group's scale; a paged cache's
//    position j through its block table (kv_blocks), else row j. An int8 or int4
//    cache whose group is a power of two has spans of kvGroup positions
//    (kiln_uk_attention_params_t.kv_span == kvGroup, schema 1.8): keys times their
//    span's per-channel scales, and the row's own span read exactly from kr and vr.
constexpr int64_t kTiledMinKeys = 64;
void buildAttention(mlir::ModuleOp kernels, llvm::StringRef name, int64_t heads, int64_t kvHeads, int64_t headDim,
                    uint8_t kvEncoding, int64_t kvGroup, bool nativeF16, int64_t maxLanes, int64_t registers,
                    mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  // Lanes over the head: the widest power of two dividing it (and, for an int8 cache,
  // its group, so that the lanes share one scale; for an int4 cache half its group,
  // whose two halves share bytes); over keys: the widest.
  const int64_t laneUnit = kvEncoding == format::kEncINT8   ? kvGroup
                           : kvEncoding == format::kEncINT4 ? kvGroup / 2
                                                            : headDim;
  int64_t lanes = 1;
  while (lanes * 2 <= maxLanes && headDim % (lanes * 2) == 0 && laneUnit % (lanes * 2) == 0)
    lanes *= 2;
  const int64_t chunks = headDim / lanes;
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vkeys = mlir::VectorType::get({maxLanes}, f.f32);
  auto fm = mlir::arith::FastMathFlags::contract;
  Value params = fn.getArgument(0), scratch = fn.getArgument(3);
  auto field = [&](size_t offset, mlir::Type t) { return f.field(params, offset, t); };
  Value q = field(offsetof(kiln_uk_attention_params_t, q), f.ptr);
  Value ldq = field(offsetof(kiln_uk_attention_params_t, ldq), f.i64);
  Value k = field(offsetof(kiln_uk_attention_params_t, k), f.ptr);
  Value v = field(offsetof(kiln_uk_attention_params_t, v), f.ptr);
  Value ldkv = field(offsetof(kiln_uk_attention_params_t, ldkv), f.i64);
  Value y = field(offsetof(kiln_uk_attention_params_t, y), f.ptr);
  Value ldy = field(offsetof(kiln_uk_attention_params_t, ldy), f.i64);
  Value nKeys = field(offsetof(kiln_uk_attention_params_t, n_keys), f.i64);
  Value scale = field(offsetof(kiln_uk_attention_params_t, scale), f.f32);
  Value causal = field(offsetof(kiln_uk_attention_params_t, causal), f.i32);
  Value positions = field(offsetof(kiln_uk_attention_params_t, positions), f.ptr);
  // An encoded KV cache (schema 1.6): codes and scales.
  Value kCodes = field(offsetof(kiln_uk_attention_params_t, kc), f.ptr);
  Value vCodes = field(offsetof(kiln_uk_attention_params_t, vc), f.ptr);
  Value kScales = field(offsetof(kiln_uk_attention_params_t, ks), f.ptr);
  Value vScales = field(offsetof(kiln_uk_attention_params_t, vs), f.ptr);
  // A paged cache (schema 1.7): the block table and log2 of the block's positions.
  Value kvBlocks = field(offsetof(kiln_uk_attention_params_t, kv_blocks), f.ptr);
  Value kvShift = b.create<mlir::arith::ExtSIOp>(loc, f.i64, field(offsetof(kiln_uk_attention_params_t, kv_block_shift), f.i32));
  // Spans (schema 1.8): the exact rows of the row's own span.
  const bool spans = (kvEncoding == format::kEncINT8 || kvEncoding == format::kEncINT4) && kvGroup > 0 &&
                     (kvGroup & (kvGroup - 1)) == 0;
  Value kExact = field(offsetof(kiln_uk_attention_params_t, kr), f.ptr);
  Value vExact = field(offsetof(kiln_uk_attention_params_t, vr), f.ptr);
  Value exactBase = field(offsetof(kiln_uk_attention_params_t, kv_exact_from), f.i64);
  Value zero = f.cI64(0), one = f.cI64(1);
  Value hasPositions = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, positions,
                                                    b.create<mlir::LLVM::ZeroOp>(loc, f.ptr));
  Value isCausal = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne, causal,
                                                 b.create<mlir::arith::ConstantIntOp>(loc, 0, 32));
  auto fmaV = [&](Value a, Value c, Value acc) {
    return b.create<mlir::arith::AddFOp>(loc, b.create<mlir::arith::MulFOp>(loc, a, c, fm), acc, fm);
  };
  // base[j] = exp(base[j] - mx) for j in [0, count) (a multiple of maxLanes); returns
  // the lanes of their sum.
  auto expInPlace = [&](Value base, Value count, Value mx) -> Value {
    auto loop = b.create<mlir::scf::ForOp>(loc, zero, count, f.cI64(maxLanes), mlir::ValueRange{f.splat(vkeys, 0.0)});
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(loop.getBody());
    Value j = loop.getInductionVar();
    Value e = f.exp(f.sub(loadLanes(f, vkeys, base, j, Value()), mx));
    storeLanes(f, e, base, j, Value());
    b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{f.add(loop.getRegionIterArgs()[0], e)});
    return loop.getResult(0);
  };
  auto yieldIf = [&](Value cond, mlir::Type t, auto thenFn, auto elseFn) -> Value {
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{t}, cond, true, true);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<mlir::scf::YieldOp>(loc, thenFn());
    b.setInsertionPointToStart(ifOp.elseBlock());
    b.create<mlir::scf::YieldOp>(loc, elseFn());
    return ifOp.getResult(0);
  };

  // The tiled path (see above) when there is no KV cache and enough keys.
  Value tiledCond = b.create<mlir::arith::AndIOp>(
      loc, b.create<mlir::arith::XOrIOp>(loc, hasPositions, b.create<mlir::arith::ConstantIntOp>(loc, 1, 1)),
      b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, nKeys, f.cI64(kTiledMinKeys)));
  auto pathIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, tiledCond, /*withElse=*/true);
  b.setInsertionPointToStart(pathIf.thenBlock());
  {
    const int64_t tileRows = std::min<int64_t>(KILN_UK_ATTENTION_SCRATCH_ROWS, registers / 4);
    const int64_t keyStep = 2 * maxLanes;  // divides 32: the scratch rounds keys up to 32
    const int64_t groupRows = 4;
    const int64_t groupChunks = std::max<int64_t>(1, std::min<int64_t>(chunks, registers / 2 / groupRows));
    auto cmp = [&](mlir::arith::CmpIPredicate pred, Value a, Value c) {
      return b.create<mlir::arith::CmpIOp>(loc, pred, a, c).getResult();
    };
    auto sel = [&](Value c, Value a, Value d) { return b.create<mlir::arith::SelectOp>(loc, c, a, d).getResult(); };
    auto divi = [&](Value a, Value c) { return b.create<mlir::arith::DivSIOp>(loc, a, c).getResult(); };
    auto subi = [&](Value a, Value c) { return b.create<mlir::arith::SubIOp>(loc, a, c).getResult(); };
    auto mini = [&](Value a, Value c) { return b.create<mlir::arith::MinSIOp>(loc, a, c).getResult(); };
    Value begin = fn.getArgument(1), end = fn.getArgument(2);
    Value hs = f.cI64(heads);
    Value r0 = divi(begin, hs), r1 = divi(subi(end, one), hs);
    f.loop(zero, hs, one, [&](Value h) {
      // Rows [ra, rb] of head h lie in the range (the rows of one head are contiguous).
      Value ra = sel(cmp(mlir::arith::CmpIPredicate::sge, f.addi(f.muli(r0, hs), h), begin), r0, f.addi(r0, one));
      Value rb = sel(cmp(mlir::arith::CmpIPredicate::slt, f.addi(f.muli(r1, hs), h), end), r1, subi(r1, one));
      auto any = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, cmp(mlir::arith::CmpIPredicate::sle, ra, rb),
                                           /*withElse=*/false);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(any.thenBlock());
      Value kvOff = f.muli(divi(h, f.cI64(heads / kvHeads)), f.cI64(headDim));
      Value nAll = sel(isCausal, f.addi(rb, one), nKeys);
      Value ks = f.cI64(keyStep);
      Value nPad = f.muli(divi(f.addi(nAll, f.cI64(keyStep - 1)), ks), ks);
      Value kt = scratch;
      // kt's rows are nPad + 16 floats apart, so that the rows a tile reads (one per
      // head element, 64 bytes each) do not fall in one L1 set when nPad x 4 bytes is
      // a multiple of 4 KB.
      Value ktStride = f.addi(nPad, f.cI64(16));
      Value sRows = f.gep(scratch, f.f32, f.muli(f.cI64(headDim), ktStride));
      // The head's values packed after the scores (schema 1.12's larger scratch): per
      // pass of step 3 (groupChunks vectors of the head from chunk c0), its keys' lanes
      // contiguous, vp[c0 x lanes x nPad + j x cg x lanes + c x lanes + l]. Read in
      // place, rows ldkv apart (a fused q|k|v output: 9 KB), the passes hit a few
      // cache sets only and ran from L3.
      Value vp = f.gep(sRows, f.f32, f.muli(f.cI64(tileRows), nPad));
      // Keys transposed: kt[d * ktStride + j] = k[j * ldkv + kvOff + d], zeros past
      // nAll; written row by row of kt (strided loads, contiguous stores: scattered
      // stores would cost a cache line each).
      Value zeroF = b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(0.0f));
      f.loop(zero, f.cI64(headDim), one, [&](Value d) {
        Value ktRow = f.muli(d, ktStride), kCol = f.addi(kvOff, d);
        f.loop(zero, nAll, one, [&](Value j) {
          f.store(f.load(f.f32, k, f.f32, f.addi(f.muli(j, ldkv), kCol)), kt, f.f32, f.addi(ktRow, j));
        });
        f.loop(nAll, nPad, one, [&](Value j) { f.store(zeroF, kt, f.f32, f.addi(ktRow, j)); });
      });
      for (int64_t c0 = 0; c0 < chunks; c0 += groupChunks) {
        const int64_t cg = std::min<int64_t>(groupChunks, chunks - c0);
        Value base = f.muli(f.cI64(c0 * lanes), nPad);
        f.loop(zero, nAll, one, [&](Value j) {
          Value from = f.addi(f.muli(j, ldkv), f.addi(kvOff, f.cI64(c0 * lanes)));
          Value to = f.addi(base, f.muli(j, f.cI64(cg * lanes)));
          for (int64_t c = 0; c < cg; ++c)
            storeLanes(f, loadLanes(f, vf32, v, f.addi(from, f.cI64(c * lanes)), Value()), vp,
                       f.addi(to, f.cI64(c * lanes)), Value());
        });
      }
      Value scaleV = b.create<mlir::vector::SplatOp>(loc, vkeys, scale);
      f.loop(ra, f.addi(rb, one), f.cI64(tileRows), [&](Value rt) {
        Value mr = mini(f.cI64(tileRows), subi(f.addi(rb, one), rt));
        // Row r of the tile is query row rt + min(r, mr - 1): a short tile repeats its
        // last row (computed again, never stored twice differently).
        llvm::SmallVector<Value> qRowAt;
        for (int64_t r = 0; r < tileRows; ++r) {
          Value t = f.addi(rt, mini(f.cI64(r), subi(mr, one)));
          qRowAt.push_back(f.addi(f.muli(t, ldq), f.muli(h, f.cI64(headDim))));
        }
        Value last = f.addi(rt, subi(mr, one));
        Value nMax = sel(isCausal, f.addi(last, one), nKeys);
        // 1. Scores of the tile, keyStep keys at a time: rows x 2 vectors of outer products.
        f.loop(zero, nMax, ks, [&](Value j0) {
          llvm::SmallVector<Value> init(tileRows * 2, f.splat(vkeys, 0.0));
          auto dl = b.create<mlir::scf::ForOp>(loc, zero, f.cI64(headDim), one, init);
          {
            mlir::OpBuilder::InsertionGuard g2(b);
            b.setInsertionPointToStart(dl.getBody());
            Value d = dl.getInductionVar();
            Value at = f.addi(f.muli(d, ktStride), j0);
            Value k0 = loadLanes(f, vkeys, kt, at, Value());
            Value k1 = loadLanes(f, vkeys, kt, f.addi(at, f.cI64(maxLanes)), Value());
            llvm::SmallVector<Value> next;
            for (int64_t r = 0; r < tileRows; ++r) {
              Value qb = b.create<mlir::vector::SplatOp>(loc, vkeys, f.load(f.f32, q, f.f32, f.addi(qRowAt[r], d)));
              next.push_back(fmaV(qb, k0, dl.getRegionIterArgs()[2 * r]));
              next.push_back(fmaV(qb, k1, dl.getRegionIterArgs()[2 * r + 1]));
            }
            b.create<mlir::scf::YieldOp>(loc, next);
          }
          for (int64_t r = 0; r < tileRows; ++r) {
            Value sAt = f.addi(f.muli(f.cI64(r), nPad), j0);
            storeLanes(f, f.mul(dl.getResult(2 * r), scaleV), sRows, sAt, Value());
            storeLanes(f, f.mul(dl.getResult(2 * r + 1), scaleV), sRows, f.addi(sAt, f.cI64(maxLanes)), Value());
          }
        });
        // 2. Each row's probabilities over its own keys [0, n), zeros in [n, nMax).
        f.loop(zero, mr, one, [&](Value r) {
          Value t = f.addi(rt, r);
          Value n = sel(isCausal, f.addi(t, one), nKeys);
          Value s = f.gep(sRows, f.f32, f.muli(r, nPad));
          Value negInfV = f.splat(vkeys, -std::numeric_limits<double>::infinity());
          Value nMain = f.muli(divi(n, f.cI64(maxLanes)), f.cI64(maxLanes));
          // The max in 4 chains over blocks of 4 vectors, then one over the rest: a
          // NaN-propagating max is a few dependent instructions on x86, and one chain
          // ran at its latency. The max is exact, so the order does not change it.
          const int64_t maxChains = 4;
          Value nBlocks = f.muli(divi(n, f.cI64(maxChains * maxLanes)), f.cI64(maxChains * maxLanes));
          auto blockLoop = b.create<mlir::scf::ForOp>(loc, zero, nBlocks, f.cI64(maxChains * maxLanes),
                                                      llvm::SmallVector<Value>(maxChains, negInfV));
          {
            mlir::OpBuilder::InsertionGuard g2(b);
            b.setInsertionPointToStart(blockLoop.getBody());
            llvm::SmallVector<Value> next;
            for (int64_t c = 0; c < maxChains; ++c) {
              Value v = loadLanes(f, vkeys, s, f.addi(blockLoop.getInductionVar(), f.cI64(c * maxLanes)), Value());
              next.push_back(f.maxf(blockLoop.getRegionIterArgs()[c], v));
            }
            b.create<mlir::scf::YieldOp>(loc, next);
          }
          Value blockMax = f.maxf(f.maxf(blockLoop.getResult(0), blockLoop.getResult(1)),
                                  f.maxf(blockLoop.getResult(2), blockLoop.getResult(3)));
          auto maxLoop = b.create<mlir::scf::ForOp>(loc, nBlocks, nMain, f.cI64(maxLanes), mlir::ValueRange{blockMax});
          {
            mlir::OpBuilder::InsertionGuard g2(b);
            b.setInsertionPointToStart(maxLoop.getBody());
            Value v = loadLanes(f, vkeys, s, maxLoop.getInductionVar(), Value());
            b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{f.maxf(maxLoop.getRegionIterArgs()[0], v)});
          }
          // The tail of the row: its lanes past n count as -inf (max) and 0 (sum).
          auto vi1 = mlir::VectorType::get({maxLanes}, b.getI1Type());
          Value tailMask = b.create<mlir::vector::CreateMaskOp>(
              loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), subi(n, nMain))});
          Value tail = loadLanes(f, vkeys, s, nMain, tailMask);
          Value vmax = f.maxf(maxLoop.getResult(0), sel(tailMask, tail, negInfV));
          Value mx = b.create<mlir::vector::SplatOp>(
              loc, vkeys,
              b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::MAXIMUMF, vmax));
          Value sums = expInPlace(s, nMain, mx);
          Value eTail = sel(tailMask, f.exp(f.sub(tail, mx)), f.splat(vkeys, 0.0));
          Value sum = b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, f.add(sums, eTail), Value(),
                                                          mlir::arith::FastMathFlags::reassoc);
          Value inv = b.create<mlir::vector::SplatOp>(
              loc, vkeys, f.div(b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(1.0f)), sum));
          f.loop(zero, nMain, f.cI64(maxLanes), [&](Value j) {
            storeLanes(f, f.mul(loadLanes(f, vkeys, s, j, Value()), inv), s, j, Value());
          });
          storeLanes(f, f.mul(eTail, inv), s, nMain, tailMask);
          f.loop(n, nMax, one, [&](Value j) { f.store(zeroF, s, f.f32, j); });
        });
        // 3. out[row] = sum_j p[row][j] v_j, groupRows rows x groupChunks vectors of the
        // head per pass over the keys.
        f.loop(zero, mr, f.cI64(groupRows), [&](Value g0) {
          llvm::SmallVector<Value> sAt, yAt;
          for (int64_t gr = 0; gr < groupRows; ++gr) {
            Value r = f.addi(g0, mini(f.cI64(gr), subi(subi(mr, g0), one)));
            sAt.push_back(f.muli(r, nPad));
            yAt.push_back(f.addi(f.muli(f.addi(rt, r), ldy), f.muli(h, f.cI64(headDim))));
          }
          for (int64_t c0 = 0; c0 < chunks; c0 += groupChunks) {
            const int64_t cg = std::min<int64_t>(groupChunks, chunks - c0);
            llvm::SmallVector<Value> init(groupRows * cg, f.splat(vf32, 0.0));
            auto acc = b.create<mlir::scf::ForOp>(loc, zero, nMax, one, init);
            {
              mlir::OpBuilder::InsertionGuard g2(b);
              b.setInsertionPointToStart(acc.getBody());
              Value j = acc.getInductionVar();
              Value vRow = f.addi(f.muli(f.cI64(c0 * lanes), nPad), f.muli(j, f.cI64(cg * lanes)));
              llvm::SmallVector<Value> vv;
              for (int64_t c = 0; c < cg; ++c)
                vv.push_back(loadLanes(f, vf32, vp, f.addi(vRow, f.cI64(c * lanes)), Value()));
              llvm::SmallVector<Value> next;
              for (int64_t gr = 0; gr < groupRows; ++gr) {
                Value w = b.create<mlir::vector::SplatOp>(loc, vf32, f.load(f.f32, sRows, f.f32, f.addi(sAt[gr], j)));
                for (int64_t c = 0; c < cg; ++c)
                  next.push_back(fmaV(w, vv[c], acc.getRegionIterArgs()[gr * cg + c]));
              }
              b.create<mlir::scf::YieldOp>(loc, next);
            }
            for (int64_t gr = 0; gr < groupRows; ++gr)
              for (int64_t c = 0; c < cg; ++c)
                storeLanes(f, acc.getResult(gr * cg + c), y, f.addi(yAt[gr], f.cI64((c0 + c) * lanes)), Value());
          }
        });
      });
    });
  }
  b.setInsertionPointToStart(pathIf.elseBlock());

  // Row t's heads h0 .. h0 + R - 1, which share one KV head: each key and value is
  // loaded and decoded once for the R heads; each head's arithmetic is what it would be
  // alone, so that a row's result does not depend on how the tasks are split.
  auto attendHeads = [&](Value t, Value h0, int64_t R) {
    Value kvh = b.create<mlir::arith::DivSIOp>(loc, h0, f.cI64(heads / kvHeads));
    // Keys [0, n): positions[t] + 1 over a KV cache, t + 1 when causal, else all.
    Value n = yieldIf(
        hasPositions, f.i64,
        [&] {
          Value p = f.load(f.i32, positions, f.i32, t);
          return f.addi(b.create<mlir::arith::ExtSIOp>(loc, f.i64, p), one);
        },
        [&] { return b.create<mlir::arith::SelectOp>(loc, isCausal, f.addi(t, one), nKeys).getResult(); });
    // Per head r: its query, its scores' row of the scratch (KILN_UK_ATTENTION_SCRATCH
    // has room for KILN_UK_ATTENTION_SCRATCH_ROWS rows of n_keys), its output.
    llvm::SmallVector<Value> qRow, sRow, yRow;
    for (int64_t r = 0; r < R; ++r) {
      Value h = f.addi(h0, f.cI64(r));
      qRow.push_back(f.addi(f.muli(t, ldq), f.muli(h, f.cI64(headDim))));
      sRow.push_back(r == 0 ? scratch : f.gep(scratch, f.f32, f.muli(f.cI64(r), nKeys)));
      yRow.push_back(f.addi(f.muli(t, ldy), f.muli(h, f.cI64(headDim))));
    }
    Value kvOff = f.muli(kvh, f.cI64(headDim));
    // Keys [0, n) block by block: a paged cache's block (2^shift positions) starts at
    // row kv_blocks[j >> shift] << shift, looked up once per block; unpaged, one block
    // of all n keys from row 0. `body(j, row, args)` returns the loop's next values.
    Value paged = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, kvBlocks,
                                               b.create<mlir::LLVM::ZeroOp>(loc, f.ptr));
    Value blockLen = b.create<mlir::arith::SelectOp>(loc, paged, b.create<mlir::arith::ShLIOp>(loc, one, kvShift),
                                                     b.create<mlir::arith::MaxSIOp>(loc, n, one));
    // Keys [0, nq) from the cache; with spans [nq, n) (the row's own span) exact.
    Value nq = n;
    if (spans) {
      Value at = f.addi(n, f.cI64(-1));
      Value start = b.create<mlir::arith::SubIOp>(loc, at, b.create<mlir::arith::AndIOp>(loc, at, f.cI64(kvGroup - 1)));
      nq = b.create<mlir::arith::SelectOp>(loc, hasPositions, b.create<mlir::arith::MinSIOp>(loc, start, n), n);
    }
    auto forKeys = [&](mlir::ValueRange init,
                       const std::function<llvm::SmallVector<Value>(Value, Value, mlir::ValueRange)>& body) {
      auto outer = b.create<mlir::scf::ForOp>(loc, zero, nq, blockLen, init);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(outer.getBody());
      Value j0 = outer.getInductionVar();
      // row = j + delta for the keys of this block.
      Value delta = yieldIf(
          paged, f.i64,
          [&] {
            Value blk = f.load(f.i32, kvBlocks, f.i32, b.create<mlir::arith::ShRSIOp>(loc, j0, kvShift));
            Value base = b.create<mlir::arith::ShLIOp>(loc, b.create<mlir::arith::ExtSIOp>(loc, f.i64, blk), kvShift);
            return b.create<mlir::arith::SubIOp>(loc, base, j0).getResult();
          },
          [&] { return zero; });
      Value j1 = b.create<mlir::arith::MinSIOp>(loc, f.addi(j0, blockLen), nq);
      auto inner = b.create<mlir::scf::ForOp>(loc, j0, j1, one, outer.getRegionIterArgs());
      {
        mlir::OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(inner.getBody());
        Value j = inner.getInductionVar();
        b.create<mlir::scf::YieldOp>(loc, body(j, f.addi(j, delta), inner.getRegionIterArgs()));
      }
      b.create<mlir::scf::YieldOp>(loc, inner.getResults());
      if (!spans) return llvm::SmallVector<Value>(outer.getResults());
      // The exact keys: `body(j, null row, args)` (read kr / vr).
      b.setInsertionPointAfter(outer);
      auto exact = b.create<mlir::scf::ForOp>(loc, nq, n, one, outer.getResults());
      b.setInsertionPointToStart(exact.getBody());
      Value j = exact.getInductionVar();
      b.create<mlir::scf::YieldOp>(loc, body(j, Value(), exact.getRegionIterArgs()));
      b.setInsertionPointAfter(exact);
      return llvm::SmallVector<Value>(exact.getResults());
    };
    // Lanes c of the head in the key (`key`) or value of position pos, as f32: row j
    // of the cache, or with a null j the exact row of a span being filled.
    auto kvLanes = [&](bool key, Value pos, Value j, int64_t c) -> Value {
      Value f32Rows = key ? k : v, codes = key ? kCodes : vCodes, scales = key ? kScales : vScales;
      Value e = f.addi(kvOff, f.cI64(c * lanes));  // element in the row
      if (!j)
        return loadLanes(f, vf32, key ? kExact : vExact,
                         f.addi(f.muli(b.create<mlir::arith::SubIOp>(loc, pos, exactBase), ldkv), e), Value());
      switch (kvEncoding) {
      case format::kEncF16: {
        auto i16 = b.getI16Type();
        Value raw = loadVector(f, mlir::VectorType::get({lanes}, i16), f.gep(codes, i16, f.addi(f.muli(j, ldkv), e)),
                               Value(), 2);
        if (nativeF16) {
          Value half = b.create<mlir::arith::BitcastOp>(loc, mlir::VectorType::get({lanes}, b.getF16Type()), raw);
          return b.create<mlir::arith::ExtFOp>(loc, vf32, half);
        }
        // Without f16 conversion instructions (x86 before F16C), exactly: the
        // exponent and mantissa bits moved into an f32's and rescaled by 2^112
        // (subnormals included), infinities and NaNs given the f32 exponent, the sign
        // put back.
        auto vi32 = mlir::VectorType::get({lanes}, f.i32);
        Value h = b.create<mlir::arith::ExtUIOp>(loc, vi32, raw);
        Value mag = b.create<mlir::arith::AndIOp>(loc, h, f.splatInt(vi32, 0x7fff));
        Value sign = b.create<mlir::arith::ShLIOp>(loc, b.create<mlir::arith::AndIOp>(loc, h, f.splatInt(vi32, 0x8000)),
                                                   f.splatInt(vi32, 16));
        Value shifted = b.create<mlir::arith::ShLIOp>(loc, mag, f.splatInt(vi32, 13));
        Value scaled = b.create<mlir::arith::BitcastOp>(
            loc, vi32,
            f.mul(b.create<mlir::arith::BitcastOp>(loc, vf32, shifted), f.splat(vf32, 5.192296858534828e33)));
        Value special = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::uge, mag, f.splatInt(vi32, 0x7c00));
        Value infNan = b.create<mlir::arith::OrIOp>(loc, shifted, f.splatInt(vi32, 0x7f800000));
        Value bits = b.create<mlir::arith::SelectOp>(loc, special, infNan, scaled);
        return b.create<mlir::arith::BitcastOp>(loc, vf32, b.create<mlir::arith::OrIOp>(loc, bits, sign));
      }
      case format::kEncINT8:
      case format::kEncINT4: {
        auto i8 = b.getI8Type();
        auto v8 = mlir::VectorType::get({lanes}, i8);
        // kvOff is a multiple of head_dim, so of the group: the lanes' place in their
        // group is known here.
        const int64_t inGroup = (c * lanes) % kvGroup, half = kvGroup / 2;
        Value groupIdx = f.addi(b.create<mlir::arith::DivSIOp>(loc, kvOff, f.cI64(kvGroup)), f.cI64(c * lanes / kvGroup));
        Value rowScales = b.create<mlir::arith::DivSIOp>(loc, ldkv, f.cI64(kvGroup));
        Value vscale;
        if (spans && key) {  // the span's scale per channel, in the slots of its rows
          Value spanRow = b.create<mlir::arith::SubIOp>(loc, j, b.create<mlir::arith::AndIOp>(loc, pos, f.cI64(kvGroup - 1)));
          vscale = loadLanes(f, vf32, scales, f.addi(f.muli(spanRow, rowScales), e), Value());
        } else {
          Value sc = f.load(f.f32, scales, f.f32, f.addi(f.muli(j, rowScales), groupIdx));
          vscale = b.create<mlir::vector::SplatOp>(loc, vf32, sc);
        }
        if (kvEncoding == format::kEncINT8) {
          Value raw = loadVector(f, v8, f.gep(codes, i8, f.addi(f.muli(j, ldkv), e)), Value(), 1);
          return f.mul(b.create<mlir::arith::SIToFPOp>(loc, vf32, raw), vscale);
        }
        Value rowBytes = b.create<mlir::arith::DivSIOp>(loc, ldkv, f.cI64(2));
        Value at = f.addi(f.addi(f.muli(j, rowBytes), f.muli(groupIdx, f.cI64(half))),
                          f.cI64(inGroup < half ? inGroup : inGroup - half));
        auto vi32 = mlir::VectorType::get({lanes}, f.i32);
        Value wide = b.create<mlir::arith::ExtUIOp>(loc, vi32, loadVector(f, v8, f.gep(codes, i8, at), Value(), 1));
        Value nib = inGroup < half ? b.create<mlir::arith::AndIOp>(loc, wide, f.splatInt(vi32, 15)).getResult()
                                   : b.create<mlir::arith::ShRUIOp>(loc, wide, f.splatInt(vi32, 4)).getResult();
        Value code = b.create<mlir::arith::SubIOp>(loc, nib, f.splatInt(vi32, 8));
        return f.mul(b.create<mlir::arith::SIToFPOp>(loc, vf32, code), vscale);
      }
      default:
        return loadLanes(f, vf32, f32Rows, f.addi(f.muli(j, ldkv), e), Value());
      }
    };
    // 1. Scores and their max, per head.
    Value negInf = b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(-std::numeric_limits<float>::infinity()));
    auto scores = forKeys(llvm::SmallVector<Value>(R, negInf), [&](Value j, Value row, mlir::ValueRange args) {
      llvm::SmallVector<Value> acc(R, f.splat(vf32, 0.0));
      for (int64_t c = 0; c < chunks; ++c) {
        Value kv = kvLanes(true, j, row, c);
        for (int64_t r = 0; r < R; ++r)
          acc[r] = fmaV(loadLanes(f, vf32, q, f.addi(qRow[r], f.cI64(c * lanes)), Value()), kv, acc[r]);
      }
      llvm::SmallVector<Value> next;
      for (int64_t r = 0; r < R; ++r) {
        Value dot = b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, acc[r], Value(),
                                                        mlir::arith::FastMathFlags::reassoc);
        Value sc = f.mul(dot, scale);
        f.store(sc, sRow[r], f.f32, j);
        next.push_back(f.maxf(args[r], sc));
      }
      return next;
    });
    // 2. p_j = exp(s_j - max) in place, and their sum, per head.
    Value kl = f.cI64(maxLanes);
    Value nMain = f.muli(b.create<mlir::arith::DivSIOp>(loc, n, kl), kl);
    Value rest = b.create<mlir::arith::SubIOp>(loc, n, nMain);
    Value anyRest = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sgt, rest, zero);
    llvm::SmallVector<Value> inv;
    for (int64_t r = 0; r < R; ++r) {
      Value mx = b.create<mlir::vector::SplatOp>(loc, vkeys, scores[r]);
      Value sums = expInPlace(sRow[r], nMain, mx);
      Value total = yieldIf(
          anyRest, vkeys,
          [&] {
            auto vi1 = mlir::VectorType::get({maxLanes}, b.getI1Type());
            Value mask = b.create<mlir::vector::CreateMaskOp>(
                loc, vi1, mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(loc, b.getIndexType(), rest)});
            Value e = f.exp(f.sub(loadLanes(f, vkeys, sRow[r], nMain, mask), mx));
            storeLanes(f, e, sRow[r], nMain, mask);
            return f.add(sums, b.create<mlir::arith::SelectOp>(loc, mask, e, f.splat(vkeys, 0.0)));
          },
          [&] { return sums; });
      Value sum = b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, total, Value(),
                                                      mlir::arith::FastMathFlags::reassoc);
      inv.push_back(f.div(b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(1.0f)), sum));
    }
    // 3. out = sum_j (p_j * inv) v_j: a few vectors of the head for the R heads per pass
    // over the keys (each value vector loaded serves them all), within the registers.
    const int64_t perPass = std::clamp<int64_t>((registers - 4) / (R + 1), 1, 8);
    for (int64_t c0 = 0; c0 < chunks; c0 += perPass) {
      const int64_t cg = std::min<int64_t>(perPass, chunks - c0);
      llvm::SmallVector<Value> init(R * cg, f.splat(vf32, 0.0));
      auto acc = forKeys(init, [&](Value j, Value row, mlir::ValueRange args) {
        llvm::SmallVector<Value> w;
        for (int64_t r = 0; r < R; ++r)
          w.push_back(b.create<mlir::vector::SplatOp>(loc, vf32, f.mul(f.load(f.f32, sRow[r], f.f32, j), inv[r])));
        llvm::SmallVector<Value> next(R * cg);
        for (int64_t c = 0; c < cg; ++c) {
          Value vv = kvLanes(false, j, row, c0 + c);
          for (int64_t r = 0; r < R; ++r) next[r * cg + c] = fmaV(w[r], vv, args[r * cg + c]);
        }
        return next;
      });
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < cg; ++c)
          storeLanes(f, acc[r * cg + c], y, f.addi(yRow[r], f.cI64((c0 + c) * lanes)), Value());
    }
  };
  // Tasks [begin, end): whole groups of the heads of one KV head (task / R is the
  // group: heads is kvHeads x R), the tasks of a group cut by the range one by one.
  // R: the largest divisor of the heads per KV head whose scores fit the scratch.
  int64_t R = std::min<int64_t>(heads / kvHeads, KILN_UK_ATTENTION_SCRATCH_ROWS);
  while ((heads / kvHeads) % R != 0) --R;
  Value begin = fn.getArgument(1), end = fn.getArgument(2);
  auto single = [&](Value task) {
    attendHeads(b.create<mlir::arith::DivSIOp>(loc, task, f.cI64(heads)),
                b.create<mlir::arith::RemSIOp>(loc, task, f.cI64(heads)), 1);
  };
  if (R == 1) {
    f.loop(begin, end, one, single);
  } else {
    Value rv = f.cI64(R);
    Value uA = b.create<mlir::arith::DivSIOp>(loc, f.addi(begin, f.cI64(R - 1)), rv);
    Value uB = b.create<mlir::arith::DivSIOp>(loc, end, rv);
    Value headEnd = b.create<mlir::arith::MinSIOp>(loc, f.muli(uA, rv), end);
    f.loop(begin, headEnd, one, single);
    f.loop(uA, b.create<mlir::arith::MaxSIOp>(loc, uA, uB), one, [&](Value u) {
      Value task = f.muli(u, rv);
      attendHeads(b.create<mlir::arith::DivSIOp>(loc, task, f.cI64(heads)),
                  b.create<mlir::arith::RemSIOp>(loc, task, f.cI64(heads)), R);
    });
    f.loop(b.create<mlir::arith::MaxSIOp>(loc, f.muli(uB, rv), headEnd), end, one, single);
  }
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// Rows of a weight table (kiln_uk_gather_params_t, rows [begin, end)) of one
// encoding, decoded as the reference decodes them (formats/encoding.h): y[r, :] =
// W[ids[r], :] (row r without ids; zeros for the placeholder id), + x[r, :] when x
// is given. fp8 through the exponent bits (exact, NaN/inf codes kept), int8 and
// fp8 times the row's scale, int4 (c - z) * s per group (the group a multiple of
// the lanes, checked at compile time).
// `lanes` consecutive elements of a stored [rows, cols] weight (formats/encoding.h,
// row major) from element (row, i), decoded to f32 lanes with their scales applied:
// float encodings widened; int8 and fp8 codes times the row's scale; int4 (c - z)
// times the group's scale (`lanes` must divide the group; the mask is not applied to
// int4, whose rows are whole groups). The weight is the kiln_uk_weight_t at byte
// `at` of the parameter struct `params`. An int4 weight may also be stored
// int4_p16k8 (`layout`; symmetric): a row's 8 columns of a step are 4 bytes, the
// low nibbles the first 4, the next step 4 x the panel's height further.
// fp8 codes (a vector of i8) as f32 lanes: the code's exponent and mantissa bits
// moved into an f32's, rescaled by 2^(127 - bias) (exact, subnormals included); the
// all-ones codes are NaN (E4M3) or inf/NaN (E5M2).
Value decodeFp8(FnBuilder& f, Value raw, bool e4m3) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  const int64_t lanes = llvm::cast<mlir::VectorType>(raw.getType()).getNumElements();
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vi32 = mlir::VectorType::get({lanes}, f.i32);
  Value c = b.create<mlir::arith::ExtUIOp>(loc, vi32, raw);
  Value mag = b.create<mlir::arith::AndIOp>(loc, c, f.splatInt(vi32, 0x7F));
  Value sign = b.create<mlir::arith::ShLIOp>(loc, b.create<mlir::arith::AndIOp>(loc, c, f.splatInt(vi32, 0x80)),
                                             f.splatInt(vi32, 24));
  Value bits = b.create<mlir::arith::OrIOp>(
      loc, sign, b.create<mlir::arith::ShLIOp>(loc, mag, f.splatInt(vi32, e4m3 ? 20 : 21)));
  Value v = f.mul(b.create<mlir::arith::BitcastOp>(loc, vf32, bits), f.splat(vf32, e4m3 ? 0x1p120 : 0x1p112));
  if (e4m3) {
    Value nan = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, mag, f.splatInt(vi32, 0x7F));
    return b.create<mlir::arith::SelectOp>(loc, nan, f.splat(vf32, std::numeric_limits<double>::quiet_NaN()), v);
  }
  // Exponent 31: inf (mantissa 0) or NaN, with the sign.
  Value special = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::uge, mag, f.splatInt(vi32, 0x7C));
  Value isInf = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, mag, f.splatInt(vi32, 0x7C));
  Value inf = b.create<mlir::arith::BitcastOp>(
      loc, vf32, b.create<mlir::arith::OrIOp>(loc, sign, f.splatInt(vi32, 0x7F800000)));
  Value sv = b.create<mlir::arith::SelectOp>(loc, isInf, inf, f.splat(vf32, std::numeric_limits<double>::quiet_NaN()));
  return b.create<mlir::arith::SelectOp>(loc, special, sv, v);
}

std::function<Value(Value, Value, Value)> weightLanes(FnBuilder& f, uint8_t encoding, int64_t lanes, Value params,
                                                      size_t tAt, uint8_t layout) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vi32 = mlir::VectorType::get({lanes}, f.i32);
  auto i8 = b.getI8Type();
  auto field = [&](size_t offset, mlir::Type t) { return f.field(params, offset, t); };
  Value data = field(tAt + offsetof(kiln_uk_weight_t, data), f.ptr);
  Value rows = field(tAt + offsetof(kiln_uk_weight_t, rows), f.i64);
  Value tcols = field(tAt + offsetof(kiln_uk_weight_t, cols), f.i64);
  Value codesBytes = f.muli(rows, tcols);  // int8 / fp8: the codes, then f32 row scales
  Value groups, int4Scales, int4Zeros, symmetric, group;
  if (encoding == format::kEncINT4) {
    group = b.create<mlir::arith::ExtUIOp>(loc, f.i64, field(tAt + offsetof(kiln_uk_weight_t, group), f.i32));
    groups = b.create<mlir::arith::DivSIOp>(loc, tcols, group);
    int4Scales = f.gep(data, i8, b.create<mlir::arith::DivSIOp>(loc, codesBytes, f.cI64(2)));
    int4Zeros = f.gep(int4Scales, i8, f.muli(f.cI64(2), f.muli(rows, groups)));
    Value sym = field(tAt + offsetof(kiln_uk_weight_t, symmetric), i8);
    symmetric = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne, sym,
                                              b.create<mlir::arith::ConstantIntOp>(loc, 0, 8));
  }

  return [=, &f](Value row, Value i, Value mask) -> Value {
    mlir::OpBuilder& b = f.b;
    switch (encoding) {
    case format::kEncF32:
    case format::kEncF16:
    case format::kEncBF16:
      return loadFloatWeight(f, encoding, lanes, data, f.addi(f.muli(row, tcols), i), mask);
    case format::kEncINT8:
    case format::kEncFP8_E4M3:
    case format::kEncFP8_E5M2: {
      auto v8 = mlir::VectorType::get({lanes}, i8);
      Value raw = loadVector(f, v8, f.gep(data, i8, f.addi(f.muli(row, tcols), i)), mask, 1);
      Value scale = b.create<mlir::LLVM::LoadOp>(loc, f.f32, f.gep(data, i8, f.addi(codesBytes, f.muli(row, f.cI64(4)))), 1);
      Value vscale = b.create<mlir::vector::SplatOp>(loc, vf32, scale);
      if (encoding == format::kEncINT8)
        return f.mul(b.create<mlir::arith::SIToFPOp>(loc, vf32, raw), vscale);
      return f.mul(decodeFp8(f, raw, encoding == format::kEncFP8_E4M3), vscale);
    }
    default: { // int4: lanes codes of one group (lanes divides the group)
      Value g = b.create<mlir::arith::DivSIOp>(loc, i, group);
      if (layout == format::kLayoutInt4P16K8) {
        // The row's panel: its first row and height place the row's 4-byte words and
        // its scales.
        Value p16 = f.cI64(16);
        Value first = b.create<mlir::arith::MulIOp>(loc, b.create<mlir::arith::DivSIOp>(loc, row, p16), p16);
        Value height = b.create<mlir::arith::MinSIOp>(loc, p16, b.create<mlir::arith::SubIOp>(loc, rows, first));
        Value within = b.create<mlir::arith::SubIOp>(loc, row, first);
        Value words = f.addi(b.create<mlir::arith::DivSIOp>(loc, f.muli(first, tcols), f.cI64(2)),
                             f.muli(within, f.cI64(4)));
        Value stride = f.muli(height, f.cI64(4));
        Value sAt = f.addi(f.addi(f.muli(first, groups), f.muli(g, height)), within);
        Value h = b.create<mlir::LLVM::LoadOp>(loc, b.getI16Type(), f.gep(int4Scales, b.getI16Type(), sAt), 2);
        Value half = b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), h);
        Value sc = b.create<mlir::arith::ExtFOp>(loc, f.f32, half);
        auto v4 = mlir::VectorType::get({4}, i8);
        // The 8 codes of step s: the low nibbles of its 4 bytes, then the high ones.
        auto stepCodes = [&](Value s, bool low, bool high) -> Value {
          Value word = b.create<mlir::LLVM::LoadOp>(loc, v4, f.gep(data, i8, f.addi(words, f.muli(s, stride))), 1);
          Value lo = b.create<mlir::arith::AndIOp>(loc, word, f.splatInt(v4, 15));
          Value hi = b.create<mlir::arith::ShRUIOp>(loc, word, f.splatInt(v4, 4));
          if (!high)
            return lo;
          if (!low)
            return hi;
          return b.create<mlir::vector::ShuffleOp>(loc, lo, hi, llvm::ArrayRef<int64_t>{0, 1, 2, 3, 4, 5, 6, 7})
              .getResult();
        };
        Value s0 = b.create<mlir::arith::DivSIOp>(loc, i, f.cI64(8));
        Value codes8;
        if (lanes == 4) {  // half a step: columns 8s..8s+3 or 8s+4..8s+7
          Value firstHalf = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq,
                                                          b.create<mlir::arith::RemSIOp>(loc, i, f.cI64(8)), f.cI64(0));
          codes8 = b.create<mlir::arith::SelectOp>(loc, firstHalf, stepCodes(s0, true, false),
                                                   stepCodes(s0, false, true));
        } else if (lanes == 8) {
          codes8 = stepCodes(s0, true, true);
        } else {  // 16 lanes: two steps side by side
          llvm::SmallVector<int64_t> cat;
          for (int64_t j = 0; j < 16; ++j)
            cat.push_back(j);
          codes8 = b.create<mlir::vector::ShuffleOp>(loc, stepCodes(s0, true, true),
                                                     stepCodes(f.addi(s0, f.cI64(1)), true, true), cat);
        }
        Value centred = b.create<mlir::arith::SubIOp>(loc, b.create<mlir::arith::ExtUIOp>(loc, vi32, codes8),
                                                      f.splatInt(vi32, 8));
        return f.mul(b.create<mlir::arith::SIToFPOp>(loc, vf32, centred), b.create<mlir::vector::SplatOp>(loc, vf32, sc));
      }
      Value at = f.addi(f.muli(row, groups), g);
      Value h = b.create<mlir::LLVM::LoadOp>(loc, b.getI16Type(), f.gep(int4Scales, b.getI16Type(), at), 2);
      Value h16 = b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), h);
      Value sc = b.create<mlir::arith::ExtFOp>(loc, f.f32, h16);
      auto zIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{f.i32}, symmetric, true, true);
      {
        mlir::OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(zIf.thenBlock());
        b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{b.create<mlir::arith::ConstantIntOp>(loc, 8, 32)});
        b.setInsertionPointToStart(zIf.elseBlock());
        Value z = b.create<mlir::arith::ExtUIOp>(loc, f.i32, f.load(i8, int4Zeros, i8, at));
        b.create<mlir::scf::YieldOp>(loc, z);
      }
      // Element e of the row is nibble e % 2 of byte e / 2 (lanes is even here).
      auto vhalf = mlir::VectorType::get({lanes / 2}, i8);
      Value byte = b.create<mlir::arith::DivSIOp>(loc, f.addi(f.muli(row, tcols), i), f.cI64(2));
      Value packed = b.create<mlir::LLVM::LoadOp>(loc, vhalf, f.gep(data, i8, byte), 1);
      Value lo = b.create<mlir::arith::AndIOp>(loc, packed, f.splatInt(vhalf, 15));
      Value hi = b.create<mlir::arith::ShRUIOp>(loc, packed, f.splatInt(vhalf, 4));
      llvm::SmallVector<int64_t> zip;
      for (int64_t j = 0; j < lanes / 2; ++j) {
        zip.push_back(j);
        zip.push_back(lanes / 2 + j);
      }
      Value codes = b.create<mlir::arith::ExtUIOp>(loc, vi32, b.create<mlir::vector::ShuffleOp>(loc, lo, hi, zip));
      Value centred = b.create<mlir::arith::SubIOp>(loc, codes, b.create<mlir::vector::SplatOp>(loc, vi32, zIf.getResult(0)));
      return f.mul(b.create<mlir::arith::SIToFPOp>(loc, vf32, centred), b.create<mlir::vector::SplatOp>(loc, vf32, sc));
    }
    }
  };

}

void buildGather(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, uint8_t layout, int64_t lanes,
                 mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  Value params = fn.getArgument(0);
  auto field = [&](size_t offset, mlir::Type t) { return f.field(params, offset, t); };
  Value ids = field(offsetof(kiln_uk_gather_params_t, ids), f.ptr);
  Value placeholder = field(offsetof(kiln_uk_gather_params_t, placeholder), f.i64);
  Value x = field(offsetof(kiln_uk_gather_params_t, x), f.ptr);
  Value y = field(offsetof(kiln_uk_gather_params_t, y), f.ptr);
  Value ldy = field(offsetof(kiln_uk_gather_params_t, ldy), f.i64);
  Value cols = field(offsetof(kiln_uk_gather_params_t, cols), f.i64);
  const size_t tAt = offsetof(kiln_uk_gather_params_t, table);
  Value nullPtr = b.create<mlir::LLVM::ZeroOp>(loc, f.ptr);
  Value hasIds = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, ids, nullPtr);
  Value hasX = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, x, nullPtr);
  Value one = f.cI64(1);
  auto decode = weightLanes(f, encoding, lanes, params, tAt, layout);

  f.loop(fn.getArgument(1), fn.getArgument(2), one, [&](Value r) {
    Value yRow = f.muli(r, ldy);
    auto idIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{f.i64}, hasIds, true, true);
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(idIf.thenBlock());
      b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{b.create<mlir::arith::ExtSIOp>(
                                            loc, f.i64, f.load(f.i32, ids, f.i32, r))});
      b.setInsertionPointToStart(idIf.elseBlock());
      b.create<mlir::scf::YieldOp>(loc, r);
    }
    Value id = idIf.getResult(0);
    Value isPlaceholder = b.create<mlir::arith::AndIOp>(
        loc, hasIds, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, id, placeholder));
    auto branch = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, isPlaceholder, true);
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(branch.thenBlock());
      vectorLoop(f, f.cI64(0), cols, lanes,
                 [&](Value i, Value mask) { storeLanes(f, f.splat(vf32, 0.0), y, f.addi(yRow, i), mask); });
      b.setInsertionPointToStart(branch.elseBlock());
      vectorLoop(f, f.cI64(0), cols, lanes, [&](Value i, Value mask) {
        Value v = decode(id, i, mask);
        auto plus = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{vf32}, hasX, true, true);
        {
          mlir::OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(plus.thenBlock());
          b.create<mlir::scf::YieldOp>(loc, f.add(loadLanes(f, vf32, x, f.addi(f.muli(r, cols), i), mask), v));
          b.setInsertionPointToStart(plus.elseBlock());
          b.create<mlir::scf::YieldOp>(loc, v);
        }
        storeLanes(f, plus.getResult(0), y, f.addi(yRow, i), mask);
      });
    }
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// How a target multiplies int8 vectors: `chunk` int8 products per step summed
// pairwise (or four at a time) into `acc` i32 lanes.
struct IntDot {
  enum Kind { X86Madd, ArmSdot, Generic } kind;
  const char* intrinsic;  // X86Madd: the pmaddwd of the width
  int64_t chunk, acc;
  int registers;          // vector registers of the target
};

IntDot intDot(const Target& target) {
  if (target.arch == TargetArch::X86_64) {
    // pmaddwd on sign-extended halves; with VNNI the backend fuses the following
    // add into vpdpwssd.
    if ((target.features & format::kCpuX86Avx512F) && (target.features & format::kCpuX86Avx512Bw))
      return {IntDot::X86Madd, "llvm.x86.avx512.pmaddw.d.512", 32, 16, 32};
    if (target.features & format::kCpuX86Avx2)
      return {IntDot::X86Madd, "llvm.x86.avx2.pmadd.wd", 16, 8, 16};
    return {IntDot::X86Madd, "llvm.x86.sse2.pmadd.wd", 8, 4, 16};
  }
  if (target.features & format::kCpuArmDotProd)
    return {IntDot::ArmSdot, "llvm.aarch64.neon.sdot", 16, 4, 32};
  return {IntDot::Generic, nullptr, 16, 4, 32};
}

// acc (i32 x d.acc) + the products of x and w (i8 x d.chunk), summed in groups of
// chunk / acc lanes.
Value intDotStep(FnBuilder& f, const IntDot& d, Value acc, Value x, Value w) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto vacc = mlir::VectorType::get({d.acc}, f.i32);
  switch (d.kind) {
  case IntDot::ArmSdot:
    return b.create<mlir::LLVM::CallIntrinsicOp>(loc, vacc, b.getStringAttr(d.intrinsic), mlir::ValueRange{acc, x, w})
        .getResult(0);
  case IntDot::X86Madd: {
    auto v16 = mlir::VectorType::get({d.chunk}, b.getI16Type());
    Value x16 = b.create<mlir::arith::ExtSIOp>(loc, v16, x);
    Value w16 = b.create<mlir::arith::ExtSIOp>(loc, v16, w);
    Value prod =
        b.create<mlir::LLVM::CallIntrinsicOp>(loc, vacc, b.getStringAttr(d.intrinsic), mlir::ValueRange{x16, w16})
            .getResult(0);
    return f.addi(acc, prod);
  }
  case IntDot::Generic: {
    auto v32 = mlir::VectorType::get({d.chunk}, f.i32);
    Value prod = f.muli(b.create<mlir::arith::ExtSIOp>(loc, v32, x), b.create<mlir::arith::ExtSIOp>(loc, v32, w));
    for (int64_t at = 0; at < d.chunk; at += d.acc)
      acc = f.addi(acc, b.create<mlir::vector::ExtractStridedSliceOp>(loc, prod, llvm::ArrayRef<int64_t>{at},
                                                                      llvm::ArrayRef<int64_t>{d.acc},
                                                                      llvm::ArrayRef<int64_t>{1}));
    return acc;
  }
  }
  return acc;
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for int8 or int4 weights and int8
// per-token activations (kiln_uk_matmul_params_t with xq/xs; output channels
// [begin, end)), exactly as the reference sums them (docs/precision.md):
//   int8: y = float(sum q_x q_w) * s_x * s_w; the K tail by masked loads;
//   int4: y = s_x * sum over groups of float(sum_group q_x (c - z)) * s_group, the
//         nibbles unpacked to (c - z) in i8 and interleaved back into element order;
//         the group (runtime) must be a multiple of the step (checked at compile time).
// Tiles of mr x 4 (mr from the register file), M and N tails by 1 x 4 and 1 x 1.
void buildMatmulInt(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, const Target& target,
                    bool isPublic, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  const IntDot d = intDot(target);
  const bool int4 = encoding == format::kEncINT4;
  const int64_t C = d.chunk;
  auto i8 = b.getI8Type();
  auto vi32 = mlir::VectorType::get({d.acc}, f.i32);
  auto vf32 = mlir::VectorType::get({d.acc}, f.f32);
  auto vx = mlir::VectorType::get({C}, i8);
  auto vhalf = mlir::VectorType::get({C / 2}, i8);

  Value params = fn.getArgument(0);
  const size_t wAt = offsetof(kiln_uk_matmul_params_t, w);
  const MatmulArgs args(f, fn, hasF16Conversion(target));
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value nBegin = args.nBegin, nEnd = args.nEnd;
  Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4), step = f.cI64(C);
  Value NK = f.muli(N, K);
  // int8: f32 scales per row after the codes. int4: f16 scales per (row, group)
  // after the codes, then (asymmetric) u8 zero points.
  Value group, groups, scales, zeros, symmetric, kMain, kTail;
  if (int4) {
    group = b.create<mlir::arith::ExtUIOp>(
        loc, f.i64, f.field(params, wAt + offsetof(kiln_uk_weight_t, group), f.i32));
    groups = b.create<mlir::arith::DivSIOp>(loc, K, group);
    scales = f.gep(w, i8, b.create<mlir::arith::DivSIOp>(loc, NK, f.cI64(2)));
    zeros = f.gep(scales, i8, f.muli(f.cI64(2), f.muli(N, groups)));
    Value sym = f.field(params, wAt + offsetof(kiln_uk_weight_t, symmetric), i8);
    symmetric = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne, sym,
                                              b.create<mlir::arith::ConstantIntOp>(loc, 0, 8));
  } else {
    scales = f.gep(w, i8, NK);
    kMain = b.create<mlir::arith::SubIOp>(loc, K, b.create<mlir::arith::RemSIOp>(loc, K, step));
    kTail = b.create<mlir::arith::SubIOp>(loc, K, kMain);
  }

  auto loadVec = [&](mlir::VectorType t, Value base, Value byteIndex, Value mask) {
    return loadVector(f, t, f.gep(base, i8, byteIndex), mask, 1);
  };
  auto loadF32 = [&](Value base, Value byteIndex) -> Value {
    return b.create<mlir::LLVM::LoadOp>(loc, f.f32, f.gep(base, i8, byteIndex), /*alignment=*/1);
  };
  auto bias = [&](Value n) { return args.bias(f, n); };
  auto rowX = [&](Value m) { return f.muli(m, K); };  // xq rows are K apart
  auto reduce = [&](Value v) {
    return b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, v, Value(),
                                               mlir::arith::FastMathFlags::reassoc);
  };
  auto store = [&](Value m, Value n, Value v) {
    f.store(f.add(v, bias(n)), y, f.f32, f.addi(f.muli(m, ldy), n));
  };

  // int4: for each group, the integer sums of its K steps (`range(gi)`: the step
  // loop's bounds, by `stride`; `dots(k, acc)`: the accumulators after step k) are
  // converted to f32, times the group's scale per column (`scales(gi)`), and summed
  // in f32 lanes; each row's total times its activation scale is stored.
  using Values = llvm::SmallVector<Value>;
  auto int4Tile = [&](Value m0, int64_t mr, Value n0, int64_t nr, llvm::function_ref<Values(Value)> scalesOf,
                      llvm::function_ref<std::pair<Value, Value>(Value)> range, Value stride,
                      llvm::function_ref<Values(Value, mlir::ValueRange)> dots) {
    const int64_t count = mr * nr;
    auto groupsLoop = b.create<mlir::scf::ForOp>(loc, zero, groups, one, Values(count, f.splat(vf32, 0.0)));
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(groupsLoop.getBody());
      Value gi = groupsLoop.getInductionVar();
      Values ss = scalesOf(gi);
      auto [lo, hi] = range(gi);
      auto inner = b.create<mlir::scf::ForOp>(loc, lo, hi, stride, Values(count, f.splatInt(vi32, 0)));
      {
        mlir::OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(inner.getBody());
        b.create<mlir::scf::YieldOp>(loc, dots(inner.getInductionVar(), inner.getRegionIterArgs()));
      }
      Values next;
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t r = 0; r < nr; ++r) {
          Value sum = b.create<mlir::arith::SIToFPOp>(loc, vf32, inner.getResult(i * nr + r));
          next.push_back(fmaContract(f, sum, ss[r], groupsLoop.getRegionIterArgs()[i * nr + r]));
        }
      b.create<mlir::scf::YieldOp>(loc, next);
    }
    for (int64_t i = 0; i < mr; ++i) {
      Value m = f.addi(m0, f.cI64(i));
      Value sx = f.load(f.f32, xsc, f.f32, m);
      for (int64_t r = 0; r < nr; ++r)
        store(m, f.addi(n0, f.cI64(r)), f.mul(reduce(groupsLoop.getResult(i * nr + r)), sx));
    }
  };
  // An f16 scale as an f32 splat.
  auto scaleSplat = [&](Value at) -> Value {
    Value h = b.create<mlir::LLVM::LoadOp>(loc, b.getI16Type(), f.gep(scales, b.getI16Type(), at), 2);
    Value h16 = b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), h);
    Value s = b.create<mlir::arith::ExtFOp>(loc, f.f32, h16);
    return b.create<mlir::vector::SplatOp>(loc, vf32, s);
  };

  auto tile = [&](Value m0, int64_t mr, Value n0, int64_t nr) {
    const int64_t count = mr * nr;
    auto col = [&](int64_t r) { return f.addi(n0, f.cI64(r)); };
    auto row = [&](int64_t i) { return f.addi(m0, f.cI64(i)); };
    if (!int4) {
      llvm::SmallVector<Value> init(count, f.splatInt(vi32, 0));
      auto kstep = [&](Value k, mlir::ValueRange acc, Value mask) {
        llvm::SmallVector<Value> xs, ws, out;
        for (int64_t i = 0; i < mr; ++i)
          xs.push_back(loadVec(vx, xq, f.addi(rowX(row(i)), k), mask));
        for (int64_t r = 0; r < nr; ++r)
          ws.push_back(loadVec(vx, w, f.addi(f.muli(col(r), K), k), mask));
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t r = 0; r < nr; ++r)
            out.push_back(intDotStep(f, d, acc[i * nr + r], xs[i], ws[r]));
        return out;
      };
      llvm::SmallVector<Value> sums = reduceOverK(f, kMain, kTail, step, C, init, kstep);
      for (int64_t i = 0; i < mr; ++i) {
        Value sx = f.load(f.f32, xsc, f.f32, row(i));
        for (int64_t r = 0; r < nr; ++r) {
          Value acc = b.create<mlir::arith::SIToFPOp>(loc, f.f32, reduce(sums[i * nr + r]));
          Value sw = loadF32(scales, f.muli(col(r), f.cI64(4)));
          store(row(i), col(r), f.mul(f.mul(acc, sx), sw));
        }
      }
      return;
    }
    // int4 row major: per group its zero point (8 when symmetric) and scale per
    // column; per step the nibbles unpacked, zero-point corrected in i8 and
    // interleaved back into element order.
    Values zs;
    auto scalesOf = [&](Value gi) {
      Values ss;
      zs.clear();
      for (int64_t r = 0; r < nr; ++r) {
        Value at = f.addi(f.muli(col(r), groups), gi);
        auto zIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{i8}, symmetric, true, true);
        {
          mlir::OpBuilder::InsertionGuard g2(b);
          b.setInsertionPointToStart(zIf.thenBlock());
          b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{b.create<mlir::arith::ConstantIntOp>(loc, 8, 8)});
          b.setInsertionPointToStart(zIf.elseBlock());
          b.create<mlir::scf::YieldOp>(loc, f.load(i8, zeros, i8, at));
        }
        zs.push_back(b.create<mlir::vector::SplatOp>(loc, vhalf, zIf.getResult(0)));
        ss.push_back(scaleSplat(at));
      }
      return ss;
    };
    auto range = [&](Value gi) {
      Value k0 = f.muli(gi, group);
      return std::pair<Value, Value>{k0, f.addi(k0, group)};
    };
    llvm::SmallVector<int64_t> zip;
    for (int64_t j = 0; j < C / 2; ++j) {
      zip.push_back(j);
      zip.push_back(C / 2 + j);
    }
    auto dots = [&](Value k, mlir::ValueRange acc) {
      Values xs, ws, out;
      for (int64_t i = 0; i < mr; ++i)
        xs.push_back(loadVec(vx, xq, f.addi(rowX(row(i)), k), nullptr));
      for (int64_t r = 0; r < nr; ++r) {
        Value byte = b.create<mlir::arith::DivSIOp>(loc, f.addi(f.muli(col(r), K), k), f.cI64(2));
        Value packed = loadVec(vhalf, w, byte, nullptr);
        Value lo = b.create<mlir::arith::AndIOp>(loc, packed, f.splatInt(vhalf, 15));
        Value hi = b.create<mlir::arith::ShRUIOp>(loc, packed, f.splatInt(vhalf, 4));
        lo = b.create<mlir::arith::SubIOp>(loc, lo, zs[r]);
        hi = b.create<mlir::arith::SubIOp>(loc, hi, zs[r]);
        ws.push_back(b.create<mlir::vector::ShuffleOp>(loc, lo, hi, zip));
      }
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t r = 0; r < nr; ++r)
          out.push_back(intDotStep(f, d, acc[i * nr + r], xs[i], ws[r]));
      return out;
    };
    int4Tile(m0, mr, n0, nr, scalesOf, range, step, dots);
  };
  // Tiles of mr rows by nr output channels, as many accumulators as the register
  // file holds (int4 keeps two per pair: the group's integer sum and the scaled
  // total), so that each unpacked weight step serves mr rows; rows past the last
  // whole tile (and decode's single row) in 1 x 4 tiles.
  const int64_t mr = d.registers >= 32 ? 4 : 2;
  const int64_t nr = int4 ? 2 : 4;
  Value nMain = roundDownFrom(f, nEnd, nBegin, four);
  Value mMain = roundDownFrom(f, M, zero, f.cI64(mr));
  f.loop(nBegin, nMain, four, [&](Value n0) {
    f.loop(zero, mMain, f.cI64(mr), [&](Value m0) {
      for (int64_t c = 0; c < 4; c += nr)
        tile(m0, mr, f.addi(n0, f.cI64(c)), nr);
    });
    f.loop(mMain, M, one, [&](Value m0) { tile(m0, 1, n0, 4); });
  });
  f.loop(nMain, nEnd, one, [&](Value n0) { f.loop(zero, M, one, [&](Value m0) { tile(m0, 1, n0, 1); }); });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// How a target sums four int8 products into each i32 lane of `lanes`: the u8 x s8
// dot products of x86 (VPDPBUSD with VNNI; PMADDUBSW then PMADDWD without), SDOT on
// AArch64 (SMULL pairs, ADDP, SADALP on NEON without it), widened multiplies elsewhere.
// The first operand's bytes are the weight's
// codes (int4: 0..15, the same value as u8 or s8; int8 on x86: made unsigned by the
// caller), the second's the int8 activations.
struct Dot4 {
  enum Kind { X86Vnni, X86Maddubs, ArmSdot, ArmSmull, Generic } kind;
  int64_t lanes;
  const char* pairs = nullptr;  // X86Maddubs: u8 x s8 -> i16 pairs
  const char* quads = nullptr;  // X86Maddubs: i16 pairs -> i32 (with ones); X86Vnni, ArmSdot: the dot product
};

Dot4 dot4(const Target& target) {
  const uint64_t ft = target.features;
  if (target.arch == TargetArch::X86_64) {
    if ((ft & format::kCpuX86Avx512F) && (ft & format::kCpuX86Avx512Bw)) {
      if (ft & format::kCpuX86Avx512Vnni)
        return {Dot4::X86Vnni, 16, nullptr, "llvm.x86.avx512.vpdpbusd.512"};
      return {Dot4::X86Maddubs, 16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"};
    }
    // 256-bit VPDPBUSD: VEX-encoded with AVX-VNNI (AVX2 CPUs from Alder Lake and Zen 5
    // on), EVEX with AVX-512 VNNI + VL where 512-bit words are not used.
    if ((ft & format::kCpuX86Avx2) &&
        ((ft & format::kCpuX86AvxVnni) || ((ft & format::kCpuX86Avx512Vnni) && (ft & format::kCpuX86Avx512Vl))))
      return {Dot4::X86Vnni, 8, nullptr, "llvm.x86.avx512.vpdpbusd.256"};
    if (ft & format::kCpuX86Avx2)
      return {Dot4::X86Maddubs, 8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"};
    return {Dot4::Generic, 4};
  }
  if (ft & format::kCpuArmDotProd)
    return {Dot4::ArmSdot, 4, nullptr, "llvm.aarch64.neon.sdot"};
  if (target.arch == TargetArch::AArch64)
    return {Dot4::ArmSmull, 4};
  return {Dot4::Generic, 4};
}

// acc (i32 x d.lanes) + per lane the dot product of its 4 bytes of w and of x.
Value dot4Step(FnBuilder& f, const Dot4& d, Value acc, Value w, Value x) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto vacc = mlir::VectorType::get({d.lanes}, f.i32);
  auto call = [&](mlir::Type t, const char* name, mlir::ValueRange args) {
    return b.create<mlir::LLVM::CallIntrinsicOp>(loc, t, b.getStringAttr(name), args).getResult(0);
  };
  switch (d.kind) {
  case Dot4::X86Vnni:
    return call(vacc, d.quads,
                {acc, b.create<mlir::LLVM::BitcastOp>(loc, vacc, w), b.create<mlir::LLVM::BitcastOp>(loc, vacc, x)});
  case Dot4::ArmSdot:
    return call(vacc, d.quads, {acc, w, x});
  case Dot4::ArmSmull: {
    // Armv8.0 NEON: the 16 byte products in i16 (SMULL, SMULL2), neighbours added
    // (ADDP: |w x + w' x'| <= 2 x 127 x 127 fits), then pairs of those widened and
    // accumulated (SADALP): lane l sums products 4l..4l+3, as SDOT does.
    auto v8i16 = mlir::VectorType::get({8}, b.getI16Type());
    auto half = [&](Value v, int64_t h) {
      return b.create<mlir::vector::ShuffleOp>(loc, v, v,
                                               llvm::ArrayRef<int64_t>{8 * h, 8 * h + 1, 8 * h + 2, 8 * h + 3,
                                                                       8 * h + 4, 8 * h + 5, 8 * h + 6, 8 * h + 7});
    };
    Value lo = call(v8i16, "llvm.aarch64.neon.smull.v8i16", {half(w, 0), half(x, 0)});
    Value hi = call(v8i16, "llvm.aarch64.neon.smull.v8i16", {half(w, 1), half(x, 1)});
    Value pairs = call(v8i16, "llvm.aarch64.neon.addp.v8i16", {lo, hi});
    return f.addi(acc, call(vacc, "llvm.aarch64.neon.saddlp.v4i32.v8i16", {pairs}));
  }
  case Dot4::X86Maddubs: {
    auto v16 = mlir::VectorType::get({2 * d.lanes}, b.getI16Type());
    Value pairs = call(v16, d.pairs, {w, x});
    return f.addi(acc, call(vacc, d.quads, {pairs, f.splatInt(v16, 1)}));
  }
  case Dot4::Generic: {
    auto wide = mlir::VectorType::get({4 * d.lanes}, f.i32);
    Value prod = f.muli(b.create<mlir::arith::ExtSIOp>(loc, wide, w), b.create<mlir::arith::ExtSIOp>(loc, wide, x));
    for (int64_t j = 0; j < 4; ++j) {
      llvm::SmallVector<int64_t> pick;
      for (int64_t l = 0; l < d.lanes; ++l)
        pick.push_back(4 * l + j);
      acc = f.addi(acc, b.create<mlir::vector::ShuffleOp>(loc, prod, prod, pick));
    }
    return acc;
  }
  }
  return acc;
}

// SME2 (streaming mode, the ZA array) for blocks of many rows: the activation rows
// of a block per thread (at most kSmeBlockRows: the packed rows, the int4 offset
// shares and 32 biases fit the scratch of kiln_uk_matmul_scratch_ref(K) = 64 K bytes),
// and the fewest rows for which the outer products beat the NEON dot products.
constexpr int64_t kSmeBlockRows = 32, kSmeMinRows = 8;
// A generated function that runs in streaming mode with a new ZA state
// (compileKernels gives it LLVM's aarch64_pstate_sm_body and aarch64_new_za).
constexpr llvm::StringLiteral kSmeZaAttrName = "sme_streaming_new_za";
// An SME2 function that also has a new ZT0 (the lookup table of LUTI4; compileKernels
// gives it LLVM's aarch64_new_zt0).
constexpr llvm::StringLiteral kSmeZt0AttrName = "sme_new_zt0";

// A generated SME2 function (the params, begin, end, scratch kernel signature; in
// streaming mode with new ZA, see kSmeZaAttrName) and the helpers its body builds with.
struct SmeKernel {
  mlir::func::FuncOp fn;
  mlir::OpBuilder b;
  mlir::Location loc;
  FnBuilder f;
  mlir::Type i1, i8, i16, f16;
  mlir::VectorType nxi8, nxi32, nxf32, nxf16, pb, ps;  // scalable vectors, predicates
  SmeKernel(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location l)
      : fn(newKernel(kernels, name, l, /*scratch=*/true, /*isPublic=*/false)), b(fn.getBody()), loc(l), f(b, l) {
    b.setInsertionPointToStart(&fn.getBody().front());
    fn->setAttr(kSmeZaAttrName, b.getUnitAttr());
    i1 = b.getI1Type(), i8 = b.getI8Type(), i16 = b.getI16Type(), f16 = b.getF16Type();
    auto scalable = [&](int64_t n, mlir::Type t) { return mlir::VectorType::get({n}, t, {true}); };
    nxi8 = scalable(16, i8), nxi32 = scalable(4, f.i32), nxf32 = scalable(4, f.f32);
    nxf16 = scalable(4, f16), pb = scalable(16, i1), ps = scalable(4, i1);
  }
  mlir::Operation* intr(llvm::StringRef callee, mlir::TypeRange results, mlir::ValueRange operands) {
    return b.create<mlir::LLVM::CallIntrinsicOp>(loc, results, b.getStringAttr(callee), operands);
  }
  // Multi-vector operands and results (SME2): a struct of 4 vectors, and its parts.
  mlir::Type x4(mlir::Type t) { return structOf4(b.getContext(), t); }
  llvm::SmallVector<Value> parts(Value v) { return partsOf4(f, v); }
  Value c32(int64_t v) { return b.create<mlir::arith::ConstantIntOp>(loc, v, 32); }
  Value i32Of(Value v) { return b.create<mlir::arith::TruncIOp>(loc, f.i32, v); }
  Value divs(Value a, Value c) { return b.create<mlir::arith::DivSIOp>(loc, a, c); }
  Value rems(Value a, Value c) { return b.create<mlir::arith::RemSIOp>(loc, a, c); }
  Value sub(Value a, Value c) { return b.create<mlir::arith::SubIOp>(loc, a, c); }
  Value minI(Value a, Value c) { return b.create<mlir::arith::MinSIOp>(loc, a, c); }
  Value maxI(Value a, Value c) { return b.create<mlir::arith::MaxSIOp>(loc, a, c); }
  Value andP(Value a, Value c) { return b.create<mlir::arith::AndIOp>(loc, a, c); }
  // Lanes i of predicate type t with base + i < n (base, n >= 0): WHILELO. (LLVM 19
  // expands llvm.get.active.lane.mask without +sve into compares of index vectors,
  // which gave empty byte predicates in the int4_p128k4 GEMV.)
  Value lanesBelow(mlir::VectorType t, Value base, Value n) {
    return intr("llvm.aarch64.sve.whilelo", {t}, {base, n})->getResult(0);
  }
  Value load(mlir::VectorType t, Value at, Value mask) { return loadVector(f, t, at, mask, 1); }
  // Packs `rows` int8 activation rows from row mb0 of xq ([M, K]) into `packed` as
  // [K / 4][rows][4 bytes] (a step's `stepBytes` apart): word j of row r (columns
  // 4j..4j+3) to [j][r], S words of each row at a time loaded into the horizontal
  // slices of ZA tile 0 and stored from its vertical ones (a transpose through ZA).
  void packRows(Value xq, Value K, Value S, Value mb0, Value rows, Value rowMask, Value packed, Value stepBytes) {
    Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4);
    Value words = divs(K, four);
    f.loop(zero, words, S, [&](Value j0) {
      Value cols = minI(S, sub(words, j0));
      Value colMask = lanesBelow(ps, zero, cols);
      f.loop(zero, rows, one, [&](Value r) {
        Value from = f.gep(xq, i8, f.addi(f.muli(f.addi(mb0, r), K), f.muli(j0, four)));
        intr("llvm.aarch64.sme.ld1w.horiz", {}, {colMask, from, c32(0), i32Of(r)});
      });
      f.loop(zero, cols, one, [&](Value j) {
        Value to = f.gep(packed, i8, f.muli(f.addi(j0, j), stepBytes));
        intr("llvm.aarch64.sme.st1w.vert", {}, {rowMask, to, c32(0), i32Of(j)});
      });
    });
  }
  // The whole panels of 16 of the N channels that overlap [begin, end), as channels.
  std::pair<Value, Value> wholePanels(Value begin, Value end, Value N) {
    Value p16 = f.cI64(format::kP16K8Rows);
    Value first = divs(begin, p16);
    Value last = divs(f.addi(end, f.cI64(format::kP16K8Rows - 1)), p16);
    Value wholeEnd = maxI(first, minI(last, divs(N, p16)));
    return {f.muli(first, p16), f.muli(wholeEnd, p16)};
  }
};

// The whole panels of the range of a matmul over a weight in panels of 16 output
// channels (buildMatmulIntPanels) computed with SME2 outer products into ZA; the
// function runs in streaming mode (smstart/smstop in its prologue and epilogue, ZA
// new) and calls nothing, so that no state crosses a call. Vector-length agnostic:
// with SVL bits of streaming vector, a 32-bit ZA tile holds S x S sums (S = SVL /
// 32); a tile covers W = min(S, 16) channels (a whole panel from 512 bits up, half
// or a quarter below) and R = min(S, kSmeBlockRows) activation rows.
//   - Per block of R rows, the int8 activations are packed into the scratch as
//     [K / 4][R][4 bytes] (one vector load gives the 4 columns of a step for every
//     row: the left operand of SMOPA), and for int4 the offset shares of each
//     (group, row), -8 x the sum of its activations (SDOT with ones), laid out
//     [group][R].
//   - Per column block of two tiles (2 W channels), for each step of columns one
//     load per tile of the panel's codes (int4: 8 columns as low and high nibbles,
//     the same two operands as buildMatmulIntPanels's; int8: 4 columns) and one
//     4-way widening SMOPA per operand into ZA tiles 0 and 1: each sum is a row's
//     activations times a channel's codes, summed in i32.
//   - int4: per group the integer tiles start from the offset shares (ADDVA: each
//     row's share added along it), and after the group's steps they are read out
//     four array vectors at a time (MOVA, SME2), converted (SCVTF x4) and
//     multiply-added with the group's channel scales into f32 tiles 2 and 3 (FMLA
//     into ZA, vgx4): the f32 sum of group sums x scales of `tile`, the same
//     operations in the same order. int8: the i32 sums over all of K.
//   - The rows of the block are read out of their tile and stored as `tile` stores
//     them: y = total x s_x (+ bias) for int4, float(sum) x s_x x s_w (+ bias) for
//     int8, outputs outside [begin, end) not stored.
void buildMatmulIntSme(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, mlir::Location loc) {
  SmeKernel sk(kernels, name, loc);
  mlir::func::FuncOp fn = sk.fn;
  mlir::OpBuilder& b = sk.b;
  FnBuilder& f = sk.f;
  const bool int4 = encoding == format::kEncINT4;
  mlir::Type i8 = sk.i8, i16 = sk.i16;
  mlir::VectorType nxi8 = sk.nxi8, nxi32 = sk.nxi32, nxf32 = sk.nxf32, nxf16 = sk.nxf16, pb = sk.pb, ps = sk.ps;
  auto zeroTiles = [&](int64_t mask) { sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(mask)}); };

  Value scratch = fn.getArgument(3);
  const MatmulArgs args(f, fn, /*f16Bias=*/true);
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4), p16 = f.cI64(format::kP16K8Rows);
  Value S = sk.intr("llvm.aarch64.sme.cntsw", {f.i64}, {})->getResult(0);
  Value W = sk.minI(S, p16), R = sk.minI(S, f.cI64(kSmeBlockRows));
  Value group = int4 ? b.create<mlir::arith::ExtUIOp>(
                           loc, f.i64,
                           f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group),
                                   f.i32))
                           .getResult()
                     : K;
  Value groups = sk.divs(K, group);
  Value scales = f.gep(w, i8, int4 ? sk.divs(f.muli(N, K), f.cI64(2)) : f.muli(N, K));
  Value cBegin, cEnd;
  std::tie(cBegin, cEnd) = sk.wholePanels(args.nBegin, args.nEnd, N);
  // Scratch: 2 W <= 32 biases, the packed rows (R x K bytes), int4's shares.
  Value biasBuf = scratch;
  Value packed = f.gep(scratch, f.f32, f.cI64(32));
  Value shares = f.gep(packed, i8, f.muli(R, K));
  Value allTrue = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(ps, true));
  Value stepBytes = f.muli(R, four);  // a step's packed activations (4 columns of R rows)
  Value actOff[8];  // u x stepBytes
  for (int64_t u = 0; u < 8; ++u)
    actOff[u] = f.muli(stepBytes, f.cI64(u));

  f.loop(zero, M, R, [&](Value mb0) {
    Value rows = sk.minI(R, sk.sub(M, mb0));
    Value rowMask = sk.lanesBelow(ps, zero, rows), rowBytes = sk.lanesBelow(pb, zero, f.muli(rows, four));
    sk.packRows(xq, K, S, mb0, rows, rowMask, packed, stepBytes);
    if (int4) {
      // Each (group, row)'s offset share: -8 x 16 x the sum of its activations.
      Value ones = f.splatInt(nxi8, 1);
      Value wordsPerGroup = sk.divs(group, four);
      f.loop(zero, groups, one, [&](Value gi) {
        Value j0 = f.muli(gi, wordsPerGroup);
        auto sum = b.create<mlir::scf::ForOp>(loc, j0, f.addi(j0, wordsPerGroup), one,
                                              mlir::ValueRange{f.splatInt(nxi32, 0)});
        {
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(sum.getBody());
          Value v = sk.load(nxi8, f.gep(packed, i8, f.muli(sum.getInductionVar(), stepBytes)), rowBytes);
          Value acc = sk.intr("llvm.aarch64.sve.sdot", {nxi32}, {sum.getRegionIterArgs()[0], v, ones})->getResult(0);
          b.create<mlir::scf::YieldOp>(loc, acc);
        }
        Value share = b.create<mlir::arith::MulIOp>(loc, sum.getResult(0), f.splatInt(nxi32, -8 * 16));
        b.create<mlir::LLVM::MaskedStoreOp>(loc, share, f.gep(shares, f.i32, f.muli(gi, R)), rowMask, 4);
      });
    }

    f.loop(cBegin, cEnd, f.muli(W, f.cI64(2)), [&](Value c0) {
      // Tile t covers channels [c0 + t W, + W) when they are whole panels' (tile 1
      // may fall past the last): its lanes, its codes and scales.
      struct Tile {
        Value first, lanes, bytes, codes, scaleAt, width;
      } tiles[2];
      for (int64_t t = 0; t < 2; ++t) {
        Tile& q = tiles[t];
        q.first = f.addi(c0, f.muli(W, f.cI64(t)));
        q.width = b.create<mlir::arith::SelectOp>(
            loc, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::slt, q.first, cEnd), W, zero);
        q.lanes = sk.lanesBelow(ps, zero, q.width);
        q.bytes = sk.lanesBelow(pb, zero, f.muli(q.width, four));
        Value panel = sk.divs(q.first, p16), off = sk.rems(q.first, p16);
        q.codes = f.gep(w, i8, f.addi(sk.divs(f.muli(f.muli(panel, p16), K), f.cI64(int4 ? 2 : 1)), f.muli(off, four)));
        q.scaleAt = int4 ? f.gep(scales, i16, f.addi(f.muli(f.muli(panel, p16), groups), off))
                         : f.gep(scales, f.f32, q.first);
      }
      // The biases of the block's channels (a channel past the weight's end reads the last).
      f.loop(zero, f.muli(W, f.cI64(2)), one, [&](Value j) {
        f.store(args.bias(f, sk.minI(f.addi(c0, j), sk.sub(N, one))), biasBuf, f.f32, j);
      });
      // Signed activations x the codes: int8 signed (SMOPA), int4 unsigned (SUMOPA).
      auto mopa = [&](int64_t t, Value a, Value wv) {
        sk.intr(int4 ? "llvm.aarch64.sme.sumopa.wide" : "llvm.aarch64.sme.smopa.wide", {},
             {sk.c32(t), rowBytes, tiles[t].bytes, a, wv});
      };
      // Step s's operands: int4 8 columns (two SMOPA per tile), int8 4.
      // One step of columns from its packed activations at `a` and tile t's codes at
      // w[t]: int4 8 columns (two SMOPA per tile), int8 4.
      auto step = [&](Value a, Value w0, Value w1) {
        Value ws[2] = {w0, w1};
        if (int4) {
          Value aLo = sk.load(nxi8, a, rowBytes), aHi = sk.load(nxi8, f.gep(a, i8, actOff[1]), rowBytes);
          for (int64_t t = 0; t < 2; ++t) {
            // 16 c of the low and high nibbles (a shift and a mask, no copy).
            Value raw = sk.load(nxi8, ws[t], tiles[t].bytes);
            mopa(t, aLo, b.create<mlir::arith::ShLIOp>(loc, raw, f.splatInt(nxi8, 4)));
            mopa(t, aHi, b.create<mlir::arith::AndIOp>(loc, raw, f.splatInt(nxi8, 0xF0)));
          }
        } else {
          Value av = sk.load(nxi8, a, rowBytes);
          for (int64_t t = 0; t < 2; ++t)
            mopa(t, av, sk.load(nxi8, ws[t], tiles[t].bytes));
        }
      };
      // Steps [s0, s1) as a loop over pointers, and `count` steps from s0 unrolled
      // (constant offsets, hoisted).
      const int64_t actPerStep = int4 ? 2 : 1;
      auto at = [&](Value s0) {
        return std::array<Value, 3>{f.gep(packed, i8, f.muli(s0, actOff[actPerStep])),
                                    f.gep(tiles[0].codes, i8, f.muli(s0, f.cI64(64))),
                                    f.gep(tiles[1].codes, i8, f.muli(s0, f.cI64(64)))};
      };
      auto stepLoop = [&](Value s0, Value s1) {
        std::array<Value, 3> p = at(s0);
        auto loopOp = b.create<mlir::scf::ForOp>(loc, s0, s1, one, mlir::ValueRange{p[0], p[1], p[2]});
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(loopOp.getBody());
        auto it = loopOp.getRegionIterArgs();
        step(it[0], it[1], it[2]);
        b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{f.gep(it[0], i8, actOff[actPerStep]),
                                                           f.gep(it[1], i8, f.cI64(64)),
                                                           f.gep(it[2], i8, f.cI64(64))});
      };
      // `count` steps unrolled from pointers a, w0, w1 (constant offsets, hoisted).
      auto unrolled = [&](Value a, Value w0, Value w1, int64_t count) {
        for (int64_t u = 0; u < count; ++u)
          step(f.gep(a, i8, actOff[actPerStep * u]), f.gep(w0, i8, f.cI64(64 * u)), f.gep(w1, i8, f.cI64(64 * u)));
      };
      if (int4) {
        zeroTiles(0xCC);  // f32 tiles 2 and 3
        Value stepsPerGroup = sk.divs(group, f.cI64(8));
        Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, group, f.cI64(32));
        // The group loop carries the pointers to its steps' operands.
        Value aAdvance = f.muli(stepsPerGroup, actOff[actPerStep]), wAdvance = f.muli(stepsPerGroup, f.cI64(64));
        std::array<Value, 3> start = at(zero);
        auto groupLoop = b.create<mlir::scf::ForOp>(loc, zero, groups, one, mlir::ValueRange{start[0], start[1], start[2]});
        {
          mlir::OpBuilder::InsertionGuard gl(b);
          b.setInsertionPointToStart(groupLoop.getBody());
          Value gi = groupLoop.getInductionVar();
          auto ptrs = groupLoop.getRegionIterArgs();
          zeroTiles(0x33);  // i32 tiles 0 and 1
          Value share = sk.load(nxi32, f.gep(shares, f.i32, f.muli(gi, R)), rowMask);
          for (int64_t t = 0; t < 2; ++t)
            sk.intr("llvm.aarch64.sme.addva", {}, {sk.c32(t), rowMask, tiles[t].lanes, share});
          Value s0 = f.muli(gi, stepsPerGroup);
          auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
          {
            mlir::OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToStart(ifOp.thenBlock());
            unrolled(ptrs[0], ptrs[1], ptrs[2], 4);
            b.setInsertionPointToStart(ifOp.elseBlock());
            stepLoop(s0, f.addi(s0, stepsPerGroup));
          }
          Value sc[2];
          for (int64_t t = 0; t < 2; ++t) {
            Value h = sk.load(nxf16, f.gep(tiles[t].scaleAt, i16, f.muli(gi, p16)), tiles[t].lanes);
            sc[t] = b.create<mlir::arith::ExtFOp>(loc, nxf32, h);
          }
          // Array vectors 4i + t (i < S / 4) are tile t's rows i, i + S/4, i + S/2,
          // i + 3S/4; 4i + t + 2 the same rows of tile t + 2. Two i at a time from 256
          // bits up (S / 4 even), one at 128.
          auto readOut = [&](Value i) {
            for (int64_t t = 0; t < 2; ++t) {
              Value slice = sk.i32Of(f.addi(f.muli(i, four), f.cI64(t)));
              Value sums = sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxi32)}, {slice})->getResult(0);
              Value conv = sk.intr("llvm.aarch64.sve.scvtf.x4", {sk.x4(nxf32)}, sk.parts(sums))->getResult(0);
              llvm::SmallVector<Value> ops = {sk.i32Of(f.addi(f.muli(i, four), f.cI64(t + 2)))};
              ops.append(sk.parts(conv));
              ops.push_back(sc[t]);
              sk.intr("llvm.aarch64.sme.fmla.single.vg1x4", {}, ops);
            }
          };
          // Two i at a time (S / 4 is even from 256 bits up), then one (128 bits).
          Value quarter = sk.divs(S, four);
          Value pairs = f.muli(sk.divs(quarter, f.cI64(2)), f.cI64(2));
          f.loop(zero, pairs, f.cI64(2), [&](Value i) {
            readOut(i);
            readOut(f.addi(i, one));
          });
          f.loop(pairs, quarter, one, readOut);
          b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{f.gep(ptrs[0], i8, aAdvance), f.gep(ptrs[1], i8, wAdvance),
                                                             f.gep(ptrs[2], i8, wAdvance)});
        }
      } else {
        // The steps 4 at a time, then the rest.
        zeroTiles(0x33);
        Value steps = sk.divs(K, four), main = f.muli(sk.divs(steps, four), four);
        f.loop(zero, main, four, [&](Value s0) {
          std::array<Value, 3> p = at(s0);
          unrolled(p[0], p[1], p[2], 4);
        });
        stepLoop(main, steps);
      }
      // Store the block's rows.
      Value rowScale[2], bias[2], storeMask[2];
      for (int64_t t = 0; t < 2; ++t) {
        Tile& q = tiles[t];
        if (!int4)
          rowScale[t] = sk.load(nxf32, q.scaleAt, q.lanes);
        bias[t] = sk.load(nxf32, f.gep(biasBuf, f.f32, f.muli(W, f.cI64(t))), q.lanes);
        Value inRange = sk.lanesBelow(ps, q.first, args.nEnd);
        Value before = sk.lanesBelow(ps, q.first, args.nBegin);
        storeMask[t] = sk.andP(sk.andP(q.lanes, inRange), b.create<mlir::arith::XOrIOp>(loc, before, allTrue));
      }
      f.loop(zero, rows, one, [&](Value r) {
        Value row = f.addi(mb0, r);
        // int4's totals are 16 x tile's (sums of 16 c, see step; every partial sum
        // scaled by a power of 2, so rounded alike): x s_x / 16, exactly s_x x theirs.
        Value sxScalar = f.load(f.f32, xsc, f.f32, row);
        if (int4)
          sxScalar = f.mul(sxScalar, b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(1.0f / 16)));
        Value sx = b.create<mlir::vector::SplatOp>(loc, nxf32, sxScalar);
        for (int64_t t = 0; t < 2; ++t) {
          Value val;
          if (int4) {
            val = sk.intr("llvm.aarch64.sme.read.horiz", {nxf32}, {f.splat(nxf32, 0.0), allTrue, sk.c32(t + 2), sk.i32Of(r)})
                      ->getResult(0);
            val = f.mul(val, sx);
          } else {
            Value sum = sk.intr("llvm.aarch64.sme.read.horiz", {nxi32}, {f.splatInt(nxi32, 0), allTrue, sk.c32(t), sk.i32Of(r)})
                            ->getResult(0);
            val = f.mul(f.mul(b.create<mlir::arith::SIToFPOp>(loc, nxf32, sum), sx), rowScale[t]);
          }
          val = f.add(val, bias[t]);
          Value at = f.gep(y, f.f32, f.addi(f.muli(row, ldy), tiles[t].first));
          b.create<mlir::LLVM::MaskedStoreOp>(loc, val, at, storeMask[t], 4);
        }
      });
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// SME2 for few rows (decode): the whole panels of the range of a W4A8 matmul over an
// int4_p16k8 weight, one activation row at a time, with the SME2 multi-vector dot
// products into ZA (streaming mode, ZA new, calls nothing). Vector-length agnostic: a
// vector holds W = min(S, 16) channels' 4-byte words of one step (a whole panel from
// 512 bits up, half or a quarter below; lanes past 16 stay 0 beyond 512 bits), and a
// block is the 4 vectors of 4 W consecutive channels.
//   - Per row, the offset shares of its groups, -8 x the sum of the group's
//     activations (SDOT with ones), go to the scratch.
//   - Per chunk of up to S / 2 blocks (the vector groups of ZA tiles 0 and 1; their f32
//     totals in tiles 2 and 3), per group: each block's integer sums start from the
//     group's share (MOVA of a splat into its 4 array vectors); per pair of steps one
//     16-byte load of the row's activations replicated per 128-bit segment (LD1RQB),
//     and per block and step its 4 vectors of codes (one load each), their low and
//     high nibbles (a mask, a shift) and two SDOT (4 vectors x an indexed 4-byte word,
//     vgx4): the codes of columns 8s..8s+3 against the word of those columns, the high
//     nibbles against 8s+4..8s+7. After the group's steps each block's sums are read
//     out (MOVA vgx4), converted (SCVTF x4) and multiply-added with their channels'
//     f16 group scales into the f32 totals (FMLA vgx4).
//   - y = total x s_x (+ bias), channels outside [begin, end) not stored.
// The integer sums, their conversion and the fused multiply-add per group are the
// NEON `sdot` path's, in the same order, so the outputs equal it bit for bit.
void buildMatmulInt4SmeGemv(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location loc) {
  SmeKernel sk(kernels, name, loc);
  mlir::func::FuncOp fn = sk.fn;
  mlir::OpBuilder& b = sk.b;
  FnBuilder& f = sk.f;
  mlir::Type i8 = sk.i8, i16 = sk.i16;
  mlir::VectorType nxi8 = sk.nxi8, nxi32 = sk.nxi32, nxf32 = sk.nxf32, nxf16 = sk.nxf16, pb = sk.pb, ps = sk.ps;

  Value scratch = fn.getArgument(3);
  const MatmulArgs args(f, fn, /*f16Bias=*/true);
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value zero = f.cI64(0), one = f.cI64(1), four = f.cI64(4), p16 = f.cI64(format::kP16K8Rows);
  Value S = sk.intr("llvm.aarch64.sme.cntsw", {f.i64}, {})->getResult(0);
  Value W = sk.minI(S, p16), blockChannels = f.muli(W, four);
  Value group = b.create<mlir::arith::ExtUIOp>(
      loc, f.i64,
      f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group), f.i32));
  Value groups = sk.divs(K, group), stepPairs = sk.divs(group, f.cI64(16));
  Value scales = f.gep(w, i8, sk.divs(f.muli(N, K), f.cI64(2)));
  Value cBegin, cEnd;
  std::tie(cBegin, cEnd) = sk.wholePanels(args.nBegin, args.nEnd, N);
  // Scratch: the biases of two blocks (8 W <= 128), the row's shares (groups).
  Value biasBuf = scratch;
  Value shares = f.gep(scratch, f.f32, f.cI64(128));
  Value allTrue = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(ps, true));
  Value allBytes = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(pb, true));
  Value ones = f.splatInt(nxi8, 1), lowMask = f.splatInt(nxi8, 0x0F), four8 = f.splatInt(nxi8, 4);
  Value bytesPerVec = f.muli(S, four);
  Value wBytes = sk.lanesBelow(pb, zero, f.muli(W, four));  // a vector's W words

  f.loop(zero, M, one, [&](Value r) {
    Value xRow = f.gep(xq, i8, f.muli(r, K));
    // The row's offset shares: -8 x the sum of each group's activations.
    f.loop(zero, groups, one, [&](Value gi) {
      Value g0 = f.muli(gi, group);
      auto sum = b.create<mlir::scf::ForOp>(loc, zero, group, bytesPerVec, mlir::ValueRange{f.splatInt(nxi32, 0)});
      {
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(sum.getBody());
        Value j = sum.getInductionVar();
        Value v = sk.load(nxi8, f.gep(xRow, i8, f.addi(g0, j)), sk.lanesBelow(pb, j, group));
        b.create<mlir::scf::YieldOp>(
            loc, sk.intr("llvm.aarch64.sve.sdot", {nxi32}, {sum.getRegionIterArgs()[0], v, ones})->getResult(0));
      }
      Value total = sk.intr("llvm.aarch64.sve.saddv", {f.i64}, {allTrue, sum.getResult(0)})->getResult(0);
      f.store(sk.i32Of(f.muli(total, f.cI64(-8))), shares, f.i32, gi);
    });
    Value sx = b.create<mlir::vector::SplatOp>(loc, nxf32, f.load(f.f32, xsc, f.f32, r));

    // Two blocks at a time (kGemvBlocks): tiles 0 and 1 hold their integer sums, 2 and
    // 3 their f32 totals.
    constexpr int64_t kGemvBlocks = 2, kVecs = 4 * kGemvBlocks;
    Value stepChannels = f.muli(blockChannels, f.cI64(kGemvBlocks));
    f.loop(cBegin, cEnd, stepChannels, [&](Value c0) {
      // Vector k: channels [c0 + k W, + W) when they are whole panels' (the last
      // blocks may run past the last), its codes at step 0 and its scales; block j is
      // vectors 4 j .. 4 j + 3. `whole`: all are (the masks are constants, none kept
      // in registers).
      struct Vec {
        Value first, lanes, bytes, codes, scaleAt;
      };
      auto vecs = [&](bool whole) {
        std::array<Vec, kVecs> vs;
        for (int64_t k = 0; k < kVecs; ++k) {
          Vec& v = vs[k];
          v.first = f.addi(c0, f.muli(W, f.cI64(k)));
          if (whole) {
            v.lanes = sk.lanesBelow(ps, zero, W);
            v.bytes = wBytes;
          } else {
            Value width = b.create<mlir::arith::SelectOp>(
                loc, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::slt, v.first, cEnd), W, zero);
            v.lanes = sk.lanesBelow(ps, zero, width);
            v.bytes = sk.lanesBelow(pb, zero, f.muli(width, four));
          }
          Value panel = sk.divs(v.first, p16), off = sk.rems(v.first, p16);
          v.codes = f.gep(w, i8, f.addi(sk.divs(f.muli(f.muli(panel, p16), K), f.cI64(2)), f.muli(off, four)));
          v.scaleAt = f.gep(scales, i16, f.addi(f.muli(f.muli(panel, p16), groups), off));
        }
        return vs;
      };
      // Block j's integer sums in ZA tile j's vector group 0, its f32 totals in tile
      // j + 2's.
      auto intSlice = [&](int64_t j) { return sk.c32(j); };
      auto f32Slice = [&](int64_t j) { return sk.c32(j + 2); };
      auto block = [&](const std::array<Vec, kVecs>& vs) {
        sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(0xCC)});  // f32 tiles 2 and 3
        // Steps from byte offset `at` of each vector's codes (64 bytes a step) and the
        // row's activations from `x` (8 bytes a step), a pair at a time.
        auto stepPair = [&](Value at, Value x) {
          // Columns 8s..8s+15: words 0, 1 (step s low, high), 2, 3 (step s + 1).
          Value xw = sk.intr("llvm.aarch64.sve.ld1rq", {nxi8}, {allBytes, x})->getResult(0);
          for (int64_t u = 0; u < 2; ++u)
            for (int64_t j = 0; j < kGemvBlocks; ++j) {
              llvm::SmallVector<Value> lo, hi;
              for (int64_t k = 4 * j; k < 4 * j + 4; ++k) {
                Value raw = sk.load(nxi8, f.gep(vs[k].codes, i8, f.addi(at, f.cI64(64 * u))), vs[k].bytes);
                lo.push_back(b.create<mlir::arith::AndIOp>(loc, raw, lowMask));
                hi.push_back(b.create<mlir::arith::ShRUIOp>(loc, raw, four8));
              }
              sk.intr("llvm.aarch64.sme.sdot.lane.za32.vg1x4", {},
                   {intSlice(j), lo[0], lo[1], lo[2], lo[3], xw, sk.c32(2 * u)});
              sk.intr("llvm.aarch64.sme.sdot.lane.za32.vg1x4", {},
                   {intSlice(j), hi[0], hi[1], hi[2], hi[3], xw, sk.c32(2 * u + 1)});
            }
        };
        Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, group, f.cI64(32));
        Value groupBytes = f.muli(stepPairs, f.cI64(128));  // codes per group and vector
        auto groupLoop = b.create<mlir::scf::ForOp>(loc, zero, groups, one, mlir::ValueRange{zero});
        {
          mlir::OpBuilder::InsertionGuard gl(b);
          b.setInsertionPointToStart(groupLoop.getBody());
          Value gi = groupLoop.getInductionVar(), at = groupLoop.getRegionIterArgs()[0];
          sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(0x33)});  // integer tiles 0 and 1
          Value x = f.gep(xRow, i8, f.muli(gi, group));
          // Group 32 (two pairs of steps) unrolled; others a loop over the pairs.
          auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
          {
            mlir::OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToStart(ifOp.thenBlock());
            stepPair(at, x);
            stepPair(f.addi(at, f.cI64(128)), f.gep(x, i8, f.cI64(16)));
            b.setInsertionPointToStart(ifOp.elseBlock());
            f.loop(zero, stepPairs, one, [&](Value sp) {
              stepPair(f.addi(at, f.muli(sp, f.cI64(128))), f.gep(x, i8, f.muli(sp, f.cI64(16))));
            });
          }
          // The group's sums plus its offset share, converted and multiply-added with
          // its scales.
          Value share = b.create<mlir::vector::SplatOp>(loc, nxi32, f.load(f.i32, shares, f.i32, gi));
          for (int64_t j = 0; j < kGemvBlocks; ++j) {
            Value sums = sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxi32)}, {intSlice(j)})->getResult(0);
            llvm::SmallVector<Value> addOps = sk.parts(sums);
            addOps.push_back(share);
            Value shifted = sk.intr("llvm.aarch64.sve.add.single.x4", {sk.x4(nxi32)}, addOps)->getResult(0);
            Value conv = sk.intr("llvm.aarch64.sve.scvtf.x4", {sk.x4(nxf32)}, sk.parts(shifted))->getResult(0);
            llvm::SmallVector<Value> ops = {f32Slice(j)};
            ops.append(sk.parts(conv));
            for (int64_t k = 4 * j; k < 4 * j + 4; ++k) {
              Value h = sk.load(nxf16, f.gep(vs[k].scaleAt, i16, f.muli(gi, p16)), vs[k].lanes);
              ops.push_back(b.create<mlir::arith::ExtFOp>(loc, nxf32, h));
            }
            sk.intr("llvm.aarch64.sme.fmla.vg1x4", {}, ops);
          }
          b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{f.addi(at, groupBytes)});
        }
        // Store: y = total x s_x + bias.
        auto withBias = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, args.hasBias, false);
        {
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(withBias.thenBlock());
          f.loop(zero, stepChannels, one, [&](Value j) {
            f.store(args.bias(f, sk.minI(f.addi(c0, j), sk.sub(N, one))), biasBuf, f.f32, j);
          });
        }
        llvm::SmallVector<Value> t;
        for (int64_t j = 0; j < kGemvBlocks; ++j)
          t.append(sk.parts(sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxf32)}, {f32Slice(j)})->getResult(0)));
        for (int64_t k = 0; k < kVecs; ++k) {
          const Vec& v = vs[k];
          Value bias = b.create<mlir::arith::SelectOp>(
              loc, args.hasBias, sk.load(nxf32, f.gep(biasBuf, f.f32, f.muli(W, f.cI64(k))), v.lanes),
              f.splat(nxf32, 0.0));
          Value inRange = sk.lanesBelow(ps, v.first, args.nEnd);
          Value before = sk.lanesBelow(ps, v.first, args.nBegin);
          Value mask = sk.andP(sk.andP(v.lanes, inRange), b.create<mlir::arith::XOrIOp>(loc, before, allTrue));
          Value val = f.add(f.mul(t[k], sx), bias);
          b.create<mlir::LLVM::MaskedStoreOp>(loc, val, f.gep(y, f.f32, f.addi(f.muli(r, ldy), v.first)), mask, 4);
        }
      };
      Value whole = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sle, f.addi(c0, stepChannels), cEnd);
      auto wholeIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, whole, true);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(wholeIf.thenBlock());
      block(vecs(true));
      b.setInsertionPointToStart(wholeIf.elseBlock());
      block(vecs(false));
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// ---- int4_p128k4: SME2 W4A8 whose codes a table lookup expands ----
//
// LUTI4 (SME2) expands one vector of 4-bit codes into two vectors of bytes, each code
// looked up in ZT0; with ZT0 holding c - 8 for c = 0..15 a panel step's nibbles in
// order (formats/encoding.h int4_p128k4) become, at any vector length, two vectors
// of S channels' signed 4-column dot-product operands: no masks, shifts or offset
// shares. The sums are the NEON `sdot` path's exactly (sum x (c - 8)), converted and
// multiply-added with the group scales in the same order, so the outputs equal it bit
// for bit.

// ZT0 <- the values c - 8 of the codes c = 0..15 (LUTI4 on bytes takes the low byte
// of each 32-bit entry), from a table on the stack. Call it first in a kernel.
void loadInt4Table(SmeKernel& sk) {
  FnBuilder& f = sk.f;
  auto table = mlir::LLVM::LLVMArrayType::get(f.i32, 16);
  Value at = sk.b.create<mlir::LLVM::AllocaOp>(sk.loc, f.ptr, table, f.cI64(1), 16);
  for (int64_t c = 0; c < 16; ++c)
    f.store(sk.c32((c - 8) & 0xFF), at, f.i32, f.cI64(c));
  sk.intr("llvm.aarch64.sme.ldr.zt", {}, {sk.c32(0), at});
}

// The two vectors LUTI4 expands one vector of codes to.
std::pair<Value, Value> lookUpInt4(SmeKernel& sk, Value codes) {
  auto pair = mlir::LLVM::LLVMStructType::getLiteral(sk.b.getContext(), {sk.nxi8, sk.nxi8});
  Value both = sk.intr("llvm.aarch64.sme.luti4.lane.zt.x2", {pair}, {sk.c32(0), codes, sk.c32(0)})->getResult(0);
  return {sk.b.create<mlir::LLVM::ExtractValueOp>(sk.loc, both, 0), sk.b.create<mlir::LLVM::ExtractValueOp>(sk.loc, both, 1)};
}

// A run of `span` output channels from c (a multiple of span, which divides 128) of an
// int4_p128k4 weight: its codes at step 0, the bytes from a step to the next, how
// many of its channels the weight has (0 past its end), its f16 scales of group 0 and
// the scales from a group to the next (the panel's height).
struct LutRun {
  Value codes, stride, channels, scales, height;
};
LutRun lutRun(SmeKernel& sk, Value w, Value scales, Value N, Value K, Value groups, Value c, Value span) {
  FnBuilder& f = sk.f;
  Value p = f.cI64(format::kP128K4Rows), zero = f.cI64(0), two = f.cI64(2);
  Value first = f.muli(sk.divs(c, p), p);
  LutRun r;
  r.height = sk.maxI(sk.minI(p, sk.sub(N, first)), zero);
  Value off = sk.sub(c, first);
  r.channels = sk.maxI(sk.minI(span, sk.sub(r.height, off)), zero);
  r.codes = f.gep(w, sk.i8, f.addi(sk.divs(f.muli(first, K), two), f.muli(off, two)));
  r.stride = f.muli(r.height, two);
  r.scales = f.gep(scales, sk.i16, f.addi(f.muli(first, groups), off));
  return r;
}

// Few rows (decode): a row at a time, chunks of 8 S channels (two blocks of 4 vectors,
// S channels a vector), per group and step of 4 columns each block's 2 vectors of
// codes (2 S channels' steps each) expanded by LUTI4 into its 4 vectors and dotted
// with the step's 4-byte activation word (SDOT vgx4 by index, the row's 16 bytes of 4
// steps replicated per 128-bit segment by one LD1RQB) into ZA. After the group each
// block's sums are read out (MOVA vgx4), converted (SCVTF x4) and multiply-added with
// their channels' f16 scales into f32 totals (FMLA vgx4); y = total x s_x (+ bias).
// Chunks start at a multiple of min(8 S, 128) channels at or below `begin`: a run of
// 2 S channels never straddles a panel, and a chunk of whole panels (8 S <= 128) is
// one run of codes 256 bytes a step (constant offsets). Outputs outside [begin, end)
// are computed and not stored. Needs no scratch but S floats (the biases of a vector).
void buildMatmulInt4LutGemv(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location loc) {
  SmeKernel sk(kernels, name, loc);
  mlir::func::FuncOp fn = sk.fn;
  fn->setAttr(kSmeZt0AttrName, sk.b.getUnitAttr());
  mlir::OpBuilder& b = sk.b;
  FnBuilder& f = sk.f;
  mlir::Type i8 = sk.i8, i16 = sk.i16;
  mlir::VectorType nxi8 = sk.nxi8, nxi32 = sk.nxi32, nxf32 = sk.nxf32, nxf16 = sk.nxf16, pb = sk.pb, ps = sk.ps;
  loadInt4Table(sk);

  Value biasBuf = fn.getArgument(3);
  const MatmulArgs args(f, fn, /*f16Bias=*/true);
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value zero = f.cI64(0), one = f.cI64(1), two = f.cI64(2), four = f.cI64(4), p128 = f.cI64(format::kP128K4Rows);
  // S from vscale (not CNTW): offsets that are multiples of it become immediates.
  Value S = f.muli(b.create<mlir::arith::IndexCastOp>(loc, f.i64, b.create<mlir::vector::VectorScaleOp>(loc)), four);
  Value run = f.muli(S, two), chunk = f.muli(S, f.cI64(8));
  // The 4 vectors of codes of a step of a whole chunk: one multi-vector load.
  mlir::Type svcount = mlir::LLVM::LLVMTargetExtType::get(b.getContext(), "aarch64.svcount", {}, {});
  Value allCount = sk.intr("llvm.aarch64.sve.ptrue.c8", {svcount}, {})->getResult(0);
  Value allHalves = sk.intr("llvm.aarch64.sve.ptrue.c16", {svcount}, {})->getResult(0);
  mlir::VectorType nxi16 = mlir::VectorType::get({8}, i16, {true});
  mlir::VectorType nxf16x8 = mlir::VectorType::get({8}, sk.f16, {true});
  // ZA slices from a base LLVM cannot fold (CNTW >> 16 is 0 at every vector length)
  // plus constant offsets: the SME instructions take the offsets as immediates instead
  // of a register per slice.
  Value sliceBase = sk.i32Of(b.create<mlir::arith::ShRUIOp>(
      loc, sk.intr("llvm.aarch64.sme.cntsw", {f.i64}, {})->getResult(0), f.cI64(16)));
  Value group = b.create<mlir::arith::ExtUIOp>(
      loc, f.i64,
      f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group), f.i32));
  Value groups = sk.divs(K, group), stepsPerGroup = sk.divs(group, four);
  Value scales = f.gep(w, i8, sk.divs(f.muli(N, K), two));
  Value align = sk.minI(chunk, p128);
  Value cBegin = f.muli(sk.divs(args.nBegin, align), align);
  Value wholeEnd = f.muli(sk.divs(N, p128), p128);
  Value smallChunk = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sle, chunk, p128);
  Value allTrue = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(ps, true));
  Value allBytes = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(pb, true));
  Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, group, f.cI64(32));
  Value quads = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, sk.rems(group, f.cI64(16)), zero);

  f.loop(zero, M, one, [&](Value r) {
    Value xRow = f.gep(xq, i8, f.muli(r, K));
    Value sx = b.create<mlir::vector::SplatOp>(loc, nxf32, f.load(f.f32, xsc, f.f32, r));
    f.loop(cBegin, args.nEnd, chunk, [&](Value c0) {
      // Runs q = 0..3 of 2 S channels (block j: runs 2 j and 2 j + 1); vector k = 2 q + h
      // is run q's h-th S channels.
      struct Run {
        Value codes, stride, bytes, scales, height, channels;
      };
      auto runs = [&](bool whole) {
        std::array<Run, 4> rs;
        LutRun first = lutRun(sk, w, scales, N, K, groups, c0, run);
        for (int64_t q = 0; q < 4; ++q) {
          Run& rq = rs[q];
          if (whole) {  // one whole panel: constant strides
            rq.codes = f.gep(first.codes, i8, f.muli(run, f.cI64(2 * q)));
            rq.stride = f.cI64(2 * format::kP128K4Rows);
            rq.bytes = allBytes;
            rq.scales = f.gep(first.scales, i16, f.muli(run, f.cI64(q)));
            rq.height = p128;
            rq.channels = run;
          } else {
            LutRun l = q == 0 ? first : lutRun(sk, w, scales, N, K, groups, f.addi(c0, f.muli(run, f.cI64(q))), run);
            rq = {l.codes, l.stride, sk.lanesBelow(pb, zero, f.muli(l.channels, two)), l.scales, l.height, l.channels};
          }
        }
        return rs;
      };
      auto intSlice = [&](int64_t j) { return b.create<mlir::arith::AddIOp>(loc, sliceBase, sk.c32(j)).getResult(); };
      auto f32Slice = [&](int64_t j) { return b.create<mlir::arith::AddIOp>(loc, sliceBase, sk.c32(j + 2)).getResult(); };
      auto block = [&](const std::array<Run, 4>& rs, bool whole) {
        std::array<Value, 8> lanes;
        for (int64_t k = 0; k < 8; ++k)
          lanes[k] = sk.lanesBelow(ps, f.muli(S, f.cI64(k % 2)), rs[k / 2].channels);
        sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(0xCC)});  // f32 tiles 2 and 3
        // Step t (of the whole row) dotted with word `i` of `xw`.
        auto step = [&](Value t, Value xw, int64_t i) {
          std::array<Value, 4> raws;
          if (whole) {
            Value all = sk.intr("llvm.aarch64.sve.ld1.pn.x4", {sk.x4(nxi8)},
                                {allCount, f.gep(rs[0].codes, i8, f.muli(t, rs[0].stride))})
                            ->getResult(0);
            llvm::SmallVector<Value> ps4 = sk.parts(all);
            std::copy(ps4.begin(), ps4.end(), raws.begin());
          } else {
            for (int64_t q = 0; q < 4; ++q)
              raws[q] = sk.load(nxi8, f.gep(rs[q].codes, i8, f.muli(t, rs[q].stride)), rs[q].bytes);
          }
          // Every lookup of the step before its SDOTs: LLVM 19 drops an SDOT (ZA) that
          // a LUTI4 (ZT0) follows in the same block when the step's loads come first.
          std::array<Value, 8> ws;
          for (int64_t q = 0; q < 4; ++q)
            std::tie(ws[2 * q], ws[2 * q + 1]) = lookUpInt4(sk, raws[q]);
          for (int64_t j = 0; j < 2; ++j) {
            llvm::SmallVector<Value> ops = {intSlice(j)};
            ops.append(ws.begin() + 4 * j, ws.begin() + 4 * j + 4);
            ops.push_back(xw);
            ops.push_back(sk.c32(i));
            sk.intr("llvm.aarch64.sme.sdot.lane.za32.vg1x4", {}, ops);
          }
        };
        // Four steps from t0 against the row's 16 bytes from column 4 t0.
        auto quad = [&](Value t0) {
          Value xw = sk.intr("llvm.aarch64.sve.ld1rq", {nxi8}, {allBytes, f.gep(xRow, i8, f.muli(t0, four))})->getResult(0);
          for (int64_t i = 0; i < 4; ++i)
            step(f.addi(t0, f.cI64(i)), xw, i);
        };
        f.loop(zero, groups, one, [&](Value gi) {
          sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(0x33)});  // integer tiles 0 and 1
          Value t0 = f.muli(gi, stepsPerGroup);
          // Group 32 unrolled; a multiple of 16 four steps at a time; others one step
          // at a time (the activation word alone, so nothing past the row is read).
          auto g32 = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
          {
            mlir::OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToStart(g32.thenBlock());
            quad(t0);
            quad(f.addi(t0, four));
            b.setInsertionPointToStart(g32.elseBlock());
            auto g16 = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, quads, true);
            b.setInsertionPointToStart(g16.thenBlock());
            f.loop(t0, f.addi(t0, stepsPerGroup), four, quad);
            b.setInsertionPointToStart(g16.elseBlock());
            f.loop(t0, f.addi(t0, stepsPerGroup), one, [&](Value t) {
              Value word = sk.lanesBelow(pb, zero, four);
              Value xw = sk.intr("llvm.aarch64.sve.ld1rq", {nxi8}, {word, f.gep(xRow, i8, f.muli(t, four))})->getResult(0);
              step(t, xw, 0);
            });
          }
          // The group's scales of the 8 vectors as f32: a whole chunk's are 8 S
          // consecutive f16 (one multi-vector load, unpacked to 32-bit lanes four
          // vectors at a time, converted in place); otherwise one load per vector.
          std::array<Value, 8> sc;
          if (whole) {
            Value all = sk.intr("llvm.aarch64.sve.ld1.pn.x4", {sk.x4(nxi16)},
                                {allHalves, f.gep(rs[0].scales, i16, f.muli(gi, p128))})
                            ->getResult(0);
            llvm::SmallVector<Value> h = sk.parts(all);
            for (int64_t u = 0; u < 2; ++u) {
              Value wide = sk.intr("llvm.aarch64.sve.uunpk.x4", {sk.x4(nxi32)}, {h[2 * u], h[2 * u + 1]})->getResult(0);
              llvm::SmallVector<Value> w4 = sk.parts(wide);
              for (int64_t v = 0; v < 4; ++v) {
                Value bits = b.create<mlir::LLVM::BitcastOp>(loc, nxf16x8, w4[v]);
                Value same = b.create<mlir::LLVM::BitcastOp>(loc, nxf32, w4[v]);
                sc[4 * u + v] = sk.intr("llvm.aarch64.sve.fcvt.f32f16", {nxf32}, {same, allTrue, bits})->getResult(0);
              }
            }
          } else {
            for (int64_t k = 0; k < 8; ++k) {
              const Run& rq = rs[k / 2];
              Value at = f.gep(rq.scales, i16, f.addi(f.muli(gi, rq.height), f.muli(S, f.cI64(k % 2))));
              sc[k] = b.create<mlir::arith::ExtFOp>(loc, nxf32, sk.load(nxf16, at, lanes[k]));
            }
          }
          for (int64_t j = 0; j < 2; ++j) {
            Value sums = sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxi32)}, {intSlice(j)})->getResult(0);
            Value conv = sk.intr("llvm.aarch64.sve.scvtf.x4", {sk.x4(nxf32)}, sk.parts(sums))->getResult(0);
            llvm::SmallVector<Value> ops = {f32Slice(j)};
            ops.append(sk.parts(conv));
            ops.append(sc.begin() + 4 * j, sc.begin() + 4 * j + 4);
            sk.intr("llvm.aarch64.sme.fmla.vg1x4", {}, ops);
          }
        });
        // Store: y = total x s_x + bias.
        llvm::SmallVector<Value> t;
        for (int64_t j = 0; j < 2; ++j)
          t.append(sk.parts(sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxf32)}, {f32Slice(j)})->getResult(0)));
        for (int64_t k = 0; k < 8; ++k) {
          Value first = f.addi(c0, f.muli(S, f.cI64(k)));
          auto withBias = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, args.hasBias, false);
          {
            mlir::OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToStart(withBias.thenBlock());
            f.loop(zero, S, one, [&](Value l) {
              f.store(args.bias(f, sk.minI(f.addi(first, l), sk.sub(N, one))), biasBuf, f.f32, l);
            });
          }
          Value bias = b.create<mlir::arith::SelectOp>(loc, args.hasBias, sk.load(nxf32, biasBuf, lanes[k]),
                                                       f.splat(nxf32, 0.0));
          Value inRange = sk.lanesBelow(ps, first, args.nEnd);
          Value before = sk.lanesBelow(ps, first, args.nBegin);
          Value mask = sk.andP(sk.andP(lanes[k], inRange), b.create<mlir::arith::XOrIOp>(loc, before, allTrue));
          Value val = f.add(f.mul(t[k], sx), bias);
          b.create<mlir::LLVM::MaskedStoreOp>(loc, val, f.gep(y, f.f32, f.addi(f.muli(r, ldy), first)), mask, 4);
        }
      };
      Value whole = sk.andP(smallChunk, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sle,
                                                                      f.addi(c0, chunk), wholeEnd));
      auto wholeIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, whole, true);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(wholeIf.thenBlock());
      block(runs(true), true);
      b.setInsertionPointToStart(wholeIf.elseBlock());
      block(runs(false), false);
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// Blocks of many rows (prefill): buildMatmulIntSme's outer products over an
// int4_p128k4 weight. Per block of R = min(S, kSmeBlockRows) activation rows packed
// through a ZA transpose as there, and per run of 2 S channels (tiles 0 and 1, S
// channels each): per step of 4 columns one vector of codes, LUTI4 into the tiles' two
// operands and one 4-way widening SMOPA per tile; per group the sums read out four
// array vectors at a time (MOVA), converted (SCVTF x4) and multiply-added with the
// channel scales into f32 tiles 2 and 3 (FMLA vgx4). Runs start at a multiple of 2 S
// at or below `begin` and cover every channel of the range, the last panel's too.
// Scratch: 2 S <= 128 biases, then the packed rows (R x K bytes): at most 64 K bytes
// from K = 16 up (kiln_uk_matmul_scratch_ref(K) = 64 K bytes).
void buildMatmulInt4LutMopa(mlir::ModuleOp kernels, llvm::StringRef name, mlir::Location loc) {
  SmeKernel sk(kernels, name, loc);
  mlir::func::FuncOp fn = sk.fn;
  fn->setAttr(kSmeZt0AttrName, sk.b.getUnitAttr());
  mlir::OpBuilder& b = sk.b;
  FnBuilder& f = sk.f;
  mlir::Type i8 = sk.i8, i16 = sk.i16;
  mlir::VectorType nxi8 = sk.nxi8, nxi32 = sk.nxi32, nxf32 = sk.nxf32, nxf16 = sk.nxf16, pb = sk.pb, ps = sk.ps;
  auto zeroTiles = [&](int64_t mask) { sk.intr("llvm.aarch64.sme.zero", {}, {sk.c32(mask)}); };
  loadInt4Table(sk);

  Value scratch = fn.getArgument(3);
  const MatmulArgs args(f, fn, /*f16Bias=*/true);
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value zero = f.cI64(0), one = f.cI64(1), two = f.cI64(2), four = f.cI64(4);
  Value S = sk.intr("llvm.aarch64.sme.cntsw", {f.i64}, {})->getResult(0);
  Value R = sk.minI(S, f.cI64(kSmeBlockRows)), run = f.muli(S, two);
  Value group = b.create<mlir::arith::ExtUIOp>(
      loc, f.i64,
      f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group), f.i32));
  Value groups = sk.divs(K, group), stepsPerGroup = sk.divs(group, four);
  Value scales = f.gep(w, i8, sk.divs(f.muli(N, K), two));
  Value cBegin = f.muli(sk.divs(args.nBegin, run), run);
  Value biasBuf = scratch;
  Value packed = f.gep(scratch, f.f32, f.cI64(128));
  Value allTrue = b.create<mlir::arith::ConstantOp>(loc, mlir::DenseElementsAttr::get(ps, true));
  Value stepBytes = f.muli(R, four);  // a step's packed activations (4 columns of R rows)
  Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, group, f.cI64(32));

  f.loop(zero, M, R, [&](Value mb0) {
    Value rows = sk.minI(R, sk.sub(M, mb0));
    Value rowMask = sk.lanesBelow(ps, zero, rows), rowBytes = sk.lanesBelow(pb, zero, f.muli(rows, four));
    sk.packRows(xq, K, S, mb0, rows, rowMask, packed, stepBytes);

    f.loop(cBegin, args.nEnd, run, [&](Value c0) {
      LutRun lr = lutRun(sk, w, scales, N, K, groups, c0, run);
      Value codeBytes = sk.lanesBelow(pb, zero, f.muli(lr.channels, two));
      Value lanes[2], bytes[2];
      for (int64_t t = 0; t < 2; ++t) {
        Value width = sk.maxI(sk.minI(S, sk.sub(lr.channels, f.muli(S, f.cI64(t)))), zero);
        lanes[t] = sk.lanesBelow(ps, zero, width);
        bytes[t] = sk.lanesBelow(pb, zero, f.muli(width, four));
      }
      // The biases of the run's channels (a channel past the weight's end reads the last).
      f.loop(zero, run, one, [&](Value j) {
        f.store(args.bias(f, sk.minI(f.addi(c0, j), sk.sub(N, one))), biasBuf, f.f32, j);
      });
      // Step t: its packed activations and codes, one SMOPA per tile.
      auto step = [&](Value t) {
        Value a = sk.load(nxi8, f.gep(packed, i8, f.muli(t, stepBytes)), rowBytes);
        Value raw = sk.load(nxi8, f.gep(lr.codes, i8, f.muli(t, lr.stride)), codeBytes);
        auto [w0, w1] = lookUpInt4(sk, raw);
        Value ws[2] = {w0, w1};
        for (int64_t t2 = 0; t2 < 2; ++t2)
          sk.intr("llvm.aarch64.sme.smopa.wide", {}, {sk.c32(t2), rowBytes, bytes[t2], a, ws[t2]});
      };
      zeroTiles(0xCC);  // f32 tiles 2 and 3
      f.loop(zero, groups, one, [&](Value gi) {
        zeroTiles(0x33);  // i32 tiles 0 and 1
        Value t0 = f.muli(gi, stepsPerGroup);
        auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
        {
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(ifOp.thenBlock());
          for (int64_t u = 0; u < 8; ++u)
            step(f.addi(t0, f.cI64(u)));
          b.setInsertionPointToStart(ifOp.elseBlock());
          f.loop(t0, f.addi(t0, stepsPerGroup), one, step);
        }
        Value sc[2];
        for (int64_t t = 0; t < 2; ++t) {
          Value at = f.gep(lr.scales, i16, f.addi(f.muli(gi, lr.height), f.muli(S, f.cI64(t))));
          sc[t] = b.create<mlir::arith::ExtFOp>(loc, nxf32, sk.load(nxf16, at, lanes[t]));
        }
        // Array vectors 4i + t (i < S / 4) are tile t's rows i, i + S/4, i + S/2,
        // i + 3S/4; 4i + t + 2 the same rows of tile t + 2.
        f.loop(zero, sk.divs(S, four), one, [&](Value i) {
          for (int64_t t = 0; t < 2; ++t) {
            Value slice = sk.i32Of(f.addi(f.muli(i, four), f.cI64(t)));
            Value sums = sk.intr("llvm.aarch64.sme.read.vg1x4", {sk.x4(nxi32)}, {slice})->getResult(0);
            Value conv = sk.intr("llvm.aarch64.sve.scvtf.x4", {sk.x4(nxf32)}, sk.parts(sums))->getResult(0);
            llvm::SmallVector<Value> ops = {sk.i32Of(f.addi(f.muli(i, four), f.cI64(t + 2)))};
            ops.append(sk.parts(conv));
            ops.push_back(sc[t]);
            sk.intr("llvm.aarch64.sme.fmla.single.vg1x4", {}, ops);
          }
        });
      });
      // Store the block's rows: y = total x s_x + bias, outside [begin, end) not.
      Value bias[2], storeMask[2];
      for (int64_t t = 0; t < 2; ++t) {
        Value first = f.addi(c0, f.muli(S, f.cI64(t)));
        bias[t] = sk.load(nxf32, f.gep(biasBuf, f.f32, f.muli(S, f.cI64(t))), lanes[t]);
        Value inRange = sk.lanesBelow(ps, first, args.nEnd);
        Value before = sk.lanesBelow(ps, first, args.nBegin);
        storeMask[t] = sk.andP(sk.andP(lanes[t], inRange), b.create<mlir::arith::XOrIOp>(loc, before, allTrue));
      }
      f.loop(zero, rows, one, [&](Value r) {
        Value row = f.addi(mb0, r);
        Value sx = b.create<mlir::vector::SplatOp>(loc, nxf32, f.load(f.f32, xsc, f.f32, row));
        for (int64_t t = 0; t < 2; ++t) {
          Value val = sk.intr("llvm.aarch64.sme.read.horiz", {nxf32},
                              {f.splat(nxf32, 0.0), allTrue, sk.c32(t + 2), sk.i32Of(r)})
                          ->getResult(0);
          val = f.add(f.mul(val, sx), bias[t]);
          Value at = f.gep(y, f.f32, f.addi(f.muli(row, ldy), f.addi(c0, f.muli(S, f.cI64(t)))));
          b.create<mlir::LLVM::MaskedStoreOp>(loc, val, at, storeMask[t], 4);
        }
      });
    });
  });
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// The W4A8 matmul over an int4_p128k4 weight (SME2): blocks of kSmeMinRows rows or
// more as outer products (from K = 16 up: their scratch), fewer as dot products.
void buildMatmulInt4Lut(mlir::ModuleOp kernels, llvm::StringRef name, bool isPublic, mlir::Location loc) {
  const std::string mopa = (name + "_mopa").str(), gemv = (name + "_gemv").str();
  buildMatmulInt4LutMopa(kernels, mopa, loc);
  buildMatmulInt4LutGemv(kernels, gemv, loc);
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  Value M = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, M), f.i64);
  Value K = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, K), f.i64);
  Value many = b.create<mlir::arith::AndIOp>(
      loc, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, M, f.cI64(kSmeMinRows)),
      b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, K, f.cI64(16)));
  auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, many, /*withElse=*/true);
  b.setInsertionPointToStart(ifOp.thenBlock());
  b.create<mlir::func::CallOp>(loc, mopa, mlir::TypeRange{}, fn.getArguments());
  b.setInsertionPointToStart(ifOp.elseBlock());
  b.create<mlir::func::CallOp>(loc, gemv, mlir::TypeRange{}, fn.getArguments());
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// Rows per block of the SMMLA (i8mm) path (a multiple of 8; see buildMatmulIntPanels).
constexpr int64_t kMmlaBlockRows = 16, kPairsPerBlock = kMmlaBlockRows / 2;

// How far ahead of its loads a single-row panel tile (decode) prefetches each panel's
// weight, in bytes; 0: no software prefetch. Measured on three x86 hosts, Llama-3.2-1B
// W4A8 decode, one panel per tile:
//  - Intel Xeon with AVX-512 (Sapphire Rapids class, 2026-12-05): 1.34-1.37x (0.5 and 1 KB),
//    1.44-1.47x (2 KB) and 1.45-1.53x (4 KB) faster than none with 1 and 2 threads; 8 and
//    16 KB 5-8% slower than 4 KB.
//  - AMD Zen 1, AVX2: 1.7x (2 threads) to 1.9x (1 thread) faster with them, distances
//    of 0.5 to 4 KB alike.
//  - AMD Zen 5, AVX-512 (2026-12-03, then two panels per tile): none was 1.16x faster
//    than 1 KB (2 threads), no distance of 0.5 to 32 KB faster than none.
// Two of three gain 1.5-1.9x, one lost up to 1.16x: x86 prefetches 4 KB ahead. Arm
// prefetches 1 KB ahead (not measured on hardware). The float-activation kernels
// (buildMatmulPanels) never do: on the Zen 1 host prefetching changed neither f16
// decode (at the bandwidth already) nor W4A16's (bound by decoding the codes to f32).
int64_t decodePrefetchBytes(const Target& target) {
  return target.arch == TargetArch::X86_64 ? 4096 : 1024;
}

// Each row's offset share per group for rows [mb0, mb0 + mb) of the int8 activations
// xq [., K]: `factor` (-8 for int4, -128 for int8) x the sum of its group's bytes, 16
// at a time, then `chunk` at a time (the group's rest), stored at scratch[i x groups +
// gi] (i32). Every call sums all its rows again (each thread's range of channels): 16
// bytes at a time made a SigLIP encoder's W8A8 linears 1.06x (1 thread) and 1.12x (2
// threads, 4 ranges each) faster than 4 at a time.
void storeOffsetShares(FnBuilder& f, Value xq, Value K, Value mb0, Value mb, Value groups, Value group,
                       int64_t chunk, int32_t factor, Value scratch) {
  mlir::OpBuilder& b = f.b;
  mlir::Location loc = f.loc;
  auto i8 = b.getI8Type();
  const int64_t wide = 16;
  Value zero = f.cI64(0), one = f.cI64(1);
  auto sumBytes = [&](Value rowAt, Value from, Value to, int64_t step, Value init) -> Value {
    auto vc = mlir::VectorType::get({step}, i8);
    auto vci32 = mlir::VectorType::get({step}, f.i32);
    auto sum = b.create<mlir::scf::ForOp>(loc, from, to, f.cI64(step), mlir::ValueRange{f.splatInt(vci32, 0)});
    {
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(sum.getBody());
      Value bytes = loadVector(f, vc, f.gep(xq, i8, f.addi(rowAt, sum.getInductionVar())), Value(), 1);
      b.create<mlir::scf::YieldOp>(
          loc, mlir::ValueRange{f.addi(sum.getRegionIterArgs()[0], b.create<mlir::arith::ExtSIOp>(loc, vci32, bytes))});
    }
    return b.create<mlir::arith::AddIOp>(
        loc, init, b.create<mlir::vector::ReductionOp>(loc, mlir::vector::CombiningKind::ADD, sum.getResult(0)));
  };
  auto divs = [&](Value a, Value c) { return b.create<mlir::arith::DivSIOp>(loc, a, c).getResult(); };
  f.loop(zero, mb, one, [&](Value i) {
    Value rowAt = f.muli(f.addi(mb0, i), K);
    f.loop(zero, groups, one, [&](Value gi) {
      Value k0 = f.muli(gi, group);
      Value kWide = f.addi(k0, f.muli(divs(group, f.cI64(wide)), f.cI64(wide)));
      Value total = sumBytes(rowAt, k0, kWide, wide, b.create<mlir::arith::ConstantIntOp>(loc, 0, 32));
      total = sumBytes(rowAt, kWide, f.addi(k0, group), chunk, total);
      Value scaled = b.create<mlir::arith::MulIOp>(loc, total, b.create<mlir::arith::ConstantIntOp>(loc, factor, 32));
      f.store(scaled, scratch, f.i32, f.addi(f.muli(i, groups), gi));
    });
  });
}

// Lanes [0, n) of a mask of `lanes`, n clamped to [0, lanes].
Value prefixLaneMask(FnBuilder& f, int64_t lanes, Value n) {
  mlir::OpBuilder& b = f.b;
  Value c = b.create<mlir::arith::MaxSIOp>(f.loc, f.cI64(0), b.create<mlir::arith::MinSIOp>(f.loc, n, f.cI64(lanes)));
  return b.create<mlir::vector::CreateMaskOp>(
      f.loc, mlir::VectorType::get({lanes}, b.getI1Type()),
      mlir::ValueRange{b.create<mlir::arith::IndexCastOp>(f.loc, b.getIndexType(), c)});
}

// For the `lanes` output channels from `first`: the lanes a kernel stores (channel in
// [begin, end)).
Value channelStoreMask(FnBuilder& f, int64_t lanes, Value first, Value begin, Value end) {
  mlir::OpBuilder& b = f.b;
  auto sub = [&](Value a, Value c) { return b.create<mlir::arith::SubIOp>(f.loc, a, c).getResult(); };
  Value all = b.create<mlir::arith::ConstantOp>(
      f.loc, mlir::DenseElementsAttr::get(mlir::VectorType::get({lanes}, b.getI1Type()), true));
  return b.create<mlir::arith::AndIOp>(f.loc, prefixLaneMask(f, lanes, sub(end, first)),
                                       b.create<mlir::arith::XOrIOp>(f.loc, prefixLaneMask(f, lanes, sub(begin, first)), all));
}

// The biases of the `lanes` output channels from `first` (a channel past `last`, the
// weight's last, reads the last one's).
Value channelBiases(FnBuilder& f, const MatmulArgs& args, int64_t lanes, Value first, Value last) {
  Value bv = f.splat(mlir::VectorType::get({lanes}, f.f32), 0.0);
  for (int64_t j = 0; j < lanes; ++j)
    bv = f.b.create<mlir::vector::InsertOp>(
        f.loc, args.bias(f, f.b.create<mlir::arith::MinSIOp>(f.loc, f.addi(first, f.cI64(j)), last)), bv, j);
  return bv;
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for int8 per-token activations
// (kiln_uk_matmul_params_t with xq/xs; output channels [begin, end)) and a weight in
// panels of 16 output channels (formats/encoding.h), exactly as the reference sums:
//   int4_p16k8 (symmetric int4): y = s_x * sum over groups of
//              float(sum_group x (c - 8)) * s_group;
//   int8_p16k4: y = float(sum x w) * s_x * s_w.
// Tiles of mr activation rows x `panels` panels: for each step of columns, one load
// of each panel's 64 bytes (int4: their low and high nibbles, the codes of columns
// 8s..8s+3 and 8s+4..8s+7 of each channel; int8: the codes of 4s..4s+3) and per row
// its 4-byte activation words broadcast and dotted with them (Dot4), so that each
// lane accumulates its own channel: no horizontal sums, no repacking. The int4
// codes are c, not c - 8, and on x86 with VNNI the int8 codes are offset by 128 (one
// xor per load: the weight is the unsigned operand; AVX2 multiplies |w| by x with
// w's sign instead); the offset's share, -8 (int4) or -128 (int8) x the activations'
// sum per group or row, is computed once per row into the scratch
// (kiln_uk_matmul_scratch_ref(K) = 16 K floats: the sums of 16 x group rows, the
// rows going in blocks of that many) and starts the integer sums. int4: each
// group's sum is converted and multiplied by the group's 16 scales (one load),
// added in f32 lanes. Outputs outside [begin, end) (a thread split or the weight's
// end cutting a panel) are computed and not stored; the last panel, of fewer than
// 16 rows, reads under masks. Every output is the same sequence of operations
// whatever tile it falls in.
void buildMatmulIntPanels(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, const Target& target,
                          bool isPublic, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  const bool int4 = encoding == format::kEncINT4;
  Dot4 d = dot4(target);
  // PMADDUBSW saturates its pairs of u8 x s8 products in i16: int4 codes (0..15) stay
  // far below; int8 codes offset to u8 would not, so AVX2 multiplies |w| by x with
  // w's sign (VPSIGNB; |w| <= 128, |x| <= 127: pairs within i16), and 512-bit
  // vectors without VNNI (no VPSIGNB) widen the codes.
  const bool signTrick = !int4 && d.kind == Dot4::X86Maddubs && d.lanes == 8;
  if (!int4 && d.kind == Dot4::X86Maddubs && !signTrick)
    d = {Dot4::Generic, d.lanes};
  // int8 codes are signed: offset to unsigned where the dot product wants it (VNNI).
  const bool offsetCodes = !int4 && d.kind == Dot4::X86Vnni;
  const bool sums = int4 || offsetCodes;  // the integer sums start from the offset's share
  const int64_t L = d.lanes, P16 = static_cast<int64_t>(format::kP16K8Rows), V = P16 / L;
  const int64_t stepCols = int4 ? 8 : 4;
  const int64_t pairPanels = L == P16 ? 2 : 1;  // panels per tile when whole
  // Panels per single-row tile (decode): Arm's 4 vectors per panel, two panels side by
  // side, amortise each activation load and the loop over twice the weight. x86 reads
  // one panel at a time: one stream of codes (measured on an AVX-512 host: 1 panel
  // decoded 1.1x faster than 2 side by side, with 2 or 4 streams the prefetcher kept
  // up less).
  const bool arm = d.kind == Dot4::ArmSdot || d.kind == Dot4::ArmSmull;
  const int64_t singlePanels = arm ? 2 : 1;
  // Arm with the int8 matrix multiply (i8mm, beside dotprod): blocks of 8 or more rows
  // as 2x8 by 8x2 products (SMMLA), see mmlaTile.
  const bool mmla = d.kind == Dot4::ArmSdot && (target.features & format::kCpuArmI8mm);
  const int64_t dots = int4 ? 2 : 1;            // unpacked weight vectors per panel vector and step
  // Accumulators (the integer sums, and int4's f32 totals) of mr rows x panels, the
  // unpacked weights of a step and a few temporaries in the register file.
  const int64_t regs = vectorRegisters(target), perRow = (int4 ? 2 : 1) * pairPanels * V;
  const int64_t mr = std::clamp<int64_t>((regs - dots * pairPanels * V - 4) / perRow, 1, 8);
  auto i8 = b.getI8Type(), i16 = b.getI16Type();
  auto vi32 = mlir::VectorType::get({L}, f.i32);
  auto vf32 = mlir::VectorType::get({L}, f.f32);
  auto vbytes = mlir::VectorType::get({4 * L}, i8);

  Value params = fn.getArgument(0), scratch = fn.getArgument(3);
  const MatmulArgs args(f, fn, hasF16Conversion(target));
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value nBegin = args.nBegin, nEnd = args.nEnd;
  Value zero = f.cI64(0), one = f.cI64(1), p16 = f.cI64(P16), four = f.cI64(4);
  auto divs = [&](Value a, Value c) { return b.create<mlir::arith::DivSIOp>(loc, a, c).getResult(); };
  auto sub = [&](Value a, Value c) { return b.create<mlir::arith::SubIOp>(loc, a, c).getResult(); };
  auto minI = [&](Value a, Value c) { return b.create<mlir::arith::MinSIOp>(loc, a, c).getResult(); };
  auto maxI = [&](Value a, Value c) { return b.create<mlir::arith::MaxSIOp>(loc, a, c).getResult(); };
  // int4: groups of `group` columns, f16 scales per (row, group) after the codes.
  // int8: one group of K columns, f32 scales per row after the codes.
  Value runtimeGroup = int4 ? b.create<mlir::arith::ExtUIOp>(
                                  loc, f.i64,
                                  f.field(params, offsetof(kiln_uk_matmul_params_t, w) +
                                                      offsetof(kiln_uk_weight_t, group),
                                          f.i32))
                                  .getResult()
                            : K;
  // SME2: blocks of kSmeMinRows rows or more run buildMatmulIntSme on the whole panels
  // of the range; what is left (the weight's last panel when it has fewer than 16
  // rows) runs below.
  Value smeDone = b.create<mlir::arith::ConstantIntOp>(loc, 0, 1);
  if (arm && (target.features & format::kCpuArmSme2)) {
    const std::string inner = (name + "_sme2").str();
    buildMatmulIntSme(kernels, inner, encoding, loc);
    Value many = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, M, f.cI64(kSmeMinRows));
    // int4 with fewer rows (decode): the SME2 multi-vector dot products.
    const std::string gemv = (name + "_sme2_gemv").str();
    if (int4)
      buildMatmulInt4SmeGemv(kernels, gemv, loc);
    smeDone = int4 ? b.create<mlir::arith::ConstantIntOp>(loc, 1, 1).getResult() : many;
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, many, /*withElse=*/int4);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<mlir::func::CallOp>(loc, inner, mlir::TypeRange{}, mlir::ValueRange{params, nBegin, nEnd, scratch});
    if (int4) {
      b.setInsertionPointToStart(ifOp.elseBlock());
      b.create<mlir::func::CallOp>(loc, gemv, mlir::TypeRange{}, mlir::ValueRange{params, nBegin, nEnd, scratch});
    }
  }
  // The whole computation for a group size (a constant when known: its step loop
  // unrolls).
  auto emit = [&](Value group, std::optional<int64_t> constGroup) {
    // Arm with a constant group of an even number of int4 steps: the steps unrolled,
    // the activations read 16 bytes at a time (see stepSums).
    std::optional<int64_t> laneSteps;
    if (arm && int4 && constGroup && (*constGroup / stepCols) % 2 == 0)
      laneSteps = *constGroup / stepCols;
    Value groups = divs(K, group), stepsPerGroup = divs(group, f.cI64(stepCols));
    Value scales = f.gep(w, i8, int4 ? divs(f.muli(N, K), f.cI64(2)) : f.muli(N, K));
    // Rows per block: their offset shares fill the scratch (16 x group rows), or with
    // SMMLA 16 rows, whose shares, pair-interleaved shares and activations it holds.
    Value blockRows = mmla ? f.cI64(kMmlaBlockRows) : f.muli(f.cI64(16), group);

    auto prefixMask = [&](int64_t lanes, Value n) { return prefixLaneMask(f, lanes, n); };
    auto load = [&](mlir::VectorType t, Value at, Value mask) { return loadVector(f, t, at, mask, 1); };
    // A row's 4 activation bytes from column k, broadcast to every lane.
    auto xWord = [&](Value row, Value k) -> Value {
      Value word = b.create<mlir::LLVM::LoadOp>(loc, f.i32, f.gep(xq, i8, f.addi(f.muli(row, K), k)), 1);
      return b.create<mlir::LLVM::BitcastOp>(loc, vbytes, b.create<mlir::vector::SplatOp>(loc, vi32, word));
    };

    // Rows [r0, r0 + rows) (absolute; the block's first row is mb0) of panels
    // [pn, pn + panels); `whole`: each panel has 16 rows (else the weight's last one,
    // read under masks).
    // For the L channels from `first`: the lanes stored (channel in [begin, end)), and
    // their biases (a channel past the weight's last reads the last one's).
    Value lastN = sub(N, one);
    auto storeMaskAt = [&](Value first) { return channelStoreMask(f, L, first, nBegin, nEnd); };
    auto biasAt = [&](Value first) { return channelBiases(f, args, L, first, lastN); };
    auto tile = [&](Value mb0, Value r0, int64_t rows, Value pn, int64_t panels, bool whole) {
      struct Panel {
        Value n0, height, codes, scaleAt, storeMask[4], bias[4], rowScale[4];
      };
      llvm::SmallVector<Panel> ps(panels);
      for (int64_t p = 0; p < panels; ++p) {
        Panel& q = ps[p];
        q.n0 = f.muli(f.addi(pn, f.cI64(p)), p16);
        q.height = whole ? p16 : sub(N, q.n0);
        q.codes = f.gep(w, i8, divs(f.muli(q.n0, K), f.cI64(int4 ? 2 : 1)));
        q.scaleAt = int4 ? f.gep(scales, i16, f.muli(q.n0, groups)) : f.gep(scales, f.f32, q.n0);
        for (int64_t v = 0; v < V; ++v) {
          Value first = f.addi(q.n0, f.cI64(v * L));
          q.storeMask[v] = storeMaskAt(first);
          q.bias[v] = biasAt(first);
          if (!int4)
            q.rowScale[v] = load(vf32, f.gep(q.scaleAt, f.f32, f.cI64(v * L)),
                                 whole ? Value() : prefixMask(L, sub(q.height, f.cI64(v * L))));
        }
      }
      const int64_t count = rows * panels * V;
      // The integer sums over steps [s0, s0 + stepsPerGroup) from `init`. A single row
      // (decode) streams the weight (each panel's codes prefetched decodePrefetchBytes
      // ahead),
      // and with fewer than 8 vectors of sums in flight (x86) a separate chain of sums
      // per unpacked vector (added at the end), so that the dot products' latency hides.
      const bool split = rows == 1 && dots > 1 && panels * V < 8;
      const int64_t chains = split ? dots : 1;
      // x86 without VNNI, int4 in groups of at most 32 columns: PMADDUBSW's pairs
      // (c x a + c' x a', |.| <= 2 x 15 x 128 = 3840) are summed in i16 over the group
      // (at most 8 per element: |sum| <= 30720, exact) and widened by one PMADDWD per
      // group, not one per step: the multiply port, the bottleneck (one on Zen 1 and
      // Haswell), does 9 multiplies where it did 16. The integer sums are the same.
      const bool i16Sums = int4 && d.kind == Dot4::X86Maddubs && constGroup && *constGroup <= 32;
      auto vi16 = mlir::VectorType::get({2 * L}, i16);
      auto accStep = [&](Value acc, Value wv, Value xv) -> Value {
        if (!i16Sums)
          return dot4Step(f, d, acc, wv, xv);
        Value pairs = b.create<mlir::LLVM::CallIntrinsicOp>(loc, vi16, b.getStringAttr(d.pairs), mlir::ValueRange{wv, xv})
                          .getResult(0);
        return f.addi(acc, pairs);
      };
      auto stepSums = [&](Value s0, llvm::ArrayRef<Value> start) {
        llvm::SmallVector<Value> init;
        for (int64_t c = 0; c < chains; ++c)
          for (Value v : start)
            init.push_back(i16Sums ? f.splatInt(vi16, 0) : c == 0 ? v : f.splatInt(vi32, 0));
        // One step s from the sums `accs`; xOf(i, t) is row i's activation word t of
        // the step, broadcast.
        auto step = [&](Value s, llvm::ArrayRef<Value> accs, llvm::function_ref<Value(int64_t, int64_t)> xOf) {
          llvm::SmallVector<Value> ws;     // [panel x vector][dots]
          llvm::SmallVector<Value> signs;  // signTrick: the codes whose signs x takes
          for (int64_t p = 0; p < panels; ++p)
            for (int64_t v = 0; v < V; ++v) {
              Value stride = f.muli(four, ps[p].height);
              Value at = f.gep(ps[p].codes, i8, f.addi(f.muli(s, stride), f.cI64(v * 4 * L)));
              if (rows == 1 && v == 0 && decodePrefetchBytes(target) > 0)
                b.create<mlir::LLVM::Prefetch>(loc, f.gep(at, i8, f.cI64(decodePrefetchBytes(target))), 0, 3, 1);
              Value raw = load(vbytes, at, whole ? Value() : prefixMask(4 * L, sub(stride, f.cI64(v * 4 * L))));
              if (int4) {
                ws.push_back(b.create<mlir::arith::AndIOp>(loc, raw, f.splatInt(vbytes, 0x0F)));
                ws.push_back(b.create<mlir::arith::ShRUIOp>(loc, raw, f.splatInt(vbytes, 4)));
              } else if (signTrick) {
                ws.push_back(b.create<mlir::math::AbsIOp>(loc, raw));
                signs.push_back(raw);
              } else {
                ws.push_back(offsetCodes ? b.create<mlir::arith::XOrIOp>(loc, raw, f.splatInt(vbytes, -128)).getResult()
                                         : raw);
              }
            }
          llvm::SmallVector<Value> out;
          for (int64_t i = 0; i < rows; ++i) {
            llvm::SmallVector<Value> xw;
            for (int64_t t = 0; t < dots; ++t)
              xw.push_back(xOf(i, t));
            for (int64_t c = 0; c < panels * V; ++c) {
              if (split) {
                for (int64_t t = 0; t < dots; ++t)
                  out.push_back(accStep(accs[t * count + c], ws[c * dots + t], xw[t]));
                continue;
              }
              Value acc = accs[i * panels * V + c];
              for (int64_t t = 0; t < dots; ++t) {
                Value x = xw[t];
                if (signTrick)
                  x = b.create<mlir::LLVM::CallIntrinsicOp>(loc, vbytes, b.getStringAttr("llvm.x86.avx2.psign.b"),
                                                            mlir::ValueRange{x, signs[c]})
                          .getResult(0);
                acc = accStep(acc, ws[c * dots + t], x);
              }
              out.push_back(acc);
            }
          }
          if (split) {  // chain-major order
            llvm::SmallVector<Value> byChain(out.size());
            for (int64_t c = 0; c < count; ++c)
              for (int64_t t = 0; t < dots; ++t)
                byChain[t * count + c] = out[c * dots + t];
            out = byChain;
          }
          return out;
        };
        auto broadcastWord = [&](Value s) {
          return [&, s](int64_t i, int64_t t) {
            return xWord(f.addi(r0, f.cI64(i)), f.addi(f.muli(s, f.cI64(stepCols)), f.cI64(4 * t)));
          };
        };
        llvm::SmallVector<Value> results;
        if (laneSteps) {
          // The group's steps unrolled (Arm SDOT): per pair of steps one 16-byte load
          // of each row's activations, its 4-byte words taken by lane (the indexed
          // SDOT), instead of a broadcast load per word.
          results = init;
          auto v4 = mlir::VectorType::get({4}, f.i32);
          for (int64_t s2 = 0; s2 < *laneSteps; s2 += 2) {
            Value s = f.addi(s0, f.cI64(s2));
            llvm::SmallVector<Value> xv;
            for (int64_t i = 0; i < rows; ++i) {
              Value at = f.gep(xq, i8, f.addi(f.muli(f.addi(r0, f.cI64(i)), K), f.muli(s, f.cI64(stepCols))));
              xv.push_back(b.create<mlir::LLVM::BitcastOp>(loc, v4, load(mlir::VectorType::get({16}, i8), at, Value())));
            }
            for (int64_t u = 0; u < 2; ++u)
              results = step(f.addi(s, f.cI64(u)), results, [&](int64_t i, int64_t t) -> Value {
                const int64_t lane = (stepCols / 4) * u + t;
                Value dup = b.create<mlir::vector::ShuffleOp>(loc, xv[i], xv[i], llvm::ArrayRef<int64_t>{lane, lane, lane, lane});
                return b.create<mlir::LLVM::BitcastOp>(loc, vbytes, dup);
              });
          }
        } else {
          auto stepLoop = b.create<mlir::scf::ForOp>(loc, s0, f.addi(s0, stepsPerGroup), one, init);
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(stepLoop.getBody());
          Value s = stepLoop.getInductionVar();
          llvm::SmallVector<Value> accs(stepLoop.getRegionIterArgs().begin(), stepLoop.getRegionIterArgs().end());
          b.create<mlir::scf::YieldOp>(loc, step(s, accs, broadcastWord(s)));
          results.assign(stepLoop.getResults().begin(), stepLoop.getResults().end());
        }
        llvm::SmallVector<Value> total(results.begin(), results.begin() + count);
        for (int64_t t = 1; t < chains; ++t)
          for (int64_t c = 0; c < count; ++c)
            total[c] = f.addi(total[c], results[t * count + c]);
        if (i16Sums)
          for (int64_t c = 0; c < count; ++c) {
            Value wide = b.create<mlir::LLVM::CallIntrinsicOp>(loc, vi32, b.getStringAttr(d.quads),
                                                               mlir::ValueRange{total[c], f.splatInt(vi16, 1)})
                             .getResult(0);
            total[c] = f.addi(start[c], wide);
          }
        return total;
      };
      // The integer sums' start of group gi: the offset's share per row, or 0.
      auto startOf = [&](Value gi) {
        llvm::SmallVector<Value> init;
        for (int64_t i = 0; i < rows; ++i) {
          Value s = sums ? f.load(f.i32, scratch, f.i32, f.addi(f.muli(sub(f.addi(r0, f.cI64(i)), mb0), groups), gi))
                         : b.create<mlir::arith::ConstantIntOp>(loc, 0, 32).getResult();
          for (int64_t c = 0; c < panels * V; ++c)
            init.push_back(b.create<mlir::vector::SplatOp>(loc, vi32, s));
        }
        return init;
      };
      llvm::SmallVector<Value> totals;
      if (int4) {
        auto groupLoop =
            b.create<mlir::scf::ForOp>(loc, zero, groups, one, llvm::SmallVector<Value>(count, f.splat(vf32, 0.0)));
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(groupLoop.getBody());
        Value gi = groupLoop.getInductionVar();
        llvm::SmallVector<Value> isums = stepSums(f.muli(gi, stepsPerGroup), startOf(gi));
        llvm::SmallVector<Value> sv;
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t v = 0; v < V; ++v) {
            Value at = f.gep(ps[p].scaleAt, i16, f.addi(f.muli(gi, ps[p].height), f.cI64(v * L)));
            Value h = load(mlir::VectorType::get({L}, i16), at,
                           whole ? Value() : prefixMask(L, sub(ps[p].height, f.cI64(v * L))));
            Value half = b.create<mlir::arith::BitcastOp>(loc, mlir::VectorType::get({L}, b.getF16Type()), h);
            sv.push_back(b.create<mlir::arith::ExtFOp>(loc, vf32, half));
          }
        llvm::SmallVector<Value> next;
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t c = 0; c < panels * V; ++c) {
            Value sum = b.create<mlir::arith::SIToFPOp>(loc, vf32, isums[i * panels * V + c]);
            next.push_back(fmaContract(f, sum, sv[c], groupLoop.getRegionIterArgs()[i * panels * V + c]));
          }
        b.create<mlir::scf::YieldOp>(loc, next);
        totals.assign(groupLoop.getResults().begin(), groupLoop.getResults().end());
      } else {
        for (Value sum : stepSums(zero, startOf(zero)))
          totals.push_back(b.create<mlir::arith::SIToFPOp>(loc, vf32, sum));
      }
      for (int64_t i = 0; i < rows; ++i) {
        Value row = f.addi(r0, f.cI64(i));
        Value sx = b.create<mlir::vector::SplatOp>(loc, vf32, f.load(f.f32, xsc, f.f32, row));
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t v = 0; v < V; ++v) {
            Value val = f.mul(totals[(i * panels + p) * V + v], sx);
            if (!int4)
              val = f.mul(val, ps[p].rowScale[v]);
            val = f.add(val, ps[p].bias[v]);
            Value at = f.gep(y, f.f32, f.addi(f.muli(row, ldy), f.addi(ps[p].n0, f.cI64(v * L))));
            b.create<mlir::LLVM::MaskedStoreOp>(loc, val, at, ps[p].storeMask[v], 4);
          }
      }
    };

    // SMMLA (i8mm) tiles: 8 rows (4 pairs) x a quarter panel (4 channels, 2 pairs)
    // from the block's pair-interleaved scratch: per (step of 8 columns, row pair) its
    // 16 activation bytes [row 2p: 8 | row 2p+1: 8] (A), and per (group, row pair) the
    // offset shares [o, o, o', o'] (int4), the pairs of a step or group side by side. A
    // step's weight operands (B) are the quarter's 4 channels' codes as pairs
    // [n: 8 | n+1: 8]: int4 one 16-byte load, its
    // low and high nibbles zipped by 32-bit words; int8 the loads of two steps of 4
    // columns zipped. Each SMMLA adds a 2x2 block (rows x channels) of sums; per group
    // they are converted and multiply-added with the channels' scales exactly as in
    // `tile`, so an output is the same whichever path computes it.
    // int8 tiles of a whole block, 16 rows (8 pairs), read each step's weight operands
    // for twice the products, and its 8 pairs' activations in two 4-register loads
    // (LD1 x4): 0.070 -> 0.054 instructions per MAC (bench/arm_cost.py, M = 128). int4
    // keeps 8 rows and single loads: 16 rows' integer sums and float totals (32
    // vectors) spill, and a 4-register load's consecutive registers made the register
    // allocator spill the 8-row tile too (0.094 -> 0.10-0.17).
    Value mmlaPairShares = f.gep(scratch, f.i32, f.muli(f.cI64(kMmlaBlockRows), groups));
    Value mmlaActs = f.gep(mmlaPairShares, f.i32, f.muli(f.cI64(kMmlaBlockRows / 2 * 4), groups));
    Value kSteps8 = divs(K, f.cI64(8));
    auto v4i32 = mlir::VectorType::get({4}, f.i32);
    auto zip32 = [&](Value a, Value c, bool high) -> Value {
      Value x = b.create<mlir::LLVM::BitcastOp>(loc, v4i32, a), z = b.create<mlir::LLVM::BitcastOp>(loc, v4i32, c);
      llvm::SmallVector<int64_t> pick = high ? llvm::SmallVector<int64_t>{2, 6, 3, 7} : llvm::SmallVector<int64_t>{0, 4, 1, 5};
      return b.create<mlir::LLVM::BitcastOp>(loc, vbytes, b.create<mlir::vector::ShuffleOp>(loc, x, z, pick));
    };
    auto ld1x4 = [&](mlir::VectorType t, Value at) {
      return partsOf4(f, b.create<mlir::LLVM::CallIntrinsicOp>(loc, structOf4(b.getContext(), t),
                                                                 b.getStringAttr("llvm.aarch64.neon.ld1x4"), mlir::ValueRange{at})
                             .getResult(0));
    };
    auto mmlaTile = [&](Value mb0, Value m0, Value pn, Value q, int64_t kPairs) {
      Value n0 = f.muli(pn, p16);
      Value c0 = f.addi(n0, f.muli(q, four));  // the quarter's first channel
      Value codes = f.gep(w, i8, f.addi(divs(f.muli(n0, K), f.cI64(int4 ? 2 : 1)), f.muli(q, f.cI64(16))));
      Value storeMask = storeMaskAt(c0), bias = biasAt(c0);  // L = 4 channels on Arm
      Value pair0 = divs(m0, f.cI64(2));
      // The sums of steps [s0, s1) (of 8 columns) added to acc[pair x 2 + channel pair].
      auto steps = [&](Value s0, int64_t count, llvm::ArrayRef<Value> accIn) {
        llvm::SmallVector<Value> acc(accIn.begin(), accIn.end());
        for (int64_t u = 0; u < count; ++u) {
          Value s = f.addi(s0, f.cI64(u));
          Value b0, b1;
          if (int4) {
            Value raw = load(vbytes, f.gep(codes, i8, f.muli(s, f.cI64(64))), Value());
            Value lo = b.create<mlir::arith::AndIOp>(loc, raw, f.splatInt(vbytes, 0x0F));
            Value hi = b.create<mlir::arith::ShRUIOp>(loc, raw, f.splatInt(vbytes, 4));
            b0 = zip32(lo, hi, false);
            b1 = zip32(lo, hi, true);
          } else {
            Value r0 = load(vbytes, f.gep(codes, i8, f.muli(s, f.cI64(128))), Value());
            Value r1 = load(vbytes, f.gep(codes, i8, f.addi(f.muli(s, f.cI64(128)), f.cI64(64))), Value());
            b0 = zip32(r0, r1, false);
            b1 = zip32(r0, r1, true);
          }
          auto actsAt = [&](int64_t p) {
            return f.gep(mmlaActs, i8, f.muli(f.addi(f.muli(s, f.cI64(kPairsPerBlock)), f.addi(pair0, f.cI64(p))), f.cI64(16)));
          };
          llvm::SmallVector<Value> as;
          for (int64_t p = 0; p < kPairs; p += int4 ? 1 : 4)
            if (int4)
              as.push_back(load(vbytes, actsAt(p), Value()));
            else
              for (Value a : ld1x4(vbytes, actsAt(p)))
                as.push_back(a);
          for (int64_t p = 0; p < kPairs; ++p) {
            Value a = as[p];
            for (int64_t j = 0; j < 2; ++j)
              acc[p * 2 + j] = b.create<mlir::LLVM::CallIntrinsicOp>(
                                    loc, v4i32, b.getStringAttr("llvm.aarch64.neon.smmla"),
                                    mlir::ValueRange{acc[p * 2 + j], a, j ? b1 : b0})
                                   .getResult(0);
          }
        }
        return acc;
      };
      // The same as a loop over steps [s0, s1), one step per iteration.
      auto stepLoop = [&](Value s0, Value s1, llvm::ArrayRef<Value> accIn) {
        auto loop = b.create<mlir::scf::ForOp>(loc, s0, s1, one, accIn);
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(loop.getBody());
        llvm::SmallVector<Value> in(loop.getRegionIterArgs().begin(), loop.getRegionIterArgs().end());
        b.create<mlir::scf::YieldOp>(loc, steps(loop.getInductionVar(), 1, in));
        return llvm::SmallVector<Value>(loop.getResults().begin(), loop.getResults().end());
      };
      llvm::SmallVector<Value> totals;
      if (int4) {
        Value steps8 = divs(group, f.cI64(8));
        auto groupLoop = b.create<mlir::scf::ForOp>(loc, zero, groups, one,
                                                    llvm::SmallVector<Value>(2 * kPairs, f.splat(vf32, 0.0)));
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(groupLoop.getBody());
        Value gi = groupLoop.getInductionVar();
        llvm::SmallVector<Value> acc;
        for (int64_t p = 0; p < kPairs; ++p) {
          Value share = load(v4i32, f.gep(mmlaPairShares, f.i32,
                                          f.muli(f.addi(f.muli(gi, f.cI64(kPairsPerBlock)), f.addi(pair0, f.cI64(p))), four)),
                             Value());
          acc.push_back(share);
          acc.push_back(share);
        }
        Value s0 = f.muli(gi, steps8);
        acc = constGroup ? steps(s0, *constGroup / 8, acc) : stepLoop(s0, f.addi(s0, steps8), acc);
        Value scaleAt = f.gep(scales, i16, f.addi(f.muli(n0, groups), f.addi(f.muli(gi, p16), f.muli(q, four))));
        llvm::SmallVector<Value> next;
        Value sv[2];
        for (int64_t j = 0; j < 2; ++j) {
          Value word = b.create<mlir::LLVM::LoadOp>(loc, f.i32, f.gep(scaleAt, i16, f.cI64(2 * j)), 2);
          Value dup = b.create<mlir::vector::SplatOp>(loc, mlir::VectorType::get({2}, f.i32), word);
          Value half = b.create<mlir::LLVM::BitcastOp>(loc, mlir::VectorType::get({4}, b.getF16Type()), dup);
          sv[j] = b.create<mlir::arith::ExtFOp>(loc, vf32, half);
        }
        for (int64_t c = 0; c < 2 * kPairs; ++c)
          next.push_back(fmaContract(f, b.create<mlir::arith::SIToFPOp>(loc, vf32, acc[c]), sv[c % 2],
                                     groupLoop.getRegionIterArgs()[c]));
        b.create<mlir::scf::YieldOp>(loc, next);
        totals.assign(groupLoop.getResults().begin(), groupLoop.getResults().end());
      } else {
        for (Value v : stepLoop(zero, kSteps8, llvm::SmallVector<Value>(2 * kPairs, f.splatInt(v4i32, 0))))
          totals.push_back(b.create<mlir::arith::SIToFPOp>(loc, vf32, v));
      }
      Value rowScale = int4 ? Value() : load(vf32, f.gep(scales, f.f32, c0), Value());
      for (int64_t p = 0; p < kPairs; ++p)
        for (int64_t h = 0; h < 2; ++h) {
          // Row 2p + h's 4 channels: lanes 2h, 2h + 1 of both channel pairs.
          Value val = b.create<mlir::vector::ShuffleOp>(loc, totals[2 * p], totals[2 * p + 1],
                                                        llvm::ArrayRef<int64_t>{2 * h, 2 * h + 1, 2 * h + 4, 2 * h + 5});
          Value row = f.addi(f.addi(mb0, m0), f.cI64(2 * p + h));
          val = f.mul(val, b.create<mlir::vector::SplatOp>(loc, vf32, f.load(f.f32, xsc, f.f32, row)));
          if (!int4)
            val = f.mul(val, rowScale);
          val = f.add(val, bias);
          Value at = f.gep(y, f.f32, f.addi(f.muli(row, ldy), c0));
          b.create<mlir::LLVM::MaskedStoreOp>(loc, val, at, storeMask, 4);
        }
    };
    // The block's pair-interleaved scratch for its first mI rows (a multiple of 8).
    auto mmlaPrepare = [&](Value mb0, Value mI) {
      auto vi64x2 = mlir::VectorType::get({2}, f.i64);
      f.loop(zero, divs(mI, f.cI64(2)), one, [&](Value p) {
        Value r0 = f.addi(mb0, f.muli(p, f.cI64(2)));
        f.loop(zero, kSteps8, one, [&](Value s) {
          Value k = f.muli(s, f.cI64(8));
          Value a = b.create<mlir::LLVM::LoadOp>(loc, f.i64, f.gep(xq, i8, f.addi(f.muli(r0, K), k)), 1);
          Value c = b.create<mlir::LLVM::LoadOp>(loc, f.i64, f.gep(xq, i8, f.addi(f.muli(f.addi(r0, one), K), k)), 1);
          Value v = b.create<mlir::vector::InsertOp>(loc, a, f.splatInt(vi64x2, 0), 0);
          v = b.create<mlir::vector::InsertOp>(loc, c, v, 1);
          b.create<mlir::LLVM::StoreOp>(loc, v, f.gep(mmlaActs, i8, f.muli(f.addi(f.muli(s, f.cI64(kPairsPerBlock)), p), f.cI64(16))), 1);
        });
        if (int4)
          f.loop(zero, groups, one, [&](Value gi) {
            Value rel = sub(r0, mb0);
            Value o0 = f.load(f.i32, scratch, f.i32, f.addi(f.muli(rel, groups), gi));
            Value o1 = f.load(f.i32, scratch, f.i32, f.addi(f.muli(f.addi(rel, one), groups), gi));
            Value v = f.splatInt(v4i32, 0);
            for (int64_t l = 0; l < 4; ++l)
              v = b.create<mlir::vector::InsertOp>(loc, l < 2 ? o0 : o1, v, l);
            Value at = f.gep(mmlaPairShares, f.i32, f.muli(f.addi(f.muli(gi, f.cI64(kPairsPerBlock)), p), four));
            b.create<mlir::LLVM::StoreOp>(loc, v, at, 4);
          });
      });
    };

    // Panels [pFirst, pEnd) overlap the range; those below wholeEnd have 16 rows
    // (after SME2, none are left but the last if it has fewer).
    Value pBegin = divs(nBegin, p16);
    Value pEnd = divs(f.addi(nEnd, f.cI64(P16 - 1)), p16);
    Value wholeEnd = maxI(pBegin, minI(pEnd, divs(N, p16)));
    Value pFirst = b.create<mlir::arith::SelectOp>(loc, smeDone, wholeEnd, pBegin);
    Value anyLeft = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::slt, pFirst, pEnd);
    f.loop(zero, b.create<mlir::arith::SelectOp>(loc, anyLeft, M, zero), blockRows, [&](Value mb0) {
      Value mb = minI(blockRows, sub(M, mb0));
      if (sums) {
        // The offset's share of each (row, group): -8 (int4) or -128 (int8) x the sum
        // of its activations, then 8 (int4) or 4 (int8: K may end in 4) at a time.
        storeOffsetShares(f, xq, K, mb0, mb, groups, group, int4 ? 8 : 4, int4 ? -8 : -128, scratch);
      }
      // The block's panels in groups of `group` side by side (whole ones), then one at a
      // time (the whole ones left, the last one under masks).
      auto overPanels = [&](int64_t group, llvm::function_ref<void(Value, int64_t, bool)> body) {
        Value groupEnd = roundDownFrom(f, wholeEnd, pFirst, f.cI64(group));
        f.loop(pFirst, groupEnd, f.cI64(group), [&](Value pn) { body(pn, group, true); });
        if (group > 1)
          f.loop(groupEnd, wholeEnd, one, [&](Value pn) { body(pn, 1, true); });
        f.loop(wholeEnd, pEnd, one, [&](Value pn) { body(pn, 1, false); });
      };
      mlir::OpBuilder::InsertionGuard g(b);
      if (mmla) {
        // A block of 8 or more rows (and K a multiple of 8): its first mI rows in SMMLA
        // tiles against the whole panels, the rest row by row; else as without i8mm.
        Value mI = f.muli(divs(mb, f.cI64(8)), f.cI64(8));
        Value use = b.create<mlir::arith::AndIOp>(
            loc, b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sgt, mI, zero),
            b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq,
                                          b.create<mlir::arith::RemSIOp>(loc, K, f.cI64(8)), zero));
        auto useIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, use, true);
        b.setInsertionPointToStart(useIf.thenBlock());
        mmlaPrepare(mb0, mI);
        overPanels(1, [&](Value pn, int64_t, bool whole) {
          if (whole && !int4) {
            // A whole block in 16-row tiles, else 8 rows at a time.
            Value wide = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, mI, f.cI64(kMmlaBlockRows));
            auto wideIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, wide, true);
            mlir::OpBuilder::InsertionGuard g(b);
            b.setInsertionPointToStart(wideIf.thenBlock());
            f.loop(zero, four, one, [&](Value q) { mmlaTile(mb0, zero, pn, q, kPairsPerBlock); });
            b.setInsertionPointToStart(wideIf.elseBlock());
            f.loop(zero, four, one, [&](Value q) { mmlaTile(mb0, zero, pn, q, 4); });
          } else if (whole) {
            f.loop(zero, four, one, [&](Value q) {
              f.loop(zero, mI, f.cI64(8), [&](Value m0) { mmlaTile(mb0, m0, pn, q, 4); });
            });
          }
          f.loop(whole ? mI : zero, mb, one, [&](Value m0) { tile(mb0, f.addi(mb0, m0), 1, pn, 1, whole); });
        });
        b.setInsertionPointToStart(useIf.elseBlock());
      }
      // mr rows at a time, the rows left over in one more tile of mr ending at the
      // block's last row (its first rows computed again, the same values); a block of
      // fewer than mr rows row by row, against singlePanels panels at a time.
      Value full = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, mb, f.cI64(mr));
      auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, full, true);
      b.setInsertionPointToStart(ifOp.thenBlock());
      Value mMain = roundDownFrom(f, mb, zero, f.cI64(mr));
      overPanels(pairPanels, [&](Value pn, int64_t panels, bool whole) {
        f.loop(zero, mMain, f.cI64(mr), [&](Value m0) { tile(mb0, f.addi(mb0, m0), mr, pn, panels, whole); });
        f.loop(mMain, mb, f.cI64(mr), [&](Value) { tile(mb0, f.addi(mb0, sub(mb, f.cI64(mr))), mr, pn, panels, whole); });
      });
      b.setInsertionPointToStart(ifOp.elseBlock());
      overPanels(singlePanels, [&](Value pn, int64_t panels, bool whole) {
        f.loop(zero, mb, one, [&](Value m0) { tile(mb0, f.addi(mb0, m0), 1, pn, panels, whole); });
      });
    });
  };
  if (int4) {
    // Group 32 (the common one) with the group a constant, any other at run time.
    Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, runtimeGroup, f.cI64(32));
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
    b.setInsertionPointToStart(ifOp.thenBlock());
    emit(f.cI64(32), 32);
    b.setInsertionPointToStart(ifOp.elseBlock());
    emit(runtimeGroup, std::nullopt);
  } else {
    emit(runtimeGroup, std::nullopt);
  }
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) for int8 per-token activations and an
// int4_p16k16 weight (formats/encoding.h; Arm with i8mm), the same operations as
// buildMatmulIntPanels: y = s_x * sum over groups of float(sum_group x (c - 8)) *
// s_group. Rows go in blocks of 16. A block's rows are paired in the scratch: per step
// of 8 columns and pair, [row 2p: 8 bytes | row 2p + 1: 8 bytes] (an odd last row
// paired with itself), and per (group, pair) the offset shares [o, o, o', o'] (-8 x the
// activations' group sum) that start the integer sums. A channel pair's 16 bytes of a
// step of 16 columns, masked and shifted, are SMMLA's weight operands of two steps of
// 8: each SMMLA adds a 2x2 block (rows x channels) of sums, and no operand is zipped.
//  - 8 rows (4 pairs) x a quarter panel (4 channels, 2 pairs) per tile while 8 rows
//    are left: a step's two weight operands serve 4 pairs of rows; per group the sums
//    are converted and multiply-added with the channels' scales loaded as [s0 s1 s0 s1].
//  - the rows left (decode's single row) a pair at a time against a whole panel (8
//    channel pairs): per group each quarter's two sums give its 4 channels of the
//    pair's first row (and of the second, unless the row is alone), multiplied by the
//    quarter's 4 scales.
// Every output is the same sequence of operations whatever tile computes it; outputs
// outside [begin, end) are computed and not stored.
void buildMatmulInt4Pairs(mlir::ModuleOp kernels, llvm::StringRef name, const Target& target, bool isPublic,
                          mlir::Location loc) {
  constexpr int64_t kBlock = 24, kPairs = kBlock / 2;  // rows per block, and their pairs
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  auto i8 = b.getI8Type(), i16 = b.getI16Type();
  auto v4i32 = mlir::VectorType::get({4}, f.i32);
  auto vf32 = mlir::VectorType::get({4}, f.f32);
  auto vbytes = mlir::VectorType::get({16}, i8);
  Value params = fn.getArgument(0), scratch = fn.getArgument(3);
  const MatmulArgs args(f, fn, hasF16Conversion(target));
  Value xq = args.xq, xsc = args.xs, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value nBegin = args.nBegin, nEnd = args.nEnd;
  Value zero = f.cI64(0), one = f.cI64(1), two = f.cI64(2), p16 = f.cI64(16);
  auto divs = [&](Value a, Value c) { return b.create<mlir::arith::DivSIOp>(loc, a, c).getResult(); };
  auto sub = [&](Value a, Value c) { return b.create<mlir::arith::SubIOp>(loc, a, c).getResult(); };
  auto minI = [&](Value a, Value c) { return b.create<mlir::arith::MinSIOp>(loc, a, c).getResult(); };
  auto load = [&](mlir::VectorType t, Value at) { return loadVector(f, t, at, Value(), 1); };
  auto smmla = [&](Value acc, Value a, Value wv) {
    return b.create<mlir::LLVM::CallIntrinsicOp>(loc, v4i32, b.getStringAttr("llvm.aarch64.neon.smmla"),
                                                 mlir::ValueRange{acc, a, wv})
        .getResult(0);
  };
  auto shuffle = [&](Value a, Value c, llvm::ArrayRef<int64_t> pick) {
    return b.create<mlir::vector::ShuffleOp>(loc, a, c, pick).getResult();
  };
  Value runtimeGroup = b.create<mlir::arith::ExtUIOp>(
      loc, f.i64, f.field(params, offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group), f.i32));
  // For the 4 channels from `first`: the lanes stored (channel in [begin, end)) and
  // their biases (whole panels: every channel is the weight's).
  Value lastN = sub(N, one);
  auto storeMaskAt = [&](Value first) { return channelStoreMask(f, 4, first, nBegin, nEnd); };
  auto biasAt = [&](Value first) { return channelBiases(f, args, 4, first, lastN); };
  auto storeRow = [&](Value total, Value row, Value c0, Value bias, Value mask) {
    Value val = f.mul(total, b.create<mlir::vector::SplatOp>(loc, vf32, f.load(f.f32, xsc, f.f32, row)));
    val = f.add(val, bias);
    b.create<mlir::LLVM::MaskedStoreOp>(loc, val, f.gep(y, f.f32, f.addi(f.muli(row, ldy), c0)), mask, 4);
  };

  auto emit = [&](Value group, std::optional<int64_t> constGroup) {
    Value groups = divs(K, group), per16 = divs(group, p16);
    Value scales = f.gep(w, i8, divs(f.muli(N, K), two));
    // Scratch: the shares of the block's rows [block rows x groups] (i32), the pairs'
    // shares [groups x pairs] ([o, o, o', o'] twice, one per channel pair of a quarter,
    // or in a block of fewer than 8 rows 8 times, one per sum of a pair tile: each sum
    // starts from its own load, not a vector move), the pairs' activations
    // (16 bytes each), for each step of 16 columns: its first 8 columns' pairs, then its
    // last 8's (the tiles of rows load consecutive pairs of a step with LDP); or, in a
    // block of fewer than 8 rows (decode), each pair's two halves side by side (the pair
    // tile loads both with one LDP).
    Value pairShares = f.gep(scratch, f.i32, f.muli(f.cI64(kBlock), groups));
    Value acts = f.gep(pairShares, f.i32, f.muli(f.cI64(std::max<int64_t>(8 * kPairs, 32 * 4)), groups));
    auto actAt = [&](Value t, int64_t h, Value p, bool pairMajor) {
      Value at = pairMajor ? f.addi(f.muli(p, f.cI64(32)), f.cI64(16 * h))
                           : f.addi(f.muli(p, p16), f.cI64(16 * kPairs * h));
      return f.gep(acts, i8, f.addi(f.muli(t, f.cI64(32 * kPairs)), at));
    };
    // Copy j of pair p's shares in group gi; `small`: a block of fewer than 8 rows (at
    // most 4 pairs), whose shares are stored 8 times, one per sum of a pair tile (their
    // loads, not moves, start the sums).
    auto shareIndex = [&](Value gi, Value p, Value small) -> Value {
      return b.create<mlir::arith::SelectOp>(loc, small, f.muli(f.addi(f.muli(gi, f.cI64(4)), p), f.cI64(32)),
                                             f.muli(f.addi(f.muli(gi, f.cI64(kPairs)), p), f.cI64(8)));
    };
    auto shareOf = [&](Value gi, Value p, int64_t j, bool small) {
      Value at = small ? f.muli(f.addi(f.muli(gi, f.cI64(4)), p), f.cI64(32))
                       : f.muli(f.addi(f.muli(gi, f.cI64(kPairs)), p), f.cI64(8));
      return load(v4i32, f.gep(pairShares, f.i32, f.addi(at, f.cI64(4 * j))));
    };
    // A group's loop: totals (f32) carried over the groups; body(gi, totals) returns
    // the next totals.
    auto overGroups = [&](int64_t count, llvm::function_ref<llvm::SmallVector<Value>(Value, llvm::ArrayRef<Value>)> body) {
      auto loop = b.create<mlir::scf::ForOp>(loc, zero, groups, one, llvm::SmallVector<Value>(count, f.splat(vf32, 0.0)));
      {
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(loop.getBody());
        llvm::SmallVector<Value> in(loop.getRegionIterArgs().begin(), loop.getRegionIterArgs().end());
        b.create<mlir::scf::YieldOp>(loc, body(loop.getInductionVar(), in));
      }
      return llvm::SmallVector<Value>(loop.getResults().begin(), loop.getResults().end());
    };
    // The group's steps of 16 columns: step(t, acc) -> acc, unrolled for a constant group.
    auto overSteps = [&](Value gi, llvm::SmallVector<Value> acc,
                         llvm::function_ref<void(Value, llvm::SmallVector<Value>&)> step) {
      Value t0 = f.muli(gi, per16);
      if (constGroup) {
        for (int64_t u = 0; u < *constGroup / 16; ++u)
          step(f.addi(t0, f.cI64(u)), acc);
        return acc;
      }
      auto loop = b.create<mlir::scf::ForOp>(loc, t0, f.addi(t0, per16), one, acc);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(loop.getBody());
      llvm::SmallVector<Value> in(loop.getRegionIterArgs().begin(), loop.getRegionIterArgs().end());
      step(loop.getInductionVar(), in);
      b.create<mlir::scf::YieldOp>(loc, in);
      return llvm::SmallVector<Value>(loop.getResults().begin(), loop.getResults().end());
    };
    auto nibbles = [&](Value raw, bool high) -> Value {
      return high ? b.create<mlir::arith::ShRUIOp>(loc, raw, f.splatInt(vbytes, 4)).getResult()
                  : b.create<mlir::arith::AndIOp>(loc, raw, f.splatInt(vbytes, 0x0F)).getResult();
    };

    // 2 tilePairs rows from the block's row m0 x the 4 channels of quarter q of panel pn.
    auto quarterTile = [&](Value mb0, Value m0, Value pn, Value q, int64_t tilePairs) {
      Value n0 = f.muli(pn, p16), c0 = f.addi(n0, f.muli(q, f.cI64(4)));
      Value codes = f.gep(w, i8, f.addi(divs(f.muli(n0, K), two), f.muli(q, f.cI64(32))));
      Value pair0 = divs(m0, two);
      Value storeMask = storeMaskAt(c0), bias = biasAt(c0);
      llvm::SmallVector<Value> totals = overGroups(2 * tilePairs, [&](Value gi, llvm::ArrayRef<Value> in) {
        llvm::SmallVector<Value> acc;
        for (int64_t p = 0; p < tilePairs; ++p)
          for (int64_t j = 0; j < 2; ++j)
            acc.push_back(shareOf(gi, f.addi(pair0, f.cI64(p)), j, false));
        acc = overSteps(gi, acc, [&](Value t, llvm::SmallVector<Value>& a) {
          Value raw[2];
          for (int64_t j = 0; j < 2; ++j)
            raw[j] = load(vbytes, f.gep(codes, i8, f.addi(f.muli(t, f.cI64(128)), f.cI64(16 * j))));
          for (int64_t h = 0; h < 2; ++h) {
            Value wv[2] = {nibbles(raw[0], h), nibbles(raw[1], h)};
            for (int64_t p = 0; p < tilePairs; ++p) {
              Value x = load(vbytes, actAt(t, h, f.addi(pair0, f.cI64(p)), false));
              for (int64_t j = 0; j < 2; ++j)
                a[p * 2 + j] = smmla(a[p * 2 + j], x, wv[j]);
            }
          }
        });
        // Channel pair j's scales [s_2j, s_2j+1, s_2j, s_2j+1].
        Value scaleAt = f.gep(scales, i16, f.addi(f.muli(n0, groups), f.addi(f.muli(gi, p16), f.muli(q, f.cI64(4)))));
        Value sv[2];
        for (int64_t j = 0; j < 2; ++j) {
          Value word = b.create<mlir::LLVM::LoadOp>(loc, f.i32, f.gep(scaleAt, i16, f.cI64(2 * j)), 2);
          Value dup = b.create<mlir::vector::SplatOp>(loc, mlir::VectorType::get({2}, f.i32), word);
          Value half = b.create<mlir::LLVM::BitcastOp>(loc, mlir::VectorType::get({4}, b.getF16Type()), dup);
          sv[j] = b.create<mlir::arith::ExtFOp>(loc, vf32, half);
        }
        llvm::SmallVector<Value> next;
        for (int64_t c = 0; c < 2 * tilePairs; ++c)
          next.push_back(fmaContract(f, b.create<mlir::arith::SIToFPOp>(loc, vf32, acc[c]), sv[c % 2], in[c]));
        return next;
      });
      for (int64_t p = 0; p < tilePairs; ++p)
        for (int64_t h = 0; h < 2; ++h) {
          // Row 2p + h's 4 channels: lanes 2h, 2h + 1 of both channel pairs' sums.
          Value val = shuffle(totals[2 * p], totals[2 * p + 1], {2 * h, 2 * h + 1, 2 * h + 4, 2 * h + 5});
          storeRow(val, f.addi(f.addi(mb0, m0), f.cI64(2 * p + h)), c0, bias, storeMask);
        }
    };

    // Pair p of the block (rows 2p and 2p + 1, or 2p alone) x the 16 channels of panel pn.
    auto pairTile = [&](Value mb0, Value p, Value pn, bool alone, bool pairMajor) {
      Value n0 = f.muli(pn, p16);
      Value codes = f.gep(w, i8, divs(f.muli(n0, K), two));
      Value storeMask[4], bias[4];
      for (int64_t q = 0; q < 4; ++q) {
        storeMask[q] = storeMaskAt(f.addi(n0, f.cI64(4 * q)));
        bias[q] = biasAt(f.addi(n0, f.cI64(4 * q)));
      }
      const int64_t rows = alone ? 1 : 2;
      llvm::SmallVector<Value> totals = overGroups(4 * rows, [&](Value gi, llvm::ArrayRef<Value> in) {
        llvm::SmallVector<Value> acc;
        for (int64_t j = 0; j < 8; ++j)
          acc.push_back(pairMajor || j < 2 ? shareOf(gi, p, j, pairMajor) : acc[j % 2]);
        acc = overSteps(gi, acc, [&](Value t, llvm::SmallVector<Value>& a) {
          Value x0 = load(vbytes, actAt(t, 0, p, pairMajor));
          Value x1 = load(vbytes, actAt(t, 1, p, pairMajor));
          for (int64_t j = 0; j < 8; ++j) {
            Value raw = load(vbytes, f.gep(codes, i8, f.addi(f.muli(t, f.cI64(128)), f.cI64(16 * j))));
            a[j] = smmla(smmla(a[j], x0, nibbles(raw, false)), x1, nibbles(raw, true));
          }
        });
        Value scaleAt = f.gep(scales, i16, f.addi(f.muli(n0, groups), f.muli(gi, p16)));
        llvm::SmallVector<Value> next(4 * rows);
        for (int64_t q = 0; q < 4; ++q) {
          Value half = b.create<mlir::LLVM::LoadOp>(loc, mlir::VectorType::get({4}, b.getF16Type()),
                                                    f.gep(scaleAt, i16, f.cI64(4 * q)), 2);
          Value sc = b.create<mlir::arith::ExtFOp>(loc, vf32, half);
          for (int64_t h = 0; h < rows; ++h) {
            // Row h's channels 4q..4q+3: lanes 2h, 2h + 1 of channel pairs 2q and 2q + 1.
            Value sums = shuffle(acc[2 * q], acc[2 * q + 1], {2 * h, 2 * h + 1, 2 * h + 4, 2 * h + 5});
            next[h * 4 + q] = fmaContract(f, b.create<mlir::arith::SIToFPOp>(loc, vf32, sums), sc, in[h * 4 + q]);
          }
        }
        return next;
      });
      Value r0 = f.addi(mb0, f.muli(p, two));
      for (int64_t h = 0; h < rows; ++h)
        for (int64_t q = 0; q < 4; ++q)
          storeRow(totals[h * 4 + q], f.addi(r0, f.cI64(h)), f.addi(n0, f.cI64(4 * q)), bias[q], storeMask[q]);
    };

    Value pBegin = divs(nBegin, p16), pEnd = divs(f.addi(nEnd, f.cI64(15)), p16);
    f.loop(zero, M, f.cI64(kBlock), [&](Value mb0) {
      Value mb = minI(f.cI64(kBlock), sub(M, mb0));
      // Each row's offset share per group: -8 x the sum of its activations (the group is
      // a multiple of 16: no rest).
      storeOffsetShares(f, xq, K, mb0, mb, groups, group, 16, -8, scratch);
      // The pairs: activations and shares.
      Value pairs = divs(f.addi(mb, one), two);
      // Fewer than 8 rows: pair tiles only, the activations pair by pair.
      Value small = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::slt, mb, f.cI64(8));
      Value strideP = b.create<mlir::arith::SelectOp>(loc, small, f.cI64(32), p16);
      Value strideH = b.create<mlir::arith::SelectOp>(loc, small, p16, f.cI64(16 * kPairs));
      f.loop(zero, pairs, one, [&](Value p) {
        Value i0 = f.muli(p, two), i1 = minI(f.addi(i0, one), sub(mb, one));
        Value at0 = f.muli(f.addi(mb0, i0), K), at1 = f.muli(f.addi(mb0, i1), K);
        auto vi64x2 = mlir::VectorType::get({2}, f.i64);
        f.loop(zero, divs(K, p16), one, [&](Value t) {
          for (int64_t h = 0; h < 2; ++h) {
            Value k = f.addi(f.muli(t, p16), f.cI64(8 * h));
            Value a = b.create<mlir::LLVM::LoadOp>(loc, f.i64, f.gep(xq, i8, f.addi(at0, k)), 1);
            Value c = b.create<mlir::LLVM::LoadOp>(loc, f.i64, f.gep(xq, i8, f.addi(at1, k)), 1);
            Value v = b.create<mlir::vector::InsertOp>(loc, a, f.splatInt(vi64x2, 0), 0);
            v = b.create<mlir::vector::InsertOp>(loc, c, v, 1);
            Value at = f.addi(f.addi(f.muli(t, f.cI64(32 * kPairs)), f.muli(p, strideP)), f.muli(f.cI64(h), strideH));
            b.create<mlir::LLVM::StoreOp>(loc, v, f.gep(acts, i8, at), 1);
          }
        });
        f.loop(zero, groups, one, [&](Value gi) {
          Value o0 = f.load(f.i32, scratch, f.i32, f.addi(f.muli(i0, groups), gi));
          Value o1 = f.load(f.i32, scratch, f.i32, f.addi(f.muli(i1, groups), gi));
          auto v8i32 = mlir::VectorType::get({8}, f.i32);
          Value v = f.splatInt(v8i32, 0);
          for (int64_t l = 0; l < 8; ++l)
            v = b.create<mlir::vector::InsertOp>(loc, l % 4 < 2 ? o0 : o1, v, l);
          Value at = shareIndex(gi, p, small);
          b.create<mlir::LLVM::StoreOp>(loc, v, f.gep(pairShares, f.i32, at), 4);
          auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, small, false);
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(ifOp.thenBlock());
          for (int64_t c = 1; c < 4; ++c)
            b.create<mlir::LLVM::StoreOp>(loc, v, f.gep(pairShares, f.i32, f.addi(at, f.cI64(8 * c))), 4);
        });
      });
      // Rows in tiles of 12, then one of 8 if 8 are left, then pairs.
      Value m12 = f.muli(divs(mb, f.cI64(12)), f.cI64(12));
      Value has8 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::sge, sub(mb, m12), f.cI64(8));
      Value mI = b.create<mlir::arith::SelectOp>(loc, has8, f.addi(m12, f.cI64(8)), m12);
      Value fullPairs = divs(mb, two);
      Value alone = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::ne,
                                                  b.create<mlir::arith::RemSIOp>(loc, mb, two), zero);
      f.loop(pBegin, pEnd, one, [&](Value pn) {
        f.loop(zero, f.cI64(4), one, [&](Value q) {
          f.loop(zero, m12, f.cI64(12), [&](Value m0) { quarterTile(mb0, m0, pn, q, 6); });
          auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, has8, false);
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(ifOp.thenBlock());
          quarterTile(mb0, m12, pn, q, 4);
        });
        auto smallIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, small, true);
        for (bool pairMajor : {true, false}) {
          mlir::OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(pairMajor ? smallIf.thenBlock() : smallIf.elseBlock());
          f.loop(divs(mI, two), fullPairs, one, [&](Value p) { pairTile(mb0, p, pn, false, pairMajor); });
          auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, alone, false);
          b.setInsertionPointToStart(ifOp.thenBlock());
          pairTile(mb0, fullPairs, pn, true, pairMajor);
        }
      });
    });
  };
  // Group 32 (the common one) with the group a constant, any other at run time.
  Value is32 = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, runtimeGroup, f.cI64(32));
  auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is32, true);
  b.setInsertionPointToStart(ifOp.thenBlock());
  emit(f.cI64(32), 32);
  b.setInsertionPointToStart(ifOp.elseBlock());
  emit(runtimeGroup, std::nullopt);
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// y[m, n] = x[m, :] . W[n, :] (+ bias[n]) with float activations, for a weight packed
// in panels of 16 output channels (formats/encoding.h):
//   panel16     f32, f16, bf16 (widened per load) or fp8 codes (decoded per load, the
//               sums times the row's scale at the end): a panel's column k per step;
//   int8_p16k4  a panel's 4-byte words of 4 columns per step, each column's codes
//               taken by a shift pair and converted (the sums times the row's scale
//               at the end);
//   int4_p16k8  a panel's words of 8 columns per step (column 8s + j in the low
//               nibble of byte j, 8s + 4 + j in the high one), each column's codes
//               taken by a shift and a mask and dequantised exactly as (c - 8) x the
//               group's f16 scale (one fma), the scales loaded once per group.
// Per whole panels of 16 output channels in [begin, end), tiles of mr rows x 16
// columns (x 2 panels side by side where a panel is a single vector, AVX-512: each
// broadcast then feeds two multiply-adds): each step's weight columns are decoded
// once for the mr rows, each row's x[m, k] broadcast and multiply-added into mr x 16 /
// lanes accumulators per panel. The rows left over after whole tiles run as one
// more tile whose rows past the last repeat it; a single row (decode) runs tiles of
// up to 4 panel vectors, so that 4 chains of sums hide the multiply-add latency.
// Every output is summed over k in order by one chain, whatever the tile, so the
// split of rows or channels does not change it. Rows of the range outside its whole
// panels (a range that cuts a panel, the last panel's rows left over) one dot product
// at a time, in the same order.
void buildMatmulPanels(mlir::ModuleOp kernels, llvm::StringRef name, uint8_t encoding, uint8_t layout,
                       const Target& target, bool isPublic, mlir::Location loc) {
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true, isPublic);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  const bool int8 = layout == format::kLayoutInt8P16K4, int4 = layout == format::kLayoutInt4P16K8;
  const bool fp8 = encoding == format::kEncFP8_E4M3 || encoding == format::kEncFP8_E5M2;
  const bool rowScaled = int8 || fp8;  // the sums times the row's f32 scale
  const int64_t step = int4 ? int64_t(format::kP16K8Step) : int8 ? int64_t(format::kP16K4Step) : 1;
  const int64_t P = static_cast<int64_t>(format::kPanel16Rows);
  const int64_t lanes = std::min<int64_t>(vectorLanes(target), P);
  const int64_t vecs = P / lanes;
  const int64_t pairs = vecs == 1 ? 2 : 1;  // panels per tile
  const int64_t tileVecs = vecs * pairs;
  // Registers besides the accumulators, per vector of the tile: the weight column
  // (+ the loaded words for int8 and int4; + the group's scale and -8 x scale for
  // int4; + the decoding's temporaries for fp8).
  const int64_t extra = int4 || fp8 ? 4 : int8 ? 2 : 1;
  const int64_t mr = std::clamp<int64_t>((intDot(target).registers - extra * tileVecs - 2) / tileVecs, 1, 14);
  const int64_t decodePanels = std::max<int64_t>(1, 4 / vecs);  // panels of a single row's tile
  auto vf32 = mlir::VectorType::get({lanes}, f.f32);
  auto vi32 = mlir::VectorType::get({lanes}, f.i32);
  auto i8 = b.getI8Type();
  auto i16 = b.getI16Type();

  const MatmulArgs args(f, fn, hasF16Conversion(target));
  Value x = args.x, M = args.M, K = args.K, w = args.w, N = args.N, y = args.y, ldy = args.ldy;
  Value nBegin = args.nBegin, nEnd = args.nEnd;
  Value zero = f.cI64(0), one = f.cI64(1), p16 = f.cI64(P);
  Value group, groups, scales;  // int4: group size, groups per row, the f16 scales
  Value rowScales;              // int8, fp8: the f32 row scales after the codes
  if (int4) {
    group = b.create<mlir::arith::ExtUIOp>(
        loc, f.i64,
        f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, group), f.i32));
    groups = b.create<mlir::arith::DivSIOp>(loc, K, group);
    scales = f.gep(w, i8, b.create<mlir::arith::DivSIOp>(loc, f.muli(N, K), f.cI64(2)));
  }
  if (rowScaled)
    rowScales = f.gep(w, i8, f.muli(N, K));
  auto bias = [&](Value n) { return args.bias(f, n); };
  // acc + a * c, allowed to fuse but not to reassociate: the single channels' dot
  // products then sum in the tiles' order (not vectorised), bit for bit.
  auto fma = [&](Value a, Value c, Value acc) {
    auto fm = mlir::arith::FastMathFlags::contract;
    return b.create<mlir::arith::AddFOp>(loc, b.create<mlir::arith::MulFOp>(loc, a, c, fm), acc, fm).getResult();
  };
  auto roundDown16 = [&](Value v) { return b.create<mlir::arith::AndIOp>(loc, v, f.cI64(~(P - 1))); };
  auto ci32 = [&](int64_t v) { return b.create<mlir::arith::ConstantIntOp>(loc, v, 32).getResult(); };
  // The f16 scale(s) at scales[index..] as f32 (a vector when `t` is one).
  auto halfScales = [&](mlir::Type t, Value index) -> Value {
    if (auto vt = llvm::dyn_cast<mlir::VectorType>(t)) {
      Value raw = loadVector(f, mlir::VectorType::get({lanes}, i16), f.gep(scales, i16, index), Value(), 2);
      Value half = b.create<mlir::arith::BitcastOp>(loc, mlir::VectorType::get({lanes}, b.getF16Type()), raw);
      return b.create<mlir::arith::ExtFOp>(loc, vf32, half);
    }
    Value h = b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), f.load(i16, scales, i16, index));
    return b.create<mlir::arith::ExtFOp>(loc, f.f32, h);
  };
  // The epilogue of an output's sum: times the row's scale (int8, fp8), plus the bias.
  auto finish = [&](Value sum, Value scale, Value biasV) { return f.add(rowScaled ? f.mul(sum, scale) : sum, biasV); };

  // Output channel n alone: its panel's start and height give its elements.
  auto singleRow = [&](Value n) {
    Value first = roundDown16(n);
    Value height = b.create<mlir::arith::MinSIOp>(loc, p16, b.create<mlir::arith::SubIOp>(loc, N, first));
    Value within = b.create<mlir::arith::SubIOp>(loc, n, first);
    Value bn = bias(n);
    Value sn = rowScaled ? f.load(f.f32, rowScales, f.f32, n) : Value();
    // Element (n, k) as f32 (for int4 with its group's scale; int8 and fp8 without).
    auto element = [&](Value k) -> Value {
      if (int8 || int4) {
        // Byte (k % step) % 4 of the row's word of step k / step.
        Value s = b.create<mlir::arith::DivSIOp>(loc, k, f.cI64(step));
        Value j = b.create<mlir::arith::RemSIOp>(loc, k, f.cI64(step));
        Value word = f.addi(f.muli(first, b.create<mlir::arith::DivSIOp>(loc, K, f.cI64(step))),
                            f.addi(f.muli(s, height), within));
        Value at = f.addi(f.muli(word, f.cI64(4)), b.create<mlir::arith::RemSIOp>(loc, j, f.cI64(4)));
        Value byte = f.load(i8, w, i8, at);
        if (int8)
          return b.create<mlir::arith::SIToFPOp>(loc, f.f32, byte);
        Value wide = b.create<mlir::arith::ExtUIOp>(loc, f.i32, byte);
        Value shift = b.create<mlir::arith::TruncIOp>(
            loc, f.i32, f.muli(b.create<mlir::arith::DivSIOp>(loc, j, f.cI64(4)), f.cI64(4)));
        Value c = b.create<mlir::arith::AndIOp>(loc, b.create<mlir::arith::ShRUIOp>(loc, wide, shift), ci32(15));
        Value g = b.create<mlir::arith::DivSIOp>(loc, k, group);
        Value sc = halfScales(f.f32, f.addi(f.muli(first, groups), f.addi(f.muli(g, height), within)));
        Value centred = b.create<mlir::arith::SubIOp>(loc, c, ci32(8));
        return f.mul(b.create<mlir::arith::SIToFPOp>(loc, f.f32, centred), sc);
      }
      Value index = f.addi(f.muli(first, K), f.addi(f.muli(k, height), within));
      if (fp8) {
        auto v1 = mlir::VectorType::get({1}, i8);
        Value raw = b.create<mlir::vector::SplatOp>(loc, v1, f.load(i8, w, i8, index));
        Value v = decodeFp8(f, raw, encoding == format::kEncFP8_E4M3);
        return b.create<mlir::vector::ExtractOp>(loc, v, 0);
      }
      if (encoding == format::kEncF32)
        return f.load(f.f32, w, f.f32, index);
      Value h = f.load(i16, w, i16, index);
      if (encoding == format::kEncF16)
        return b.create<mlir::arith::ExtFOp>(loc, f.f32,
                                             b.create<mlir::arith::BitcastOp>(loc, b.getF16Type(), h).getResult());
      Value wide = b.create<mlir::arith::ExtUIOp>(loc, f.i32, h);
      return b.create<mlir::arith::BitcastOp>(loc, f.f32,
                                              b.create<mlir::arith::ShLIOp>(loc, wide, ci32(16)).getResult());
    };
    f.loop(zero, M, one, [&](Value m) {
      Value zeroF = b.create<mlir::arith::ConstantOp>(loc, b.getF32FloatAttr(0));
      Value rowAt = args.xRowOffset(f, m);
      auto sum = b.create<mlir::scf::ForOp>(loc, zero, K, one, mlir::ValueRange{zeroF});
      {
        mlir::OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToStart(sum.getBody());
        Value k = sum.getInductionVar();
        Value xv = f.load(f.f32, x, f.f32, f.addi(rowAt, k));
        b.create<mlir::scf::YieldOp>(loc, mlir::ValueRange{fma(xv, element(k), sum.getRegionIterArgs()[0])});
      }
      f.store(finish(sum.getResult(0), sn, bn), y, f.f32, f.addi(f.muli(m, ldy), n));
    });
  };

  // The weight columns of one step (k0 = the step's first column) of the tile's
  // panels: cols[j][c] is column k0 + j of vector c (panel c / vecs, its lanes
  // (c % vecs) x lanes ..). `groupScale` (int4): the group's scales and -8 x them.
  auto stepColumns = [&](Value n0, int64_t panels, Value k0, llvm::ArrayRef<std::pair<Value, Value>> groupScale) {
    llvm::SmallVector<llvm::SmallVector<Value>> cols(step);
    for (int64_t pn = 0; pn < panels; ++pn) {
      Value first = f.addi(n0, f.cI64(pn * P));
      for (int64_t v = 0; v < vecs; ++v) {
        const int64_t c = pn * vecs + v;
        if (!int8 && !int4) {
          Value index = f.addi(f.addi(f.muli(first, K), f.muli(k0, p16)), f.cI64(v * lanes));
          if (fp8) {
            Value raw = loadVector(f, mlir::VectorType::get({lanes}, i8), f.gep(w, i8, index), Value(), 1);
            cols[0].push_back(decodeFp8(f, raw, encoding == format::kEncFP8_E4M3));
          } else {
            cols[0].push_back(loadFloatWeight(f, encoding, lanes, w, index, Value()));
          }
          continue;
        }
        // Words (4 bytes of each channel) of step k0 / step: first * K / step + the
        // step's 16 words.
        Value wordAt = f.addi(f.muli(first, b.create<mlir::arith::DivSIOp>(loc, K, f.cI64(step))),
                              f.addi(f.muli(b.create<mlir::arith::DivSIOp>(loc, k0, f.cI64(step)), p16),
                                     f.cI64(v * lanes)));
        Value words = loadVector(f, vi32, f.gep(w, f.i32, wordAt), Value(), 4);
        for (int64_t j = 0; j < step; ++j) {
          if (int8) {
            // Byte j of each word, sign-extended.
            Value up = j == 3 ? words : b.create<mlir::arith::ShLIOp>(loc, words, f.splatInt(vi32, 24 - 8 * j));
            Value codes = b.create<mlir::arith::ShRSIOp>(loc, up, f.splatInt(vi32, 24));
            cols[j].push_back(b.create<mlir::arith::SIToFPOp>(loc, vf32, codes));
            continue;
          }
          const int64_t shift = 8 * (j % 4) + 4 * (j / 4);
          Value shifted = shift ? b.create<mlir::arith::ShRUIOp>(loc, words, f.splatInt(vi32, shift)).getResult()
                                : words;
          // The top nibble needs no mask.
          Value codes = shift == 28 ? shifted
                                    : b.create<mlir::arith::AndIOp>(loc, shifted, f.splatInt(vi32, 15)).getResult();
          // (c - 8) x s = c x s - 8 s, exact in f32, one fma.
          Value cf = b.create<mlir::arith::SIToFPOp>(loc, vf32, codes);
          cols[j].push_back(b.create<mlir::math::FmaOp>(loc, cf, groupScale[c].first, groupScale[c].second));
        }
      }
    }
    return cols;
  };

  // Rows [m0, m0 + rows) of `panels` whole panels starting at output channel n0;
  // with `last`, rows past it repeat row `last` (the same sums stored again).
  auto panelTile = [&](Value m0, int64_t rows, Value n0, int64_t panels, llvm::ArrayRef<Value> biasVec,
                       llvm::ArrayRef<Value> scaleVec, Value last = Value()) {
    auto rowOf = [&](int64_t i) -> Value {
      Value r = f.addi(m0, f.cI64(i));
      return last ? b.create<mlir::arith::MinSIOp>(loc, r, last).getResult() : r;
    };
    const int64_t cols = panels * vecs;
    const int64_t count = rows * cols;
    llvm::SmallVector<Value> init(count, f.splat(vf32, 0.0));
    llvm::SmallVector<Value> rowAt;
    for (int64_t i = 0; i < rows; ++i)
      rowAt.push_back(args.xRowOffset(f, rowOf(i)));
    // One step of columns from k0 into the accumulators `acc`.
    auto stepBody = [&](Value k0, mlir::ValueRange acc, llvm::ArrayRef<std::pair<Value, Value>> groupScale) {
      llvm::SmallVector<llvm::SmallVector<Value>> ws = stepColumns(n0, panels, k0, groupScale);
      llvm::SmallVector<Value> out(acc.begin(), acc.end());
      for (int64_t j = 0; j < step; ++j)
        for (int64_t i = 0; i < rows; ++i) {
          Value xs = f.load(f.f32, x, f.f32, f.addi(rowAt[i], f.addi(k0, f.cI64(j))));
          Value xb = b.create<mlir::vector::SplatOp>(loc, vf32, xs);
          for (int64_t c = 0; c < cols; ++c)
            out[i * cols + c] = fma(xb, ws[j][c], out[i * cols + c]);
        }
      return out;
    };
    mlir::ValueRange sums;
    mlir::scf::ForOp outer;
    if (int4) {
      // Per group: its scales (the panels' rows, contiguous), then its steps.
      outer = b.create<mlir::scf::ForOp>(loc, zero, groups, one, init);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(outer.getBody());
      Value gi = outer.getInductionVar();
      llvm::SmallVector<std::pair<Value, Value>> gs;
      for (int64_t pn = 0; pn < panels; ++pn) {
        Value first = f.addi(n0, f.cI64(pn * P));
        for (int64_t v = 0; v < vecs; ++v) {
          Value sc = halfScales(vf32, f.addi(f.muli(first, groups), f.addi(f.muli(gi, p16), f.cI64(v * lanes))));
          gs.push_back({sc, f.mul(sc, f.splat(vf32, -8.0))});
        }
      }
      Value kStart = f.muli(gi, group);
      auto inner = b.create<mlir::scf::ForOp>(loc, kStart, f.addi(kStart, group), f.cI64(step),
                                              outer.getRegionIterArgs());
      {
        mlir::OpBuilder::InsertionGuard g2(b);
        b.setInsertionPointToStart(inner.getBody());
        b.create<mlir::scf::YieldOp>(loc, stepBody(inner.getInductionVar(), inner.getRegionIterArgs(), gs));
      }
      b.create<mlir::scf::YieldOp>(loc, inner.getResults());
    } else {
      outer = b.create<mlir::scf::ForOp>(loc, zero, K, f.cI64(step), init);
      mlir::OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToStart(outer.getBody());
      b.create<mlir::scf::YieldOp>(loc, stepBody(outer.getInductionVar(), outer.getRegionIterArgs(), {}));
    }
    sums = outer.getResults();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c)
        storeLanes(f, finish(sums[i * cols + c], rowScaled ? scaleVec[c] : Value(), biasVec[c]), y,
                   f.addi(f.muli(rowOf(i), ldy), f.addi(n0, f.cI64(c * lanes))), Value());
  };
  // The bias (and the row scales) of the tile's vectors.
  auto epilogueVectors = [&](Value n0, int64_t panels, llvm::SmallVector<Value>& biasVec,
                             llvm::SmallVector<Value>& scaleVec) {
    for (int64_t v = 0; v < panels * vecs; ++v) {
      Value bv = f.splat(vf32, 0.0);
      for (int64_t j = 0; j < lanes; ++j)
        bv = b.create<mlir::vector::InsertOp>(loc, bias(f.addi(n0, f.cI64(v * lanes + j))), bv, j);
      biasVec.push_back(bv);
      if (rowScaled)
        scaleVec.push_back(loadLanes(f, vf32, rowScales, f.addi(n0, f.cI64(v * lanes)), Value()));
    }
  };
  // Every row of `panels` whole panels from n0: mr rows at a time, the rows left
  // over in one more tile of mr whose rows past the last repeat it (a short prompt's
  // rows would otherwise run one at a time, at a fraction of the tile's speed).
  Value mMain = roundDownFrom(f, M, zero, f.cI64(mr));
  Value lastRow = b.create<mlir::arith::SubIOp>(loc, M, one);
  auto panelRows = [&](Value n0, int64_t panels) {
    llvm::SmallVector<Value> biasVec, scaleVec;
    epilogueVectors(n0, panels, biasVec, scaleVec);
    f.loop(zero, mMain, f.cI64(mr), [&](Value m0) { panelTile(m0, mr, n0, panels, biasVec, scaleVec); });
    f.loop(mMain, M, f.cI64(mr), [&](Value m0) { panelTile(m0, mr, n0, panels, biasVec, scaleVec, lastRow); });
  };
  auto singleRowPanels = [&](Value n0, int64_t panels) {
    llvm::SmallVector<Value> biasVec, scaleVec;
    epilogueVectors(n0, panels, biasVec, scaleVec);
    panelTile(zero, 1, n0, panels, biasVec, scaleVec);
  };

  // [nBegin, pBegin) and [pEnd, nEnd) one channel at a time; whole panels between,
  // `pairs` at a time (a single row: `decodePanels`), then one by one.
  Value up = roundDown16(f.addi(nBegin, f.cI64(P - 1)));
  Value pBegin = b.create<mlir::arith::MinSIOp>(loc, up, nEnd);
  Value pEnd = b.create<mlir::arith::MaxSIOp>(loc, roundDown16(nEnd), pBegin);
  f.loop(nBegin, pBegin, one, singleRow);
  Value isRow = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, M, one);
  auto rowIf = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, isRow, /*withElse=*/true);
  {
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(rowIf.thenBlock());
    Value stepRow = f.cI64(decodePanels * P);
    Value wideEnd = roundDownFrom(f, pEnd, pBegin, stepRow);
    f.loop(pBegin, wideEnd, stepRow, [&](Value n0) { singleRowPanels(n0, decodePanels); });
    f.loop(wideEnd, pEnd, p16, [&](Value n0) { singleRowPanels(n0, 1); });
    b.setInsertionPointToStart(rowIf.elseBlock());
    Value stepPair = f.cI64(pairs * P);
    Value pairEnd = roundDownFrom(f, pEnd, pBegin, stepPair);
    f.loop(pBegin, pairEnd, stepPair, [&](Value n0) { panelRows(n0, pairs); });
    f.loop(pairEnd, pEnd, p16, [&](Value n0) { panelRows(n0, 1); });
  }
  f.loop(pEnd, nEnd, one, singleRow);
  b.setInsertionPointToEnd(&fn.getBody().front());
  b.create<mlir::func::ReturnOp>(loc);
}

// The matmul family of an op (a kiln_uk_matmul_fn): one function per weight
// encoding, float ones (`floatEncodings`) for float activations and integer ones
// (`intEncodings`) for int8 activations, and with several a public dispatcher on
// the activations (xq set or not) and the weight's encoding.
void buildMatmul(mlir::ModuleOp kernels, llvm::StringRef name, uint32_t floatEncodings, uint32_t intEncodings,
                 uint32_t packedLayouts, uint32_t a16Layouts, uint32_t panelEncodings, const Target& target,
                 mlir::Location loc) {
  struct Variant {
    uint8_t encoding;
    bool a8;
    uint8_t layout = format::kLayoutRowMajor;
  };
  llvm::SmallVector<Variant> variants;
  for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16, format::kEncFP8_E4M3, format::kEncFP8_E5M2,
                    format::kEncINT8, format::kEncINT4})
    if (floatEncodings & format::EncodingBit(e))
      variants.push_back({e, false});
  for (uint8_t e : {format::kEncINT8, format::kEncINT4})
    if (intEncodings & format::EncodingBit(e))
      variants.push_back({e, true});
  for (uint8_t layout : {format::kLayoutInt4P16K8, format::kLayoutInt8P16K4, format::kLayoutInt4P128K4,
                         format::kLayoutInt4P16K16})
    if (packedLayouts & (1u << layout))
      variants.push_back({layout == format::kLayoutInt8P16K4 ? format::kEncINT8 : format::kEncINT4, true, layout});
  for (uint8_t layout : {format::kLayoutInt4P16K8, format::kLayoutInt8P16K4})
    if (a16Layouts & (1u << layout))
      variants.push_back({layout == format::kLayoutInt8P16K4 ? format::kEncINT8 : format::kEncINT4, false, layout});
  for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16, format::kEncFP8_E4M3, format::kEncFP8_E5M2})
    if (panelEncodings & format::EncodingBit(e))
      variants.push_back({e, false, format::kLayoutPanel16});
  auto build = [&](const Variant& v, llvm::StringRef fnName, bool isPublic) {
    if (v.layout != format::kLayoutRowMajor && !v.a8)
      buildMatmulPanels(kernels, fnName, v.encoding, v.layout, target, isPublic, loc);
    else if (v.layout == format::kLayoutInt4P128K4)
      buildMatmulInt4Lut(kernels, fnName, isPublic, loc);
    else if (v.layout == format::kLayoutInt4P16K16)
      buildMatmulInt4Pairs(kernels, fnName, target, isPublic, loc);
    else if (v.layout == format::kLayoutInt4P16K8 || v.layout == format::kLayoutInt8P16K4)
      buildMatmulIntPanels(kernels, fnName, v.encoding, target, isPublic, loc);
    else if (v.a8)
      buildMatmulInt(kernels, fnName, v.encoding, target, isPublic, loc);
    else
      buildMatmulFloat(kernels, fnName, v.encoding, vectorLanes(target), hasF16Conversion(target), isPublic, loc);
  };
  if (variants.size() == 1) {
    build(variants[0], name, true);
    return;
  }
  auto variantName = [&](const Variant& v) {
    return (name + "_w" + encodingTag(v.encoding) + (v.a8 ? "_a8" : "") +
            (v.layout ? "_" + std::string(format::LayoutName(v.layout)) : ""))
        .str();
  };
  for (const Variant& v : variants)
    build(v, variantName(v), false);
  mlir::func::FuncOp fn = newKernel(kernels, name, loc, /*scratch=*/true);
  mlir::OpBuilder b(fn.getBody());
  b.setInsertionPointToStart(&fn.getBody().front());
  FnBuilder f(b, loc);
  Value enc = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, encoding),
                      b.getI8Type());
  Value layout = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, w) + offsetof(kiln_uk_weight_t, layout),
                         b.getI8Type());
  Value xq = f.field(fn.getArgument(0), offsetof(kiln_uk_matmul_params_t, xq), f.ptr);
  Value a8 = b.create<mlir::LLVM::ICmpOp>(loc, mlir::LLVM::ICmpPredicate::ne, xq,
                                          b.create<mlir::LLVM::ZeroOp>(loc, f.ptr));
  Value isTrue = b.create<mlir::arith::ConstantIntOp>(loc, 1, 1);
  for (const Variant& v : variants) {
    Value isEnc = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, enc,
                                                b.create<mlir::arith::ConstantIntOp>(loc, v.encoding, 8));
    Value isAct = v.a8 ? a8 : b.create<mlir::arith::XOrIOp>(loc, a8, isTrue);
    Value isLayout = b.create<mlir::arith::CmpIOp>(loc, mlir::arith::CmpIPredicate::eq, layout,
                                                   b.create<mlir::arith::ConstantIntOp>(loc, v.layout, 8));
    Value is = b.create<mlir::arith::AndIOp>(loc, b.create<mlir::arith::AndIOp>(loc, isEnc, isAct), isLayout);
    auto ifOp = b.create<mlir::scf::IfOp>(loc, mlir::TypeRange{}, is, false);
    mlir::OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(ifOp.thenBlock());
    b.create<mlir::func::CallOp>(loc, variantName(v), mlir::TypeRange{}, fn.getArguments());
  }
  b.create<mlir::func::ReturnOp>(loc);
}

} // namespace

bool canGenerate(const Target& target) { return target.generate; }

namespace {

bool isMatmulOp(mlir::Operation* op) {
  return llvm::isa<LinearOp, LmHeadOp, GatedMlpOp, MoeOp, PatchEmbedOp>(op);
}

// A weight of a matmul-family op as its generated kernel reads it.
struct MatmulWeight {
  format::EncodingSpec spec;
  bool a8 = false;    // multiplied with int8 per-token activations
  bool bias = false;  // a Linear's or PatchEmbed's bias
  uint8_t layout = format::kLayoutRowMajor;
};

// The weights of `op`, in slot order (the last of a Linear's or PatchEmbed's two is
// the bias).
// The operands of a fused norm prologue (kiln-fuse-norm), which are no matmul weights.
llvm::SmallVector<mlir::Value, 2> normOperands(mlir::Operation* op) {
  llvm::SmallVector<mlir::Value, 2> out;
  auto add = [&](mlir::Value v) {
    if (v)
      out.push_back(v);
  };
  if (auto l = llvm::dyn_cast<LinearOp>(op)) {
    add(l.getNormWeight());
    add(l.getNormBias());
  } else if (auto g = llvm::dyn_cast<GatedMlpOp>(op)) {
    add(g.getNormWeight());
    add(g.getNormBias());
  }
  return out;
}

// The operands of a matmul op that its epilogue adds, which are no matmul weights
// either: a patch embedding's position table and class embedding (kiln-fuse-residual).
llvm::SmallVector<mlir::Value, 2> epilogueOperands(mlir::Operation* op) {
  llvm::SmallVector<mlir::Value, 2> out;
  if (auto p = llvm::dyn_cast<PatchEmbedOp>(op)) {
    if (p.getPosition())
      out.push_back(p.getPosition());
    if (p.getClassEmbedding())
      out.push_back(p.getClassEmbedding());
  }
  return out;
}

llvm::SmallVector<MatmulWeight> matmulWeights(mlir::Operation* op) {
  llvm::SmallVector<MatmulWeight> out;
  auto module = op->getParentOfType<mlir::ModuleOp>();
  const format::OpInfo* info = opInfo(op);
  const llvm::SmallVector<mlir::Value, 2> norm = normOperands(op);
  const llvm::SmallVector<mlir::Value, 2> epilogue = epilogueOperands(op);
  for (mlir::Value operand : op->getOperands()) {
    if (llvm::is_contained(norm, operand) || llvm::is_contained(epilogue, operand))
      continue;
    auto ref = operand.getDefiningOp<WeightRefOp>();
    if (!ref)
      continue;
    auto w = llvm::dyn_cast_or_null<WeightOp>(mlir::SymbolTable::lookupSymbolIn(module, ref.getNameAttr()));
    if (!w)
      continue;
    MatmulWeight mw;
    mw.spec = encodingSpec(w.getEncoding());
    mw.layout = static_cast<uint8_t>(w.getLayout());
    mw.a8 = w.getEncoding().getActivation() == ActivationMode::Int8PerToken && info &&
            format::HasSlot(info->int8_act_weights, static_cast<uint32_t>(out.size()));
    out.push_back(mw);
  }
  if (llvm::isa<LinearOp, PatchEmbedOp>(op) && out.size() == 2)
    out.back().bias = true;
  return out;
}

// The encodings of the weight (and layer norm bias) of a norm: a norm op's, or a
// fused norm prologue's (none when `op` has neither).
struct NormWeights {
  bool layer = false;
  uint8_t weight = format::kEncF32, bias = format::kEncF32;
};
std::optional<NormWeights> normWeights(mlir::Operation* op) {
  auto module = op->getParentOfType<mlir::ModuleOp>();
  auto encodingOf = [&](mlir::Value v) -> uint8_t {
    auto ref = v ? v.getDefiningOp<WeightRefOp>() : WeightRefOp();
    auto w = ref ? llvm::dyn_cast_or_null<WeightOp>(mlir::SymbolTable::lookupSymbolIn(module, ref.getNameAttr()))
                 : WeightOp();
    return w ? encodingSpec(w.getEncoding()).id : format::kEncF32;
  };
  NormWeights n;
  if (auto r = llvm::dyn_cast<RmsNormOp>(op)) {
    n.weight = encodingOf(r.getWeight());
    return n;
  }
  if (auto l = llvm::dyn_cast<LayerNormOp>(op)) {
    n.layer = true;
    n.weight = encodingOf(l.getWeight());
    n.bias = encodingOf(l.getBias());
    return n;
  }
  llvm::SmallVector<mlir::Value, 2> operands = normOperands(op);
  if (operands.empty())
    return std::nullopt;
  n.layer = operands.size() == 2;
  n.weight = encodingOf(operands[0]);
  if (n.layer)
    n.bias = encodingOf(operands[1]);
  return n;
}

// Whether the generated matmul reads weight `w` on `target`; when not, `why` says why.
bool matmulReads(const MatmulWeight& w, const Target& target, std::string* why) {
  const char* name = format::EncodingName(w.spec.id) ? format::EncodingName(w.spec.id) : "this encoding";
  if (w.bias) {
    if (generatedMatmulEncodings(target) & format::EncodingBit(w.spec.id))
      return true;
    *why = std::string("no generated matmul for a bias in ") + name + " on " + target.triple;
    return false;
  }
  if (format::IsQuantized(w.spec.id)) {
    // int8 and fp8 with float activations: codes widened in registers. int4: the
    // group's scale (f16) per vector, so the group must be whole vectors.
    if (w.spec.id == format::kEncINT4 && !hasF16Conversion(target)) {
      *why = "no generated int4 matmul on " + target.triple + " without f16 conversion (F16C)";
      return false;
    }
    if (w.spec.id == format::kEncINT4 && !w.a8 && (w.spec.group == 0 || w.spec.group % vectorLanes(target) != 0)) {
      *why = "no generated int4 matmul for group " + std::to_string(w.spec.group) + " on " + target.triple;
      return false;
    }
    if (w.spec.id == format::kEncINT4 && w.a8) {
      const int64_t chunk = intDot(target).chunk;
      if (w.spec.group == 0 || w.spec.group % chunk != 0) {
        *why = "no generated int4 matmul for group " + std::to_string(w.spec.group) + " on " + target.triple +
               " (the group must be a multiple of " + std::to_string(chunk) + ")";
        return false;
      }
    }
    return true;
  }
  if (!(generatedMatmulEncodings(target) & format::EncodingBit(w.spec.id))) {
    *why = std::string("no generated matmul for ") + name + " on " + target.triple;
    return false;
  }
  return true;
}

} // namespace

bool generatorSupports(mlir::Operation* op, llvm::StringRef kernelName, const Target& target, std::string* why) {
  if (!canGenerate(target)) {
    *why = "the portable target generates no code";
    return false;
  }
  if (llvm::isa<RopeOp, AddOp, MulOp, ActivationOp>(op))
    return true;
  if (llvm::isa<EmbeddingOp, PositionEmbeddingOp>(op)) {
    for (const MatmulWeight& w : matmulWeights(op)) {
      const uint8_t e = w.spec.id;
      if (e == format::kEncF16 && !hasF16Conversion(target)) {
        *why = "no generated f16 gather on " + target.triple + " without f16 conversion (F16C)";
        return false;
      }
      if (e == format::kEncINT4 && (!hasF16Conversion(target) || w.spec.group % vectorLanes(target) != 0)) {
        *why = "no generated int4 gather for group " + std::to_string(w.spec.group) + " on " + target.triple;
        return false;
      }
    }
    return true;
  }
  if (llvm::isa<AttentionOp, QkvAttentionOp>(op)) {
    const int64_t heads = op->getAttrOfType<mlir::IntegerAttr>("num_heads").getInt(),
                  kvHeads = op->getAttrOfType<mlir::IntegerAttr>("num_kv_heads").getInt(),
                  hd = op->getAttrOfType<mlir::IntegerAttr>("head_dim").getInt();
    if (heads <= 0 || kvHeads <= 0 || hd <= 0 || heads % kvHeads != 0) {
      *why = "no generated attention for these heads";
      return false;
    }
    return true;
  }
  // A norm op, or a matmul's fused norm prologue.
  if (std::optional<NormWeights> n = normWeights(op)) {
    for (uint8_t e : {n->weight, n->bias})
      if (!(generatedMatmulEncodings(target) & format::EncodingBit(e))) {
        *why = std::string("no generated normalisation for ") +
               (format::EncodingName(e) ? format::EncodingName(e) : "this encoding") + " weights on " +
               target.triple;
        return false;
      }
    if (llvm::isa<RmsNormOp, LayerNormOp>(op))
      return true;
  }
  if (isMatmulOp(op)) {
    const format::KernelInfo* info = kernelByName(kernelName);
    for (const MatmulWeight& w : matmulWeights(op)) {
      if (!matmulReads(w, target, why))
        return false;
      if (info && !w.bias && !(info->encodings & format::EncodingBit(w.spec.id))) {
        *why = std::string(info->name) + " does not read " + format::EncodingName(w.spec.id) + " weights";
        return false;
      }
    }
    return true;
  }
  *why = "no generator for " + op->getName().getStringRef().str() + " (" + kernelName.str() + ")";
  return false;
}

mlir::OwningOpRef<mlir::ModuleOp> buildKernelModule(mlir::ModuleOp model, const Target& target) {
  mlir::MLIRContext* ctx = model.getContext();
  ctx->loadDialect<mlir::arith::ArithDialect, mlir::func::FuncDialect, mlir::LLVM::LLVMDialect, mlir::math::MathDialect,
                   mlir::scf::SCFDialect, mlir::vector::VectorDialect, mlir::cf::ControlFlowDialect>();
  mlir::OpBuilder top(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> kernels = mlir::ModuleOp::create(model.getLoc(), llvm::StringRef("kiln_kernels"));
  setModuleTarget(*kernels, target);
  const std::string isa = isaSuffix(target);
  const int64_t lanes = vectorLanes(target);
  std::map<std::string, bool> built;
  bool failed = false;
  // The normalisation function for weights of these encodings (built once).
  auto normKernel = [&](const NormWeights& n, mlir::Location loc) {
    std::string name = std::string("kiln_uk_") + (n.layer ? "layernorm" : "rmsnorm") + "_f32_f32_w" +
                       encodingTag(n.weight) + (n.layer ? std::string("_b") + encodingTag(n.bias) : std::string()) +
                       "_gen_" + isa;
    if (!built[name])
      buildNorm(*kernels, name, n.layer, n.weight, n.bias, lanes, loc);
    built[name] = true;
    return name;
  };
  // The activation function `kind` (built once).
  auto actKernel = [&](ActivationKind kind, mlir::Location loc) {
    std::string name = "kiln_uk_act_" + stringifyActivationKind(kind).str() + "_f32_f32_gen_" + isa;
    if (!built[name])
      buildEltwise(*kernels, name, Eltwise::Act, static_cast<int32_t>(kind), lanes, loc);
    built[name] = true;
    return name;
  };
  // The rotary embedding of `heads` heads of `hd` (built once).
  auto ropeKernel = [&](int64_t heads, int64_t hd, mlir::Location loc) {
    std::string name = "kiln_uk_rope_f32_f32_" + std::to_string(heads) + "x" + std::to_string(hd) + "_gen_" + isa;
    if (!built[name])
      buildRope(*kernels, name, heads, hd, lanes, loc);
    built[name] = true;
    return name;
  };
  model.walk([&](mlir::Operation* op) {
    auto kernelName = op->getAttrOfType<mlir::StringAttr>("kiln.kernel");
    if (!kernelName)
      return;
    const format::KernelInfo* info = kernelByName(kernelName.getValue());
    if (!info || llvm::StringRef(info->isa) != "generated")
      return;
    if (!canGenerate(target)) {
      op->emitOpError("is bound to generated kernel ") << info->name << " but target " << target.triple
                                                       << " generates no code";
      failed = true;
      return;
    }
    std::string symbol;
    std::vector<std::string> extra;  // further functions of a fused op (kiln.symbols)
    if (auto rope = llvm::dyn_cast<RopeOp>(op)) {
      int64_t heads = rope.getNumHeads(), hd = rope.getHeadDim();
      if (hd <= 0 || hd % 2 != 0 || heads <= 0) {
        op->emitOpError("cannot generate a rope kernel for head_dim ") << hd << " and " << heads << " heads";
        failed = true;
        return;
      }
      symbol = ropeKernel(heads, hd, op->getLoc());
    } else if (llvm::isa<EmbeddingOp, PositionEmbeddingOp>(op)) {
      std::string why;
      if (!generatorSupports(op, info->name, target, &why)) {
        op->emitOpError("cannot generate kernel ") << info->name << ": " << why;
        failed = true;
        return;
      }
      llvm::SmallVector<MatmulWeight> ws = matmulWeights(op);
      const uint8_t enc = ws.empty() ? format::kEncF32 : ws[0].spec.id;
      const uint8_t layout = ws.empty() ? format::kLayoutRowMajor : ws[0].layout;
      symbol = std::string("kiln_uk_gather_f32_w") + encodingTag(enc) +
               (layout ? "_" + std::string(format::LayoutName(layout)) : std::string()) + "_gen_" + isa;
      if (!built[symbol])
        buildGather(*kernels, symbol, enc, layout, lanes, op->getLoc());
    } else if (llvm::isa<AttentionOp, QkvAttentionOp>(op)) {
      std::string why;
      if (!generatorSupports(op, info->name, target, &why)) {
        op->emitOpError("cannot generate kernel ") << info->name << ": " << why;
        failed = true;
        return;
      }
      const int64_t heads = op->getAttrOfType<mlir::IntegerAttr>("num_heads").getInt(),
                    kvHeads = op->getAttrOfType<mlir::IntegerAttr>("num_kv_heads").getInt(),
                    hd = op->getAttrOfType<mlir::IntegerAttr>("head_dim").getInt();
      // A fused attention rotates q and k (side by side) itself.
      if (auto qkv = llvm::dyn_cast<QkvAttentionOp>(op); qkv && qkv.getRope()) {
        if (hd % 2 != 0) {
          op->emitOpError("cannot generate a rope kernel for head_dim ") << hd;
          failed = true;
          return;
        }
        extra.push_back(ropeKernel(heads + kvHeads, hd, op->getLoc()));
      }
      // Over the KV cache: the module's cache encoding (kiln-plan-memory), read as
      // stored; a session with another encoding runs a built-in kernel instead.
      uint8_t kvEncoding = format::kEncF32;
      int64_t kvGroup = 0;
      if (op->hasAttr("cache_layer"))
        if (auto kv = op->getParentOfType<mlir::ModuleOp>()->getAttrOfType<KvCacheAttr>("kiln.kv_cache")) {
          kvEncoding = static_cast<uint8_t>(kv.getKind());
          kvGroup = kv.getGroup();
        }
      symbol = std::string("kiln_uk_attention_f32_") + encodingTag(kvEncoding) +
               (kvGroup ? "g" + std::to_string(kvGroup) : std::string()) + "_f32_" + std::to_string(heads) + "x" +
               std::to_string(kvHeads) + "x" + std::to_string(hd) + "_gen_" + isa;
      if (!built[symbol])
        buildAttention(*kernels, symbol, heads, kvHeads, hd, kvEncoding, kvGroup, hasF16Conversion(target), lanes,
                       vectorRegisters(target), op->getLoc());
    } else if (llvm::isa<AddOp, MulOp, ActivationOp>(op)) {
      if (auto act = llvm::dyn_cast<ActivationOp>(op)) {
        symbol = actKernel(act.getKind(), op->getLoc());
      } else {
        const bool add = llvm::isa<AddOp>(op);
        symbol = std::string("kiln_uk_") + (add ? "add" : "mul") + "_f32_f32_f32_gen_" + isa;
        if (!built[symbol])
          buildEltwise(*kernels, symbol, add ? Eltwise::Add : Eltwise::Mul, 0, lanes, op->getLoc());
      }
    } else if (llvm::isa<RmsNormOp, LayerNormOp>(op)) {
      std::string why;
      if (!generatorSupports(op, info->name, target, &why)) {
        op->emitOpError("cannot generate kernel ") << info->name << ": " << why;
        failed = true;
        return;
      }
      symbol = normKernel(*normWeights(op), op->getLoc());
    } else if (isMatmulOp(op)) {
      std::string why;
      if (!generatorSupports(op, info->name, target, &why)) {
        op->emitOpError("cannot generate kernel ") << info->name << ": " << why;
        failed = true;
        return;
      }
      uint32_t floats = 0, ints = 0, panels = 0;
      // Bits (1 << LayoutId) of the packed int8/int4 layouts read with int8 and with
      // float activations.
      uint32_t packedLayouts = 0, a16Layouts = 0;
      for (const MatmulWeight& w : matmulWeights(op)) {
        if (w.bias)
          continue;
        if (w.layout == format::kLayoutInt4P16K8 || w.layout == format::kLayoutInt8P16K4 ||
            w.layout == format::kLayoutInt4P128K4 || w.layout == format::kLayoutInt4P16K16)
          (w.a8 ? packedLayouts : a16Layouts) |= 1u << w.layout;
        else if (w.layout == format::kLayoutPanel16)
          panels |= format::EncodingBit(w.spec.id);
        else
          (w.a8 ? ints : floats) |= format::EncodingBit(w.spec.id);
      }
      // The weight encodings the function reads; with int8 activations beside, an int8
      // or int4 weight multiplied with float activations is marked a16 (W8A16, W4A16).
      std::string tag;
      auto add = [&](const std::string& t) { tag += (tag.empty() ? "" : "_") + t; };
      for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16, format::kEncFP8_E4M3,
                        format::kEncFP8_E5M2, format::kEncINT8, format::kEncINT4}) {
        if (floats & format::EncodingBit(e))
          add(std::string(encodingTag(e)) + (ints && format::IsQuantized(e) ? "a16" : ""));
        if (ints & format::EncodingBit(e))
          add(encodingTag(e));
      }
      for (uint8_t layout : {format::kLayoutInt4P16K8, format::kLayoutInt8P16K4, format::kLayoutInt4P128K4,
                             format::kLayoutInt4P16K16}) {
        if (packedLayouts & (1u << layout))
          add(format::LayoutName(layout));
        if (a16Layouts & (1u << layout))
          add(std::string("a16_") + format::LayoutName(layout));
      }
      for (uint8_t e : {format::kEncF32, format::kEncF16, format::kEncBF16, format::kEncFP8_E4M3,
                        format::kEncFP8_E5M2})
        if (panels & format::EncodingBit(e))
          add(std::string(encodingTag(e)) + "_" + format::LayoutName(format::kLayoutPanel16));
      if (std::optional<NormWeights> n = normWeights(op))
        extra.push_back(normKernel(*n, op->getLoc()));
      if (auto l = llvm::dyn_cast<LinearOp>(op); l && l.getActivation())
        extra.push_back(actKernel(*l.getActivation(), op->getLoc()));
      // A q|k|v epilogue's rotation (kiln-fuse-rope).
      if (auto l = llvm::dyn_cast<LinearOp>(op); l && l.getQkv())
        if (auto rope = l.getQkv()->getAs<mlir::DictionaryAttr>("rope")) {
          const int64_t ropeHeads = rope.getAs<mlir::IntegerAttr>("num_heads").getInt(),
                        hd = rope.getAs<mlir::IntegerAttr>("head_dim").getInt();
          extra.push_back(ropeKernel(ropeHeads, hd, op->getLoc()));
        }
      symbol = std::string("kiln_uk_matmul_bias_f32_") + (ints || packedLayouts ? "qai8dx" : "f32") + "_w" + tag + "_4x4_gen_" + isa;
      if (!built[symbol])
        buildMatmul(*kernels, symbol, floats, ints, packedLayouts, a16Layouts, panels, target, op->getLoc());
    } else {
      op->emitOpError("has no kernel generator for ") << op->getName() << " (kernel " << info->name << ")";
      failed = true;
      return;
    }
    built[symbol] = true;
    op->setAttr(kSymbolAttrName, top.getStringAttr(symbol));
    if (!extra.empty()) {
      llvm::SmallVector<mlir::Attribute> names;
      for (const std::string& e : extra)
        names.push_back(top.getStringAttr(e));
      op->setAttr(kSymbolsAttrName, top.getArrayAttr(names));
    }
  });
  if (failed)
    return nullptr;
  // Fold and share the constants the builders repeat.
  mlir::PassManager pm(ctx);
  pm.addPass(mlir::createCanonicalizerPass());
  pm.addPass(mlir::createCSEPass());
  if (mlir::failed(pm.run(*kernels))) {
    model.emitError("kernel generator: canonicalising the kernels failed");
    return nullptr;
  }
  return kernels;
}

namespace {

// The SME ABI support routines that LLVM calls from the prologue of a streaming
// function with new ZA state (AAPCS64, "SME support routines"), defined local to the
// kernel object: a code segment is mapped too far from the runtime for a BL to reach
// it, the loader resolves nothing outside the segment, and a static kernel library
// must not clash with an app's own copies (compiler-rt's).
//   __arm_tpidr2_save: commits a caller's pending lazy ZA save: with TPIDR2_EL0
//     pointing at a TPIDR2 block {za_save_buffer, u16 num_za_save_slices, 6 reserved
//     bytes that must be 0}, stores that many ZA array vectors to the buffer. Clobbers
//     only x14-x16 (the routine's convention); a block with reserved bytes set traps.
//   __arm_get_current_vg: the current vector granule count (64-bit units) for the
//     prologue's unwind record: the streaming one in streaming mode, else the SVE
//     one when the target has SVE, else 0. Clobbers only x0 and x17.
std::string smeSupportRoutines(const Target& target) {
  const bool sve = target.features & format::kCpuArmSve;
  // Mach-O (Apple): C symbols carry a leading underscore, no .type/.size directives.
  const bool macho = llvm::Triple(target.triple).isOSBinFormatMachO();
  const std::string u = macho ? "_" : "";
  auto begin = [&](const char* name) {
    return ".p2align 2\n" + (macho ? std::string() : std::string(".type ") + name + ",%function\n") + u + name +
           ":\n";
  };
  auto end = [&](const char* name) {
    return macho ? std::string() : std::string(".size ") + name + ", .-" + name + "\n";
  };
  return ".text\n" + begin("__arm_tpidr2_save") + R"(  mrs x16, TPIDR2_EL0
  cbz x16, 2f
  ldrh w14, [x16, #10]
  cbnz w14, 3f
  ldr w14, [x16, #12]
  cbnz w14, 3f
  ldrh w14, [x16, #8]
  ldr x16, [x16]
  cbz x16, 2f
  cbz w14, 2f
  mov w15, wzr
1:
  str za[w15, 0], [x16]
  addsvl x16, x16, #1
  add w15, w15, #1
  cmp w15, w14
  b.ne 1b
2:
  ret
3:
  brk #0x3e9
)" + end("__arm_tpidr2_save") +
         begin("__arm_get_current_vg") + R"(  mrs x17, SVCR
  tbz x17, #0, 1f
  rdsvl x0, #1
  lsr x0, x0, #3
  ret
1:
)" + (sve ? "  cntd x0\n" : "  mov x0, xzr\n") +
         "  ret\n" + end("__arm_get_current_vg");
}

// The kiln_kernel_library_t `name` listing every public function of `module`:
//   { u32 struct_size, u32 count, u64 hash, const char* const* names,
//     void (*const* functions)(void) }  (32 bytes on LP64 targets).
void addLibraryTable(llvm::Module& module, llvm::StringRef name, uint64_t hash) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::Type* i32 = llvm::Type::getInt32Ty(ctx);
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  llvm::PointerType* ptr = llvm::PointerType::get(ctx, 0);
  std::vector<llvm::Constant*> names, functions;
  for (llvm::Function& fn : module) {
    if (fn.isDeclaration() || !fn.hasExternalLinkage())
      continue;
    llvm::Constant* str = llvm::ConstantDataArray::getString(ctx, fn.getName());
    auto* gv = new llvm::GlobalVariable(module, str->getType(), true, llvm::GlobalValue::PrivateLinkage, str,
                                        name + ".name");
    names.push_back(gv);
    functions.push_back(&fn);
  }
  auto array = [&](std::vector<llvm::Constant*>& elems, const char* suffix) {
    auto* type = llvm::ArrayType::get(ptr, elems.size());
    return new llvm::GlobalVariable(module, type, true, llvm::GlobalValue::PrivateLinkage,
                                    llvm::ConstantArray::get(type, elems), name + suffix);
  };
  llvm::GlobalVariable* nameArray = array(names, ".names");
  llvm::GlobalVariable* fnArray = array(functions, ".functions");
  // Only the table is exported: the libraries of several artifacts link into one app.
  for (llvm::Constant* fn : functions)
    llvm::cast<llvm::Function>(fn)->setLinkage(llvm::GlobalValue::InternalLinkage);
  auto* type = llvm::StructType::get(ctx, {i32, i32, i64, ptr, ptr});
  llvm::Constant* init = llvm::ConstantStruct::get(
      type, {llvm::ConstantInt::get(i32, 32), llvm::ConstantInt::get(i32, names.size()),
             llvm::ConstantInt::get(i64, hash), nameArray, fnArray});
  new llvm::GlobalVariable(module, type, true, llvm::GlobalValue::ExternalLinkage, init, name);
}

} // namespace

mlir::LogicalResult compileKernels(mlir::ModuleOp kernels, const Target& target, GeneratedCode* out,
                                   llvm::raw_ostream* llvmIr, llvm::raw_ostream* assembly,
                                   const KernelObjectOptions& packaging) {
  mlir::MLIRContext* ctx = kernels.getContext();
  auto fail = [&](const llvm::Twine& why) {
    return kernels.emitError("kernel generator (") << target.triple << "): " << why.str();
  };
  // MLIR: scf/arith/vector/func on LLVM pointers -> the LLVM dialect.
  mlir::PassManager pm(ctx);
  pm.addPass(mlir::createConvertSCFToCFPass());
  pm.addPass(mlir::createConvertVectorToLLVMPass());
  pm.addPass(mlir::createConvertMathToLLVMPass());
  pm.addPass(mlir::createArithToLLVMConversionPass());
  pm.addPass(mlir::createConvertControlFlowToLLVMPass());
  pm.addPass(mlir::createConvertFuncToLLVMPass());
  pm.addPass(mlir::createReconcileUnrealizedCastsPass());
  if (mlir::failed(pm.run(kernels)))
    return fail("lowering to the LLVM dialect failed");
  // Kernels never unwind: no .eh_frame to relocate at load. SME functions run their
  // body in streaming mode with a new ZA state (LLVM saves a caller's lazy ZA state
  // and switches modes in their prologue and epilogue).
  mlir::OpBuilder b(ctx);
  bool usesSme = false;
  kernels.walk([&](mlir::LLVM::LLVMFuncOp fn) {
    llvm::SmallVector<mlir::Attribute> attrs = {b.getStringAttr("nounwind")};
    if (fn->removeAttr(kSmeZaAttrName)) {
      attrs.push_back(b.getStringAttr("aarch64_pstate_sm_body"));
      attrs.push_back(b.getStringAttr("aarch64_new_za"));
      usesSme = true;
    }
    if (fn->removeAttr(kSmeZt0AttrName))
      attrs.push_back(b.getStringAttr("aarch64_new_zt0"));
    fn->setAttr("passthrough", b.getArrayAttr(attrs));
  });

  // LLVM IR for the target machine.
  initLLVMTargets();
  std::string error;
  const llvm::Target* llvmTarget = llvm::TargetRegistry::lookupTarget(target.triple, error);
  if (!llvmTarget)
    return fail("LLVM has no backend: " + error);
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(llvmTarget->createTargetMachine(
      target.triple, "generic", llvmFeatures(target), options, llvm::Reloc::PIC_, llvm::CodeModel::Small,
      llvm::CodeGenOptLevel::Aggressive));
  if (!tm)
    return fail("cannot create a target machine");
  mlir::registerBuiltinDialectTranslation(*ctx);
  mlir::registerLLVMDialectTranslation(*ctx);
  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> module = mlir::translateModuleToLLVMIR(kernels, llvmContext, "kiln_kernels");
  if (!module)
    return fail("translation to LLVM IR failed");
  module->setTargetTriple(target.triple);
  module->setDataLayout(tm->createDataLayout());
  if (usesSme)
    module->appendModuleInlineAsm(smeSupportRoutines(target));
  if (!packaging.tableSymbol.empty())
    addLibraryTable(*module, packaging.tableSymbol, packaging.hash);
  if (llvm::verifyModule(*module, &llvm::errs()))
    return fail("the generated LLVM IR does not verify");

  // Optimise (loop unrolling, scheduling; the vector code is explicit already).
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    // No library functions exist for the code segment: loops stay loops (no memset
    // or memcpy idioms, no libm calls).
    llvm::TargetLibraryInfoImpl tlii(llvm::Triple(module->getTargetTriple()));
    tlii.disableAllFunctions();
    fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(*module, mam);
  }
  if (llvmIr)
    module->print(*llvmIr, nullptr);
  out->symbols.clear();
  for (const llvm::Function& fn : *module)
    if (!fn.isDeclaration() && fn.hasExternalLinkage())
      out->symbols.push_back(fn.getName().str());

  auto emitFile = [&](llvm::CodeGenFileType type, llvm::SmallVectorImpl<char>& bytes) {
    llvm::raw_svector_ostream os(bytes);
    llvm::legacy::PassManager codegen;
    if (tm->addPassesToEmitFile(codegen, os, nullptr, type))
      return false;
    codegen.run(*module);
    return true;
  };
  if (assembly) {
    llvm::SmallVector<char, 0> text;
    if (!emitFile(llvm::CodeGenFileType::AssemblyFile, text))
      return fail("the target cannot emit assembly");
    assembly->write(text.data(), text.size());
  }
  llvm::SmallVector<char, 0> object;
  if (!emitFile(llvm::CodeGenFileType::ObjectFile, object))
    return fail("the target cannot emit objects");

  // The object must stand alone: the runtime's loader resolves nothing outside it.
  auto parsed = llvm::object::ObjectFile::createObjectFile(
      llvm::MemoryBufferRef(llvm::StringRef(object.data(), object.size()), "kernels"));
  if (!parsed)
    return fail("cannot read back the object: " + llvm::toString(parsed.takeError()));
  for (const llvm::object::SymbolRef& sym : (*parsed)->symbols()) {
    auto flags = sym.getFlags();
    auto name = sym.getName();
    if (!flags || !name)
      return fail("unreadable symbol in the object");
    if ((*flags & llvm::object::SymbolRef::SF_Undefined) && !name->empty())
      return fail("the kernels call '" + *name + "', which is outside the code segment");
  }
  if (!packaging.library && !(*parsed)->isELF())
    return fail("the target does not produce ELF objects");
  for (const llvm::object::SectionRef& sec : (*parsed)->sections()) {
    if (!(*parsed)->isELF())
      break;
    llvm::object::ELFSectionRef elf(sec);
    if (!packaging.library && (elf.getFlags() & llvm::ELF::SHF_ALLOC) && (elf.getFlags() & llvm::ELF::SHF_WRITE)) {
      llvm::Expected<llvm::StringRef> name = sec.getName();
      std::string secName = name ? name->str() : llvm::toString(name.takeError());
      return fail("the kernels have writable data (section " + secName + ")");
    }
  }
  out->object.assign(object.begin(), object.end());
  out->machine = target.arch == TargetArch::X86_64 ? llvm::ELF::EM_X86_64 : llvm::ELF::EM_AARCH64;
  out->cpuFeatures = target.features;
  out->triple = target.triple;
  return mlir::success();
}

} // namespace kiln
